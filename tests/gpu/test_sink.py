"""Learnable sink (one extra softmax logit per query head, gpt-oss / FlashAttention-4) on the
GPU: forward through every family (packed GQA included), the backward's dq, dk, dv and dsink,
and autograd, against the fp32 reference with the same error rule as the dense tests."""

import pytest
import torch

from cuteattn.plan import families
from cuteattn.testing import param_id, skip_unless_family_runs

pytestmark = pytest.mark.gpu

FAMILIES = [family.name for family in families()]
BACKWARD_FAMILIES = [family.name for family in families() if family.has_backward]
DTYPES = (torch.bfloat16, torch.float16)
# (seqlen_q, seqlen_k): (239, 1) causal leaves rows that see no key (out 0, lse = sink); (16,
# 4096) with 8 query heads per KV head is packed GQA on sm90.
SEQLENS = ((113, 203), (1000, 1000), (239, 1), (16, 4096))
HEADS = ((8, 2), (8, 8), (8, 1))


def _inputs(seqlen_q, seqlen_k, head_dim, dtype, heads):
    heads_q, heads_kv = heads
    q = torch.randn(2, seqlen_q, heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    # Sinks around the scores' scale and above it (one head's sink dominates its rows).
    sink = torch.randn(heads_q, device="cuda") * 2.0
    sink[0] = 6.0
    return q, k, v, sink


@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", DTYPES, ids=param_id)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("family", FAMILIES)
def test_sink_forward(family, head_dim, dtype, causal, seqlen_q, seqlen_k, heads):
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    skip_unless_family_runs(family)
    q, k, v, sink = _inputs(seqlen_q, seqlen_k, head_dim, dtype, heads)
    out = poison_like(q)
    got, lse = api.forward(q, k, v, causal=causal, learnable_sink=sink, out=out, family=family)
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, causal=causal, learnable_sink=sink)
    out_pt, lse_pt = attention(q, k, v, causal=causal, learnable_sink=sink, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)
    assert torch.isfinite(lse).all()  # a row without keys has lse = its head's sink


@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS[:3])
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", DTYPES, ids=param_id)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("family", BACKWARD_FAMILIES)
def test_sink_backward(family, head_dim, dtype, causal, seqlen_q, seqlen_k, heads):
    from cuteattn import api
    from cuteattn.testing import assert_grads_close, poison_like

    skip_unless_family_runs(family)
    q, k, v, sink = _inputs(seqlen_q, seqlen_k, head_dim, dtype, heads)
    dout = torch.randn_like(q)
    out, lse = api.forward(q, k, v, causal=causal, learnable_sink=sink, family=family)
    buffers = tuple(poison_like(x) for x in (q, k, v))
    got = api.backward(dout, q, k, v, out, lse, causal=causal, learnable_sink=sink,
                       family=family, dq=buffers[0], dk=buffers[1], dv=buffers[2])
    torch.cuda.synchronize()
    assert_grads_close(got, q, k, v, dout, out=out, lse=lse, causal=causal, learnable_sink=sink)


def test_sink_through_autograd_and_compile():
    """The sink trains: autograd gives dsink next to dq, dk, dv (equal to the direct backward),
    and torch.compile(fullgraph=True) traces the call."""
    import cuteattn
    from cuteattn import api

    q, k, v, sink = _inputs(512, 512, 128, torch.bfloat16, (8, 2))
    dout = torch.randn_like(q)
    leaves = [x.detach().requires_grad_() for x in (q, k, v, sink)]
    out = cuteattn.flash_attn_func(*leaves[:3], causal=True, learnable_sink=leaves[3])
    out.backward(dout)
    fwd_out, lse = api.forward(q, k, v, causal=True, learnable_sink=sink)
    assert torch.equal(out, fwd_out)
    direct = api.backward(dout, q, k, v, fwd_out, lse, causal=True, learnable_sink=sink)
    torch.testing.assert_close(leaves[3].grad, direct[3])
    compiled = torch.compile(
        lambda q, k, v, s: cuteattn.flash_attn_func(q, k, v, causal=True, learnable_sink=s),
        fullgraph=True,
    )
    assert torch.equal(compiled(q, k, v, sink), fwd_out)
