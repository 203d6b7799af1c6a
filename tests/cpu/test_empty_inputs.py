"""Empty inputs (flash-attn's behaviour): batch 0 or seqlen_q 0 give empty outputs; seqlen_k 0
gives out = 0, lse = -inf and zero gradients; none launches a kernel. The no-kernel results are
plain torch and run here on CPU tensors; tests/gpu/test_empty_inputs_gpu.py runs the public API."""

import pytest
import torch

from cuteattn import ops
from cuteattn.reference import attention as reference


def qkv(batch, seqlen_q, seqlen_k, heads_q=4, heads_kv=2, dim=64, dim_v=64):
    q = torch.randn(batch, seqlen_q, heads_q, dim)
    k = torch.randn(batch, seqlen_k, heads_kv, dim)
    v = torch.randn(batch, seqlen_k, heads_kv, dim_v)
    return q, k, v


@pytest.mark.parametrize(
    "batch,seqlen_q,seqlen_k,empty",
    [(2, 16, 24, False), (0, 16, 24, True), (2, 0, 24, True), (2, 16, 0, True), (0, 0, 0, True)],
)
def test_has_no_work(batch, seqlen_q, seqlen_k, empty):
    q, k, _ = qkv(batch, seqlen_q, seqlen_k)
    assert ops.has_no_work(q, k) is empty


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k", [(0, 16, 24), (2, 0, 24), (2, 16, 0)])
def test_forward_without_kernel_matches_the_reference(batch, seqlen_q, seqlen_k):
    q, k, v = qkv(batch, seqlen_q, seqlen_k, dim_v=32)
    out = torch.full(ops.out_shape(q, v), float("nan"))  # poisoned
    lse = ops.forward_without_kernel(q, out)
    ref_out, ref_lse = reference(q, k, v)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert lse.dtype == torch.float32
    torch.testing.assert_close(out, ref_out)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k", [(0, 16, 24), (2, 0, 24), (2, 16, 0)])
def test_backward_without_kernel_is_zero(batch, seqlen_q, seqlen_k):
    q, k, v = qkv(batch, seqlen_q, seqlen_k)
    dq, dk, dv = ops.backward_without_kernel(q, k, v)
    for grad, x in ((dq, q), (dk, k), (dv, v)):
        assert grad.shape == x.shape and grad.dtype == x.dtype
        assert torch.count_nonzero(grad) == 0
    # The reference's autograd agrees (the gradient of an empty softmax is zero).
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _ = reference(*leaves)
    if out.requires_grad:  # else out does not depend on the inputs at all
        out.sum().backward()
    for leaf in leaves:
        assert leaf.grad is None or torch.count_nonzero(leaf.grad) == 0


def test_backward_without_kernel_fills_given_buffers():
    q, k, v = qkv(2, 16, 0)
    buffers = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    grads = ops.backward_without_kernel(q, k, v, dq=buffers[0], dk=buffers[1], dv=buffers[2])
    for grad, buffer in zip(grads, buffers):
        assert grad is buffer and torch.count_nonzero(buffer) == 0


def test_forward_without_kernel_with_a_sink():
    """No key, a learnable sink: out = 0 and lse = the sink (the only term of the denominator)."""
    q, k, v = qkv(2, 16, 0)
    sink = torch.randn(4)
    out = torch.full(ops.out_shape(q, v), float("nan"))
    lse = ops.forward_without_kernel(q, out, sink)
    ref_out, ref_lse = reference(q, k, v, learnable_sink=sink)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
