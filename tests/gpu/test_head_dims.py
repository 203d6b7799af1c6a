"""Head dims between the compiled kernels' (multiples of 8 from 8 to 248): the sm90 family
pads them inside the kernel, forward and backward (TMA fills the missing columns with zeros
and clips the stores; the inputs are never copied), against the fp32 reference with the dense
tests' rule."""

import pytest
import torch

from cuteattn.testing import param_id

pytestmark = pytest.mark.gpu

DIMS = (8, 16, 40, 80, 160, 248)


@pytest.mark.parametrize("seqlen_q,seqlen_k", ((1, 239), (113, 203), (1000, 1000), (16, 4096)))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("head_dim", DIMS)
def test_padded_head_dim_forward(head_dim, dtype, causal, seqlen_q, seqlen_k):
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.runtime.arch import device_arch
    from cuteattn.testing import assert_close_to_reference, poison_like

    if not device_arch(torch.device("cuda")).wgmma:
        pytest.skip("the sm90 family pads head dims; this GPU has no WGMMA")
    # (16, 4096) with 8 query heads per KV head is packed GQA.
    heads_q, heads_kv = (8, 1) if seqlen_q == 16 else (8, 2)
    q = torch.randn(2, seqlen_q, heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    out = poison_like(q)
    got, lse = api.forward(q, k, v, causal=causal, out=out)
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, causal=causal)
    out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)


@pytest.mark.parametrize("deterministic", (False, True))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("head_dim", DIMS)
def test_padded_head_dim_backward(head_dim, dtype, causal, deterministic):
    """dq, dk, dv through autograd against the reference's (the sm90 backward pads too)."""
    import cuteattn
    from cuteattn.runtime.arch import device_arch
    from cuteattn.testing import assert_grads_close

    if not device_arch(torch.device("cuda")).wgmma:
        pytest.skip("the sm90 family pads head dims; this GPU has no WGMMA")
    q = torch.randn(2, 333, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, 517, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    cuteattn.flash_attn_func(*leaves, causal=causal, deterministic=deterministic).backward(dout)
    torch.cuda.synchronize()
    assert_grads_close([leaf.grad for leaf in leaves], q, k, v, dout, causal=causal)
