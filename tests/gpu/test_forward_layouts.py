"""Forward with strided / packed inputs, uncommon GQA ratios and 64-bit offsets, on the GPU."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _check(got, lse, q, k, v, causal):
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference

    out_ref, lse_ref = attention(q, k, v, causal=causal)
    out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)


@pytest.mark.parametrize("causal", (False, True))
def test_packed_qkv_views_are_read_in_place(causal):
    """q, k, v as slices of one packed (batch, seqlen, 3, heads, dim) tensor; out strided too."""
    import cuteattn
    from cuteattn import validate

    qkv = torch.randn(2, 333, 3, 6, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    assert all(validate.kernel_addressable(x) for x in (q, k, v)) and not q.is_contiguous()
    out_storage = torch.full((2, 333, 6, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = out_storage[..., 64:192]
    got, lse = cuteattn.flash_attn_func(q, k, v, causal=causal, out=out, return_lse=True)
    assert got.data_ptr() == out.data_ptr()
    assert torch.isnan(out_storage[..., :64]).all() and torch.isnan(out_storage[..., 192:]).all()
    _check(got, lse, q, k, v, causal)


def test_unaddressable_inputs_are_copied():
    """Strides the kernel cannot address (head-dim stride 2, head stride 68) are copied."""
    import cuteattn
    from cuteattn import validate

    wide = torch.randn(3, 200, 4, 128, device="cuda", dtype=torch.float16)
    q = wide[..., ::2]  # dim 64, last-dim stride 2
    k = torch.randn(3, 150, 2, 68, device="cuda", dtype=torch.float16)[..., :64]  # stride 68
    v = torch.randn(3, 4 * 150 * 2 * 64 + 8, device="cuda", dtype=torch.float16)[:, 8:]
    v = v.view(3, 4, 150, 2, 64)[:, 1]  # addressable in place: batch stride not compact
    assert not validate.kernel_addressable(q) and not validate.kernel_addressable(k)
    assert validate.kernel_addressable(v)
    got, lse = cuteattn.flash_attn_func(q, k, v, return_lse=True)
    _check(got, lse, q, k, v, False)


@pytest.mark.parametrize("heads_q,heads_kv", ((6, 2), (12, 4), (5, 1)))
def test_gqa_ratios(heads_q, heads_kv):
    import cuteattn

    q = torch.randn(2, 257, heads_q, 96, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 300, heads_kv, 96, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    got, lse = cuteattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    _check(got, lse, q, k, v, True)


def test_offsets_past_2_pow_31_elements():
    """k, v and out are views whose batch 1 starts past element 2^31: 32-bit offsets would wrap.

    Only 300 keys are used per batch, so the check stays about addressing, not about fp32
    accumulation over millions of keys.
    """
    import cuteattn
    from cuteattn import validate

    rows = 2**24 + 64  # (2^24 + 64) * 128 elements per batch > 2^31

    def big_view(seqlen):
        storage = torch.empty(2, rows, 1, 128, device="cuda", dtype=torch.bfloat16)
        return storage[:, :seqlen]

    k, v = big_view(300), big_view(300)
    k.normal_()
    v.normal_()
    out = big_view(77).fill_(float("nan"))
    assert k.stride(0) > 2**31 and validate.kernel_addressable(k)
    q = torch.randn(2, 77, 1, 128, device="cuda", dtype=torch.bfloat16)
    got, lse = cuteattn.flash_attn_func(q, k, v, causal=True, out=out, return_lse=True)
    assert got.data_ptr() == out.data_ptr()
    _check(got, lse, q, k, v, True)


@pytest.mark.parametrize("softmax_scale", (0.05, 0.3))
def test_softmax_scale_window_causal_and_out_only(softmax_scale):
    """A non-default scale; window (None, 0) is causal; return_lse=False returns out alone."""
    import cuteattn
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference

    q = torch.randn(2, 190, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 260, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    got = cuteattn.flash_attn_func(q, k, v, softmax_scale=softmax_scale, window_size=(None, 0))
    assert isinstance(got, torch.Tensor) and got.shape == q.shape
    out_ref, _ = attention(q, k, v, softmax_scale=softmax_scale, causal=True)
    out_pt, _ = attention(q, k, v, softmax_scale=softmax_scale, causal=True, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
