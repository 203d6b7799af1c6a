"""Empty inputs through the public API, as in flash-attn: batch 0 or seqlen_q 0 give empty
outputs, seqlen_k 0 gives out = 0 and lse = -inf; gradients are zero; nothing is launched (so
every family and the forced sm80 one behave alike). Outputs and gradients are poisoned first."""

import pytest
import torch

import cuteattn
from cuteattn import api
from cuteattn.reference import attention as reference

pytestmark = pytest.mark.gpu

SHAPES = [(0, 16, 24), (2, 0, 24), (2, 16, 0), (0, 0, 0)]


def _qkv(batch, seqlen_q, seqlen_k, requires_grad=False):
    def make(seqlen, heads):
        x = torch.randn(batch, seqlen, heads, 64, device="cuda", dtype=torch.bfloat16)
        return x.requires_grad_(requires_grad)

    return make(seqlen_q, 8), make(seqlen_k, 2), make(seqlen_k, 2)


@pytest.mark.parametrize("family", [None, "sm80"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_of_empty_inputs(shape, causal, family):
    q, k, v = _qkv(*shape)
    out = torch.full_like(q, float("nan"))
    result, lse = api.forward(q, k, v, causal=causal, out=out, family=family)
    ref_out, ref_lse = reference(q, k, v, causal=causal)
    assert result is out and lse.shape == ref_lse.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref_out)
    assert torch.isneginf(lse).all()
    out2, lse2 = cuteattn.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    torch.testing.assert_close(out2.float(), ref_out)
    assert torch.isneginf(lse2).all()


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradients_of_empty_inputs_are_zero(shape, deterministic):
    q, k, v = _qkv(*shape, requires_grad=True)
    out = cuteattn.flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
    out.backward(torch.randn_like(out))
    for x in (q, k, v):
        assert x.grad is not None and x.grad.shape == x.shape
        assert torch.count_nonzero(x.grad) == 0
    # Direct call into poisoned buffers.
    dout = torch.randn_like(out)
    lse = torch.full((shape[0], 8, shape[1]), float("-inf"), device="cuda")
    buffers = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    grads = api.backward(
        dout, q.detach(), k.detach(), v.detach(), out.detach(), lse,
        dq=buffers[0], dk=buffers[1], dv=buffers[2],
    )
    for grad, buffer in zip(grads, buffers):
        assert grad is buffer and torch.count_nonzero(buffer) == 0


def test_compiled_forward_of_empty_keys():
    q, k, v = _qkv(2, 16, 0)
    compiled = torch.compile(lambda q, k, v: cuteattn.flash_attn_func(q, k, v), fullgraph=True)
    out = compiled(q, k, v)
    assert out.shape == q.shape and torch.count_nonzero(out) == 0
