"""Head dim 192 for q and k with 128 for v and out (MLA-style, DeepSeek) on the GPU, forward and
backward, through every family that has the pair, against the fp32 reference with the dense
tests' rule."""

import pytest
import torch

from cuteattn.plan import families
from cuteattn.testing import param_id, skip_unless_family_runs

pytestmark = pytest.mark.gpu

PAIR = (192, 128)
FAMILIES = [family.name for family in families() if PAIR in family.dim_v_pairs]
SEQLENS = ((1, 239), (113, 203), (1000, 1000))


def _inputs(seqlen_q, seqlen_k, dtype, heads):
    dim, dim_v = PAIR
    q = torch.randn(2, seqlen_q, heads[0], dim, device="cuda", dtype=dtype)
    k = torch.randn(2, seqlen_k, heads[1], dim, device="cuda", dtype=dtype)
    v = torch.randn(2, seqlen_k, heads[1], dim_v, device="cuda", dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("heads", ((8, 2), (8, 1)), ids=str)
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_dim_v_forward(family, dtype, causal, seqlen_q, seqlen_k, heads):
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference

    skip_unless_family_runs(family)
    q, k, v = _inputs(seqlen_q, seqlen_k, dtype, heads)
    out = torch.full((*q.shape[:3], v.shape[3]), float("nan"), device="cuda", dtype=dtype)
    got, lse = api.forward(q, k, v, causal=causal, out=out, family=family)
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, causal=causal)
    out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)


@pytest.mark.parametrize("deterministic", (False, True))
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS[1:])
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_dim_v_backward(family, dtype, causal, seqlen_q, seqlen_k, deterministic):
    from cuteattn import api
    from cuteattn.testing import assert_grads_close, poison_like

    skip_unless_family_runs(family)
    q, k, v = _inputs(seqlen_q, seqlen_k, dtype, (8, 2))
    out, lse = api.forward(q, k, v, causal=causal, family=family)
    dout = torch.randn_like(out)
    grads = tuple(poison_like(x) for x in (q, k, v))
    got = api.backward(
        dout, q, k, v, out, lse, causal=causal, family=family, deterministic=deterministic,
        dq=grads[0], dk=grads[1], dv=grads[2],
    )
    torch.cuda.synchronize()
    assert_grads_close(got, q, k, v, dout, causal=causal)


def test_dim_v_through_autograd_and_varlen():
    """flash_attn_func trains with the pair (the planner's family), and a packed batch too."""
    import cuteattn
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, assert_grads_close

    q, k, v = _inputs(300, 400, torch.bfloat16, (8, 2))
    dout = torch.randn(*q.shape[:3], v.shape[3], device="cuda", dtype=torch.bfloat16)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    cuteattn.flash_attn_func(*leaves, causal=True).backward(dout)
    assert_grads_close([leaf.grad for leaf in leaves], q, k, v, dout, causal=True)

    cu_q = torch.tensor((0, 100, 101, 101, 301), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor((0, 150, 180, 187, 400), dtype=torch.int32, device="cuda")
    packed = [x.flatten(0, 1)[: cu[-1]] for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k))]
    packed_dout = dout.flatten(0, 1)[: cu_q[-1]]
    leaves = [x.detach().requires_grad_() for x in packed]
    out = cuteattn.flash_attn_varlen_func(*leaves, cu_q, cu_k, 200, 213, causal=True)
    options = dict(causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out_ref, _ = attention(*packed, **options)
    out_pt, _ = attention(*packed, upcast=False, **options)
    assert_close_to_reference("out", out.detach(), out_ref, out_pt)
    out.backward(packed_dout)
    assert_grads_close([leaf.grad for leaf in leaves], *packed, packed_dout, **options)
