"""Bad input raises ValueError / TypeError naming the argument and the rule, before any launch.

These run on the CPU: structural checks come before the device check, so CPU tensors reach
each rule; the device rule itself is tested with CPU and meta tensors.
"""

import pytest
import torch

import cuteattn
from cuteattn import validate
from cuteattn.arch import arch_from_name
from cuteattn.plan import Problem, plan_forward


def qkv(batch=2, seqlen_q=16, seqlen_k=24, heads_q=4, heads_kv=2, dim=64, dtype=torch.bfloat16):
    q = torch.randn(batch, seqlen_q, heads_q, dim, dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, dim, dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, dim, dtype=dtype)
    return q, k, v


def call(q, k, v, **kwargs):
    return cuteattn.flash_attn_func(q, k, v, **kwargs)


def problem_of(q, k, v, arch="sm_90a"):
    batch, seqlen_q, heads_q, dim = q.shape
    return Problem(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=k.shape[1], heads_q=heads_q,
        heads_kv=k.shape[2], head_dim=dim, head_dim_v=v.shape[3],
        dtype=validate.DTYPES[q.dtype], causal=False, arch=arch_from_name(arch),
    )


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


@pytest.mark.parametrize("dim", [264, 512])
def test_head_dim_above_256(dim):
    q, k, v = qkv(dim=dim)
    with pytest.raises(ValueError, match=r"head dim of q/k must be a multiple of 8 from 8 to 256"):
        call(q, k, v)


@pytest.mark.parametrize("dim", [32, 40, 160])
def test_head_dims_between_the_kernels_pass_validation_and_plan_padded(dim):
    """Well-formed head dims pass validation; every family pads them to its next kernel's."""
    q, k, v = qkv(dim=dim)
    validate.check_forward(q, k, v)
    plan = plan_forward(problem_of(q, k, v, arch="sm_80"))
    assert plan.option("dim") == dim and plan.head_dim > dim


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


@pytest.mark.parametrize(
    "shape", [dict(batch=0), dict(seqlen_q=0), dict(seqlen_k=0)], ids=["batch0", "sq0", "sk0"]
)
def test_empty_inputs_pass_the_structural_checks(shape):
    """Empty inputs are valid (flash-attn's behaviour; the results need no kernel: see
    tests/cpu/test_empty_inputs.py); only the device rule stops CPU tensors."""
    q, k, v = qkv(**shape)
    validate.check_forward(q, k, v)
    with pytest.raises(ValueError, match=r"must be on a CUDA device"):
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


def test_softcap_must_be_a_number():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"softcap must be a float"):
        call(q, k, v, softcap="30")


def test_bad_input_is_reported_before_unsupported_options():
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(TypeError, match=r"torch.float16 or torch.bfloat16"):
        call(q, k, v, window_size=(3, 3), softcap=5.0)


@pytest.mark.parametrize(
    "causal,window,expected",
    [
        (False, (None, None), (False, -1, -1)),
        (False, (-1, -1), (False, -1, -1)),
        (True, (None, None), (True, -1, -1)),
        (True, (-1, 5), (True, -1, -1)),  # causal forces the right bound to 0
        (False, (-1, 0), (True, -1, -1)),
        (False, (None, 0), (True, -1, -1)),
        (False, (torch.tensor(-1), 0), (True, -1, -1)),  # any integer type, as the reference
        (False, (16, 0), (False, 16, 0)),
        (True, (16, None), (False, 16, 0)),
        (False, (0, 3), (False, 0, 3)),
        (False, (None, 64), (False, -1, 64)),
        (False, (5, None), (False, 5, -1)),
    ],
)
def test_resolve_mask(causal, window, expected):
    from cuteattn.api import resolve_mask

    assert resolve_mask(causal, window) == expected


@pytest.mark.parametrize("window", [(True, None), (1.5, None), ("2", 0)])
def test_window_bounds_must_be_ints(window):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"window_size left must be an int or None"):
        call(q, k, v, window_size=window)


def test_softmax_scale_must_be_a_number():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"softmax_scale must be a float"):
        call(q, k, v, softmax_scale="0.1")


def test_zero_heads():
    """Empty batches and sequences are valid (test_empty_inputs_pass_the_structural_checks);
    zero heads are not (flash-attn has no such call)."""
    q, k, v = qkv(heads_kv=0)
    with pytest.raises(ValueError, match=r"heads of q"):
        call(q, k, v)


def test_batch_beyond_grid_limit():
    """Well-formed; the sm80 family's grid cannot hold it, which the planner reports."""
    q, k, v = qkv(batch=65536, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1)
    validate.check_forward(q, k, v)
    with pytest.raises(NotImplementedError, match=r"must each be <= 65535"):
        plan_forward(problem_of(q, k, v), family="sm80")


def test_out_with_overlapping_elements():
    q, k, v = qkv()
    out = torch.empty((1,) + q.shape[1:], dtype=q.dtype).expand(q.shape)
    with pytest.raises(ValueError, match=r"out must not have overlapping elements"):
        call(q, k, v, out=out)


def test_out_misaligned_start():
    q, k, v = qkv()
    out = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    with pytest.raises(ValueError, match=r"16-byte aligned start"):
        call(q, k, v, out=out)


def test_out_stride_not_multiple_of_8():
    q, k, v = qkv()
    out = torch.empty(q.shape[:-2] + (q.shape[2] * q.shape[3] + 4,), dtype=q.dtype)
    out = out[..., : q.shape[2] * q.shape[3]].unflatten(-1, q.shape[2:])
    with pytest.raises(ValueError, match=r"multiples of 8"):
        call(q, k, v, out=out)


def test_out_on_another_device():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"out must be on the device of q"):
        call(q, k, v, out=torch.empty_like(q, device="meta"))


def test_causal_window_forms_are_accepted_before_the_device_check():
    q, k, v = qkv()
    for kwargs in ({"causal": True}, {"window_size": (-1, 0)}, {"window_size": (None, 0)}):
        with pytest.raises(ValueError, match=r"CUDA device"):
            call(q, k, v, **kwargs)


def test_noncontiguous_inputs_are_copied_not_misread():
    q, _, _ = qkv()
    transposed = q.transpose(1, 2).contiguous().transpose(1, 2)  # last dim still contiguous
    assert validate.kernel_addressable(transposed)
    assert validate.kernel_ready(transposed) is transposed
    strided = torch.randn(2, 16, 4, 128, dtype=torch.bfloat16)[..., ::2]
    odd_stride = torch.randn(2, 16, 4 * 64 + 4, dtype=torch.bfloat16)[..., :256].view(2, 16, 4, 64)
    misaligned = torch.randn(2 * 16 * 4 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 16, 4, 64)
    size1_odd_stride = torch.randn(1, 16, 4, 64, dtype=torch.bfloat16).as_strided(
        (1, 16, 4, 64), (3, 256, 64, 1)
    )
    for x in (strided, odd_stride, misaligned, size1_odd_stride):
        assert not validate.kernel_addressable(x)
        fixed = validate.kernel_ready(x)
        assert validate.kernel_addressable(fixed) and torch.equal(fixed, x)


def test_learnable_sink_rules():
    q, k, v = qkv()  # 4 query heads
    with pytest.raises(TypeError, match=r"learnable_sink must be a torch.Tensor"):
        call(q, k, v, learnable_sink=[0.0] * 4)
    with pytest.raises(ValueError, match=r"learnable_sink must have shape \(heads_q,\) = \(4,\)"):
        call(q, k, v, learnable_sink=torch.zeros(2))
    with pytest.raises(TypeError, match=r"learnable_sink must be torch.float32"):
        call(q, k, v, learnable_sink=torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"learnable_sink must be on the device of q"):
        call(q, k, v, learnable_sink=torch.zeros(4, device="meta"))


def test_backward_inputs_take_the_output_shape_of_a_dim_v_pair():
    """dout and out have v's head dim (192 / 128, MLA-style): accepted; q's dim is not."""
    q = torch.randn(2, 16, 4, 192, dtype=torch.bfloat16)
    out = torch.randn(2, 16, 4, 128, dtype=torch.bfloat16)
    lse = torch.randn(2, 4, 16)
    validate.check_backward(out.clone(), q, out, lse, dim_v=128)
    with pytest.raises(ValueError, match=r"dout must have the shape of the output .*\(2, 16, 4, 128\)"):
        validate.check_backward(torch.randn(2, 16, 4, 192, dtype=torch.bfloat16), q, out, lse,
                                dim_v=128)
