"""Bad input raises ValueError / TypeError naming the argument and the rule, before any launch.

These run on the CPU: structural checks come before the device check, so CPU tensors reach
each rule; the device rule itself is tested with CPU and meta tensors.
"""

import pytest
import torch

import cuteattn
from cuteattn import validate


def qkv(batch=2, seqlen_q=16, seqlen_k=24, heads_q=4, heads_kv=2, dim=64, dtype=torch.bfloat16):
    q = torch.randn(batch, seqlen_q, heads_q, dim, dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, dim, dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, dim, dtype=dtype)
    return q, k, v


def call(q, k, v, **kwargs):
    return cuteattn.flash_attn_func(q, k, v, **kwargs)


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k must be a torch.Tensor"):
        call(q, [1, 2], v)


def test_fp32_input():
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(TypeError, match=r"q must be torch.float16 or torch.bfloat16"):
        call(q, k, v)


def test_dtype_mismatch():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"share one dtype"):
        call(q, k.half(), v)


def test_wrong_rank():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q must have 4 dimensions"):
        call(q[0], k, v)


def test_heads_not_divisible():
    q, k, v = qkv(heads_q=5, heads_kv=2)
    with pytest.raises(ValueError, match=r"heads of q \(5\) must be a positive multiple"):
        call(q, k, v)


@pytest.mark.parametrize("dim", [32, 40, 160, 512])
def test_unsupported_head_dim(dim):
    q, k, v = qkv(dim=dim)
    with pytest.raises(ValueError, match=r"head dim of q/k must be one of"):
        call(q, k, v)


def test_head_dim_not_multiple_of_8():
    q, k, v = qkv(dim=100)
    with pytest.raises(ValueError, match=r"multiple of 8"):
        call(q, k, v)


def test_mismatched_batch():
    q, _, _ = qkv(batch=2)
    _, k, v = qkv(batch=3)
    with pytest.raises(ValueError, match=r"same batch size"):
        call(q, k, v)


def test_k_head_dim_differs_from_q():
    q, _, _ = qkv(dim=64)
    _, k, v = qkv(dim=128)
    with pytest.raises(ValueError, match=r"k must have the head dim of q"):
        call(q, k, v)


def test_v_shape_differs_from_k():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"v must match k"):
        call(q, k, v[:, :-1])


def test_empty_sequence():
    q, k, v = qkv(seqlen_k=0)
    with pytest.raises(ValueError, match=r"seqlen_q and seqlen_k must be >= 1"):
        call(q, k, v)


def test_cpu_tensors():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"must be on a CUDA device"):
        call(q, k, v)


def test_tensors_on_different_devices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k must be on the device of q"):
        call(q, k.to("meta"), v)


def test_out_wrong_shape():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"out must have shape"):
        call(q, k, v, out=torch.empty_like(q)[:, :-1])


def test_out_wrong_dtype():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"out must have the dtype of q"):
        call(q, k, v, out=torch.empty_like(q, dtype=torch.float16))


def test_out_non_contiguous_last_dim():
    q, k, v = qkv()
    out = torch.empty(q.shape[:-1] + (q.shape[-1] * 2,), dtype=q.dtype)[..., ::2]
    with pytest.raises(ValueError, match=r"out must have a contiguous last dim"):
        call(q, k, v, out=out)


@pytest.mark.parametrize("window", [(-2, None), (None, -5)])
def test_negative_window(window):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"window_size (left|right) must be >= 0"):
        call(q, k, v, window_size=window)


def test_window_not_a_pair():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"window_size must be a pair"):
        call(q, k, v, window_size=(1, 2, 3))


def test_negative_softcap():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"softcap must be finite and >= 0"):
        call(q, k, v, softcap=-1.0)


@pytest.mark.parametrize("scale", [float("nan"), 0.0, -1.0])
def test_bad_softmax_scale(scale):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"softmax_scale must be finite and > 0"):
        call(q, k, v, softmax_scale=scale)


def test_local_window_not_implemented():
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match=r"local attention"):
        call(q, k, v, window_size=(16, 0))


def test_softcap_not_implemented():
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match=r"softcap"):
        call(q, k, v, softcap=30.0)


def test_causal_window_forms_are_accepted_before_the_device_check():
    q, k, v = qkv()
    for kwargs in ({"causal": True}, {"window_size": (-1, 0)}, {"window_size": (None, 0)}):
        with pytest.raises(ValueError, match=r"CUDA device"):
            call(q, k, v, **kwargs)


def test_noncontiguous_inputs_are_copied_not_misread():
    q, _, _ = qkv()
    transposed = q.transpose(1, 2).contiguous().transpose(1, 2)  # last dim still contiguous
    assert validate.kernel_addressable(transposed)
    strided = torch.randn(2, 16, 4, 128, dtype=torch.bfloat16)[..., ::2]
    assert not validate.kernel_addressable(strided)
    fixed = validate.kernel_ready(strided)
    assert validate.kernel_addressable(fixed) and torch.equal(fixed, strided)
    odd_stride = torch.randn(2, 16, 4 * 64 + 4, dtype=torch.bfloat16)[..., :256].view(2, 16, 4, 64)
    assert not validate.kernel_addressable(odd_stride)
    assert torch.equal(validate.kernel_ready(odd_stride), odd_stride)
