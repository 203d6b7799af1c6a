"""Local windows (window_size=(left, right), causal or not) on the GPU: forward and backward
through every family against the fp32 reference with the same error rule as the dense tests,
and the deterministic backward. Key tiles wholly outside a window are skipped, so a wrong tile
range shows as a wrong result."""

import pytest
import torch

from cuteattn.plan import families
from cuteattn.testing import param_id, skip_unless_family_runs

pytestmark = pytest.mark.gpu

FAMILIES = [family.name for family in families()]
WINDOWS = ((0, 0), (5, 17), (256, 0), (1000, -1), (-1, 64))
SEQLENS = ((113, 203), (203, 113), (1000, 1000), (1023, 4097), (16, 4096))
# (head_dim, dtype): every head dim in bf16, one in fp16.
DIM_DTYPES = ((64, torch.bfloat16), (128, torch.bfloat16), (256, torch.bfloat16),
              (128, torch.float16))


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("head_dim,dtype", DIM_DTYPES, ids=param_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_window_forward(family, head_dim, dtype, window, causal, seqlen_q, seqlen_k):
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    skip_unless_family_runs(family)
    # (16, 4096) with 8 query heads per KV head is packed GQA on sm90.
    heads_q, heads_kv = (8, 1) if seqlen_q == 16 else (8, 2)
    q = torch.randn(2, seqlen_q, heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    out = poison_like(q)
    got, lse = api.forward(
        q, k, v, causal=causal, window_size=window, out=out, family=family
    )
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, causal=causal, window_size=window)
    out_pt, lse_pt = attention(q, k, v, causal=causal, window_size=window, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)
    empty_rows = torch.isinf(lse_ref)
    if empty_rows.any():
        assert torch.all(lse[empty_rows] == float("-inf"))
        assert torch.all(got.permute(0, 2, 1, 3)[empty_rows] == 0)


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS[:4])
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("head_dim,dtype", DIM_DTYPES, ids=param_id)
@pytest.mark.parametrize("family", [family.name for family in families() if family.has_backward])
def test_window_backward(family, head_dim, dtype, window, causal, seqlen_q, seqlen_k):
    from cuteattn import api
    from cuteattn.testing import assert_close_to_reference, poison_like, reference_grads

    skip_unless_family_runs(family)
    q = torch.randn(2, seqlen_q, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, seqlen_k, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    out, lse = api.forward(q, k, v, causal=causal, window_size=window, family=family)
    buffers = tuple(poison_like(x) for x in (q, k, v))
    got = api.backward(dout, q, k, v, out, lse, causal=causal, window_size=window,
                       family=family, dq=buffers[0], dk=buffers[1], dv=buffers[2])
    torch.cuda.synchronize()
    want = reference_grads(q, k, v, dout, causal=causal, window_size=window)
    low = reference_grads(q, k, v, dout, causal=causal, window_size=window, upcast=False)
    for name, g, ref, pt in zip(("dq", "dk", "dv"), got, want, low):
        assert_close_to_reference(name, g, ref, pt)


@pytest.mark.parametrize("window", ((256, 0), (5, 17), (1000, -1), (-1, 64)), ids=str)
@pytest.mark.parametrize("family", [family.name for family in families() if family.has_backward])
def test_window_deterministic_backward(family, window):
    """The key tiles of a windowed query tile take their turns from the last one down: three
    runs bitwise equal (more CTAs than SMs), and autograd equal to them."""
    from cuteattn import api

    q = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    out, lse = api.forward(q, k, v, window_size=window, family=family)
    runs = [
        api.backward(dout, q, k, v, out, lse, window_size=window, deterministic=True,
                     family=family)
        for _ in range(3)
    ]
    torch.cuda.synchronize()
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0]))
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    api.forward(*leaves, window_size=window, deterministic=True, family=family)[0].backward(dout)
    assert all(torch.equal(x.grad, g) for x, g in zip(leaves, runs[0]))
