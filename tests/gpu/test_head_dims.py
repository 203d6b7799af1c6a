"""Head dims between the compiled kernels' (multiples of 8 from 8 to 248): every family pads
them inside the kernel, forward and backward (sm90: TMA fills the missing columns with zeros and
clips the stores; sm80: the copies skip those chunks, which hold zeros in shared memory); the
inputs are never copied. Against the fp32 reference with the dense tests' rule."""

import pytest
import torch

from cuteattn.plan import families
from cuteattn.testing import param_id, skip_unless_family_runs

pytestmark = pytest.mark.gpu

DIMS = (8, 16, 40, 80, 160, 248)
FAMILIES = [family.name for family in families()]
BACKWARD_FAMILIES = [family.name for family in families() if family.has_backward]


@pytest.mark.parametrize("seqlen_q,seqlen_k", ((1, 239), (113, 203), (1000, 1000), (16, 4096)))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("head_dim", DIMS)
@pytest.mark.parametrize("family", FAMILIES)
def test_padded_head_dim_forward(family, head_dim, dtype, causal, seqlen_q, seqlen_k):
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    skip_unless_family_runs(family)
    # (16, 4096) with 8 query heads per KV head is packed GQA.
    heads_q, heads_kv = (8, 1) if seqlen_q == 16 else (8, 2)
    q = torch.randn(2, seqlen_q, heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    out = poison_like(q)
    got, lse = api.forward(q, k, v, causal=causal, out=out, family=family)
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, causal=causal)
    out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)


@pytest.mark.parametrize("deterministic", (False, True))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("head_dim", DIMS)
@pytest.mark.parametrize("family", BACKWARD_FAMILIES)
def test_padded_head_dim_backward(family, head_dim, dtype, causal, deterministic):
    """dq, dk, dv of the family's forward and backward against the reference's."""
    from cuteattn import api
    from cuteattn.testing import assert_grads_close, poison_like

    skip_unless_family_runs(family)
    q = torch.randn(2, 333, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, 517, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    out, lse = api.forward(q, k, v, causal=causal, family=family)
    grads = tuple(poison_like(x) for x in (q, k, v))
    got = api.backward(
        dout, q, k, v, out, lse, causal=causal, family=family, deterministic=deterministic,
        dq=grads[0], dk=grads[1], dv=grads[2],
    )
    torch.cuda.synchronize()
    assert_grads_close(got, q, k, v, dout, causal=causal)


def test_padded_head_dim_through_autograd_and_varlen():
    """flash_attn_func trains at a padded dim (the planner's family), and a packed batch (the
    sm80 family) pads the same way."""
    import cuteattn
    from cuteattn.testing import assert_close_to_reference, assert_grads_close
    from cuteattn.reference import attention

    q = torch.randn(2, 300, 8, 40, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 400, 2, 40, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    cuteattn.flash_attn_func(*leaves, causal=True).backward(dout)
    assert_grads_close([leaf.grad for leaf in leaves], q, k, v, dout, causal=True)

    lengths_q, lengths_k = (100, 1, 0, 200), (150, 30, 7, 213)
    cu_q = torch.tensor((0, 100, 101, 101, 301), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor((0, 150, 180, 187, 400), dtype=torch.int32, device="cuda")
    packed = [x.flatten(0, 1)[: cu[-1]] for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k))]
    packed_dout = dout.flatten(0, 1)[: cu_q[-1]]
    leaves = [x.detach().requires_grad_() for x in packed]
    out = cuteattn.flash_attn_varlen_func(
        *leaves, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True
    )
    options = dict(causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out_ref, _ = attention(*packed, **options)
    out_pt, _ = attention(*packed, upcast=False, **options)
    assert_close_to_reference("out", out.detach(), out_ref, out_pt)
    out.backward(packed_dout)
    assert_grads_close([leaf.grad for leaf in leaves], *packed, packed_dout, **options)
