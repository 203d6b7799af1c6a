"""Soft-capping (softcap > 0: scores -> softcap * tanh(scores / softcap), Gemma 2) on the GPU,
forward and backward, through every family, against the fp32 reference with the same error
rule as the dense tests. Queries are scaled up so that many scores reach the cap's bend."""

import pytest
import torch

from cuteattn.plan import families
from cuteattn.testing import param_id, skip_unless_family_runs

pytestmark = pytest.mark.gpu

FAMILIES = [family.name for family in families()]
BACKWARD_FAMILIES = [family.name for family in families() if family.has_backward]
DTYPES = (torch.bfloat16, torch.float16)
SEQLENS = ((113, 203), (1000, 1000), (239, 1))
# Scores of about +-4 * sqrt(dim) * softmax_scale = +-4 before the cap at 30 or 50 would barely
# bend; x8 brings them to the cap's scale.
Q_SCALE = 8.0


def _inputs(seqlen_q, seqlen_k, head_dim, dtype, heads=(8, 2)):
    heads_q, heads_kv = heads
    q = torch.randn(2, seqlen_q, heads_q, head_dim, device="cuda", dtype=dtype) * Q_SCALE
    k = torch.randn(2, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    return q, k, v


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("softcap", (30.0, 50.0))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", DTYPES, ids=param_id)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("family", FAMILIES)
def test_softcap_forward(family, head_dim, dtype, causal, softcap, seqlen_q, seqlen_k):
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    skip_unless_family_runs(family)
    q, k, v = _inputs(seqlen_q, seqlen_k, head_dim, dtype)
    out = poison_like(q)
    got, lse = api.forward(q, k, v, causal=causal, softcap=softcap, out=out, family=family)
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, causal=causal, softcap=softcap)
    out_pt, lse_pt = attention(q, k, v, causal=causal, softcap=softcap, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)
    # The cap matters for these inputs: without it the result is far off (the lse: with one key
    # the output is that key's value whatever the score, but the lse is the capped score).
    _, lse_plain = attention(q, k, v, causal=causal)
    seen = torch.isfinite(lse_ref)
    assert seen.any()
    cap_effect = (lse_plain - lse_ref)[seen].abs().max()
    assert cap_effect > 10 * (lse.float() - lse_ref)[seen].abs().max()


# With one key every probability is exactly 1 and dS = P * (dP - rowsum(dout * out)) is exactly
# 0: the kernel's dq and dk are then float32 cancellation noise (two dot products summed in
# different orders, times the x8 queries), which no low-precision PyTorch gradient has (its
# softmax backward gives exact zeros). Three keys keep the short-key edge with gradients.
BACKWARD_SEQLENS = ((113, 203), (1000, 1000), (239, 3))


@pytest.mark.parametrize("seqlen_q,seqlen_k", BACKWARD_SEQLENS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", DTYPES, ids=param_id)
@pytest.mark.parametrize("head_dim", (64, 96, 128, 192, 256))
@pytest.mark.parametrize("family", BACKWARD_FAMILIES)
def test_softcap_backward(family, head_dim, dtype, causal, seqlen_q, seqlen_k):
    from cuteattn import api
    from cuteattn.testing import assert_grads_close, poison_like

    skip_unless_family_runs(family)
    softcap = 30.0
    q, k, v = _inputs(seqlen_q, seqlen_k, head_dim, dtype)
    dout = torch.randn_like(q)
    out, lse = api.forward(q, k, v, causal=causal, softcap=softcap, family=family)
    grads = tuple(poison_like(x) for x in (q, k, v))
    got = api.backward(dout, q, k, v, out, lse, causal=causal, softcap=softcap, family=family,
                       dq=grads[0], dk=grads[1], dv=grads[2])
    torch.cuda.synchronize()
    assert_grads_close(got, q, k, v, dout, causal=causal, softcap=softcap)


@pytest.mark.parametrize("deterministic", (False, True))
def test_softcap_through_autograd_and_compile(deterministic):
    """flash_attn_func(softcap=) trains: autograd equals the direct backward bitwise (same
    kernels), and torch.compile(fullgraph=True) traces the capped call."""
    import cuteattn
    from cuteattn import api

    q, k, v = _inputs(512, 512, 128, torch.bfloat16)
    dout = torch.randn_like(q)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = cuteattn.flash_attn_func(
        *leaves, causal=True, softcap=50.0, deterministic=deterministic
    )
    out.backward(dout)
    fwd_out, lse = api.forward(q, k, v, causal=True, softcap=50.0)
    assert torch.equal(out, fwd_out)
    direct = api.backward(dout, q, k, v, fwd_out, lse, causal=True, softcap=50.0,
                          deterministic=deterministic)
    if deterministic:
        assert all(torch.equal(x.grad, g) for x, g in zip(leaves, direct))
    compiled = torch.compile(
        lambda q, k, v: cuteattn.flash_attn_func(q, k, v, causal=True, softcap=50.0),
        fullgraph=True,
    )
    assert torch.equal(compiled(q, k, v), fwd_out)
