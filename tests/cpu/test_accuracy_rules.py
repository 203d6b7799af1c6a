"""The GPU tests' accuracy rules (cuteattn.testing) on the CPU: the FlashAttention-form
low-precision gradients, dsink's row sum, and the rules passing or failing where they should."""

import pytest
import torch

from cuteattn.reference import attention
from cuteattn.testing import (
    assert_close_to_reference,
    assert_grads_close,
    dsink_from_rows,
    half_ulp,
    reference_grads,
)


def _inputs(seqlen_q=37, seqlen_k=53, heads=(4, 2), dim=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seqlen_q, heads[0], dim, generator=generator).to(torch.bfloat16)
    k = torch.randn(2, seqlen_k, heads[1], dim, generator=generator).to(torch.bfloat16)
    v = torch.randn(2, seqlen_k, heads[1], dim, generator=generator).to(torch.bfloat16)
    dout = torch.randn(2, seqlen_q, heads[0], dim, generator=generator).to(torch.bfloat16)
    sink = torch.randn(heads[0], generator=generator)
    return q, k, v, dout, sink


def _flash_form_grads(q, k, v, dout, sink):
    """The FlashAttention backward written out (float64 throughout but for the rounded output
    that its row sum reads): dS = P * (dP - rowsum(dout * out_low))."""
    heads_q, heads_kv, dim = q.shape[2], k.shape[2], q.shape[3]
    group = heads_q // heads_kv
    q64, k64, v64, do64 = (x.double() for x in (q, k, v, dout))
    k64, v64 = (x.repeat_interleave(group, 2) for x in (k64, v64))
    scale = dim**-0.5
    scores = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * scale
    sink_logit = sink.double().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    lse = torch.logsumexp(torch.cat([scores, sink_logit], -1), -1, keepdim=True)
    probs = torch.exp(scores - lse)
    out_low, _ = attention(q, k, v, learnable_sink=sink, upcast=False)
    rowsum = (do64 * out_low.double()).sum(-1).transpose(1, 2).unsqueeze(-1)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", do64, v64)
    dscores = probs * (dprobs - rowsum)
    dq = torch.einsum("bhqk,bkhd->bqhd", dscores, k64) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", dscores, q64) * scale
    dk = dk.unflatten(2, (heads_kv, group)).sum(3)
    dsink = -(torch.exp(sink.double().view(1, -1, 1) - lse.squeeze(-1)) * rowsum.squeeze(-1))
    return dq, dk, dsink.sum((0, 2))


def test_flash_rowsum_gradients_use_the_rounded_outputs_row_sum():
    q, k, v, dout, sink = _inputs()
    dq, dk, _, dsink = reference_grads(
        q, k, v, dout, learnable_sink=sink, upcast=False, flash_rowsum=True
    )
    plain = reference_grads(q, k, v, dout, learnable_sink=sink, upcast=False)
    want_dq, want_dk, want_dsink = _flash_form_grads(q, k, v, dout, sink)
    # The lse cotangent swaps autograd's row sum for the rounded output's up to autograd's own
    # rounding of dP (the exact row sum stands in for it), and the low-precision scores and P
    # stay: each form sits near the written-out one, as near as plain autograd's.
    for got, other, want in (
        (dq, plain[0], want_dq), (dk, plain[1], want_dk), (dsink, plain[3], want_dsink)
    ):
        near = (got.double() - want).abs().max()
        assert near <= 2 * (other.double() - want).abs().max() + 1e-2


def test_dsink_from_rows_dense_and_packed_agree():
    q, k, v, dout, sink = _inputs()
    out, lse = attention(q, k, v, learnable_sink=sink)
    dense = dsink_from_rows(sink, lse, out, dout)
    packed = dsink_from_rows(
        sink, lse.transpose(0, 1).flatten(1), out.flatten(0, 1), dout.flatten(0, 1)
    )
    torch.testing.assert_close(dense, packed)
    # It is the gradient autograd gives the sink.
    want = reference_grads(q, k, v, dout, learnable_sink=sink)[3]
    torch.testing.assert_close(dense.float(), want, rtol=1e-4, atol=1e-4)


def test_half_ulp():
    assert half_ulp(0.0, torch.bfloat16) == 0.0
    assert half_ulp(1.0, torch.bfloat16) == 2.0**-8
    assert half_ulp(0.75, torch.float16) == 2.0**-12


def test_grads_rule_passes_the_flash_form_and_fails_a_wrong_gradient():
    q, k, v, dout, sink = _inputs()
    out, lse = attention(q, k, v, learnable_sink=sink, upcast=False)
    grads = list(
        reference_grads(q, k, v, dout, learnable_sink=sink, upcast=False, flash_rowsum=True)
    )
    grads[3] = dsink_from_rows(sink, lse, out, dout).float()
    assert_grads_close(grads, q, k, v, dout, out=out, lse=lse, learnable_sink=sink)
    wrong = list(grads)
    wrong[1] = grads[1] * 1.05
    with pytest.raises(AssertionError, match="dk"):
        assert_grads_close(wrong, q, k, v, dout, out=out, lse=lse, learnable_sink=sink)
    wrong = list(grads)
    wrong[3] = grads[3] + 0.01
    with pytest.raises(AssertionError, match="dsink"):
        assert_grads_close(wrong, q, k, v, dout, out=out, lse=lse, learnable_sink=sink)


def test_rule_takes_the_largest_low_precision_error():
    ref = torch.zeros(4)
    got = torch.full((4,), 3e-3)
    with pytest.raises(AssertionError):
        assert_close_to_reference("x", got, ref, torch.full((4,), 1e-3))
    assert_close_to_reference("x", got, ref, (torch.full((4,), 1e-3), torch.full((4,), 2e-3)))


def test_flash_rowsum_follows_the_cancellation_autograd_does_not_have():
    """One key per query row: P is near 1 and dP - rowsum cancels, where the rounded output's row
    sum is what FlashAttention's gradient carries: the flash form is the nearer one."""
    q, k, v, dout, sink = _inputs(seqlen_q=239, seqlen_k=1)
    flash = reference_grads(q, k, v, dout, learnable_sink=sink, upcast=False, flash_rowsum=True)
    plain = reference_grads(q, k, v, dout, learnable_sink=sink, upcast=False)
    _, want_dk, _ = _flash_form_grads(q, k, v, dout, sink)
    assert (flash[1].double() - want_dk).abs().max() < (plain[1].double() - want_dk).abs().max()
