"""flash_attn_func's drop-in signature (flash-attn 2's positional order), flag and dropout
checks, the unsupported options, and the rule that out must not overlap q, k or v.

On the CPU: the launch (api.ops.launch_forward) is replaced by a recorder and CUTEATTN_ARCH names the
arch, so these test what reaches the launch (plan, scale, out), not the kernel.
"""

import inspect
import math
from fractions import Fraction

import pytest
import torch

import cuteattn
from cuteattn import api, validate
from launch_recorder import qkv, record_launches

try:
    import numpy as np  # torch does not require numpy
except ImportError:
    np = None

NUMPY_BOOLS = [np.bool_(True)] if np is not None else []
NUMPY_ZEROS = [np.float32(0.0), np.float64(0.0)] if np is not None else []


@pytest.fixture
def launches(monkeypatch):
    return record_launches(monkeypatch)


# The signature ----------------------------------------------------------------------------

FLASH_ATTN_2_ORDER = [
    ("q", inspect.Parameter.empty),
    ("k", inspect.Parameter.empty),
    ("v", inspect.Parameter.empty),
    ("dropout_p", 0.0),
    ("softmax_scale", None),
    ("causal", False),
    ("window_size", (-1, -1)),
    ("softcap", 0.0),
    ("alibi_slopes", None),
    ("deterministic", False),
    ("return_attn_probs", False),
]


def test_signature_is_flash_attn_2s_then_keyword_only():
    params = list(inspect.signature(cuteattn.flash_attn_func).parameters.values())
    positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword_only = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [(p.name, p.default) for p in positional] == FLASH_ATTN_2_ORDER
    assert [(p.name, p.default) for p in keyword_only] == [
        ("return_lse", False), ("out", None), ("learnable_sink", None)
    ]
    assert len(params) == len(positional) + len(keyword_only)


def test_fourth_positional_argument_is_dropout_not_softmax_scale(launches):
    q, k, v = qkv()
    cuteattn.flash_attn_func(q, k, v, 0.0, 0.5)
    assert launches[-1]["softmax_scale"] == 0.5
    with pytest.raises(NotImplementedError, match=r"dropout_p=0.25: dropout is not supported"):
        cuteattn.flash_attn_func(q, k, v, 0.25)  # a scale in the FA3 / FA4 position
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got 2.0"):
        cuteattn.flash_attn_func(q, k, v, 2.0)
    with pytest.raises(TypeError, match=r"dropout_p must be a real number"):
        cuteattn.flash_attn_func(q, k, v, None, True)  # FA3's (softmax_scale, causal)
    assert len(launches) == 1


def test_every_flash_attn_2_argument_positionally(launches):
    q, k, v = qkv()
    out = cuteattn.flash_attn_func(q, k, v, 0.0, 0.25, True, (-1, -1), 0.0, None, True, False)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    assert launches[-1]["plan"].causal is True
    assert launches[-1]["softmax_scale"] == 0.25


def test_return_lse_and_out_are_keyword_only(launches):
    q, k, v = qkv()
    args = (q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False, False)
    with pytest.raises(TypeError, match=r"positional argument"):
        cuteattn.flash_attn_func(*args, True)
    with pytest.raises(TypeError, match=r"positional argument"):
        cuteattn.flash_attn_func(*args, True, torch.empty_like(q))
    assert launches == []


def test_return_conventions(launches):
    q, k, v = qkv()
    out = cuteattn.flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor)
    buffer = torch.empty_like(q)
    got, lse = cuteattn.flash_attn_func(q, k, v, return_lse=True, out=buffer)
    assert got is buffer and launches[-1]["out"] is buffer
    assert lse.shape == (2, 4, 16)


def test_dropout_zero_in_any_real_type_reaches_the_launch(launches):
    q, k, v = qkv()
    zeros = [0, 0.0, Fraction(0), *NUMPY_ZEROS]
    for dropout_p in zeros:
        cuteattn.flash_attn_func(q, k, v, dropout_p)
        cuteattn.flash_attn_func(q, k, v, dropout_p=dropout_p)
    assert len(launches) == 2 * len(zeros)


def test_deterministic_is_accepted_and_changes_nothing_in_the_forward(launches):
    q, k, v = qkv()
    cuteattn.flash_attn_func(q, k, v, causal=True)
    cuteattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
    assert launches[0]["plan"] == launches[1]["plan"]


def test_hugging_face_style_keywords(launches):
    """Current Hugging Face passes dropout_p=, softmax_scale=, causal=, softcap=, deterministic=."""
    q, k, v = qkv()
    cuteattn.flash_attn_func(
        q, k, v, dropout_p=0.0, softmax_scale=None, causal=True, softcap=0.0,
        deterministic=False, window_size=(-1, -1),
    )
    assert launches[-1]["plan"].causal is True
    assert launches[-1]["softmax_scale"] == 64**-0.5


@pytest.mark.parametrize(
    "window,causal",
    [((-1, -1), False), ((None, None), False), ((None, 0), True), ((-1, 0), True)],
)
def test_window_default_and_none_as_unbounded(launches, window, causal):
    q, k, v = qkv()
    cuteattn.flash_attn_func(q, k, v, window_size=window)
    assert launches[-1]["plan"].causal is causal


# Unsupported options: NotImplementedError naming the argument ----------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"dropout_p": 0.1}, r"dropout_p=0.1: dropout is not supported"),
        ({"alibi_slopes": torch.ones(4)}, r"alibi_slopes is not supported"),
        ({"return_attn_probs": True}, r"return_attn_probs=True is not supported.*return_lse=True"),
    ],
)
def test_unsupported_options(launches, kwargs, message):
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match=message):
        cuteattn.flash_attn_func(q, k, v, **kwargs)
    with pytest.raises(NotImplementedError, match=message):
        api.forward(q, k, v, **kwargs)
    assert launches == []


@pytest.mark.parametrize(
    "kwargs",
    [{"dropout_p": 0.1}, {"alibi_slopes": torch.ones(4)}, {"return_attn_probs": True}],
)
def test_bad_input_is_reported_before_unsupported_options(kwargs):
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(TypeError, match=r"q must be torch.float16 or torch.bfloat16"):
        cuteattn.flash_attn_func(q, k, v, **kwargs)


# Flags and dropout_p: TypeError / ValueError naming the argument -------------------------


@pytest.mark.parametrize("name", ["causal", "deterministic", "return_attn_probs", "return_lse"])
@pytest.mark.parametrize(
    "value", ["no", "False", 0, 1, None, 1.0, torch.tensor(True), *NUMPY_BOOLS]
)
def test_flags_must_be_python_bools(launches, name, value):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=rf"^{name} must be a Python bool \(True or False\), got "):
        cuteattn.flash_attn_func(q, k, v, **{name: value})
    assert launches == []


@pytest.mark.parametrize("name", ["causal", "deterministic", "return_attn_probs"])
def test_forward_checks_its_flags_too(launches, name):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=rf"^{name} must be a Python bool"):
        api.forward(q, k, v, **{name: "no"})
    assert launches == []


def test_causal_no_is_not_causal_attention(launches):
    q, k, v = qkv()
    message = r"causal must be a Python bool \(True or False\), got 'no' \(str\)"
    with pytest.raises(TypeError, match=message):
        cuteattn.flash_attn_func(q, k, v, causal="no")
    assert launches == []


@pytest.mark.parametrize("value", ["0.1", None, True, False, torch.tensor(0.0), [0.0], 1j])
def test_dropout_must_be_a_real_number(launches, value):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"^dropout_p must be a real number in \[0, 1\), got "):
        cuteattn.flash_attn_func(q, k, v, dropout_p=value)
    assert launches == []


@pytest.mark.parametrize("value", [1, 1.0, 1.5, -0.1, -1, float("nan"), float("inf")])
def test_dropout_must_be_in_zero_one(launches, value):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^dropout_p must be in \[0, 1\), got "):
        cuteattn.flash_attn_func(q, k, v, value)
    assert launches == []


def test_softmax_scale_checks_are_unchanged(launches):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"softmax_scale must be a float or None"):
        cuteattn.flash_attn_func(q, k, v, softmax_scale=True)
    with pytest.raises(ValueError, match=r"softmax_scale must be finite and > 0"):
        cuteattn.flash_attn_func(q, k, v, softmax_scale=-1.0)


# out must not overlap q, k or v ----------------------------------------------------------


def test_byte_range_covers_the_highest_addressed_element():
    buf = torch.empty(100, dtype=torch.bfloat16)
    view = buf[10:].as_strided((3, 4), (20, 2))
    start, end = validate.byte_range(view)
    assert start == buf.data_ptr() + 10 * 2
    assert end == buf.data_ptr() + (10 + 2 * 20 + 3 * 2 + 1) * 2


def test_overlapping_views_share_memory():
    buf = torch.empty(2, 16, 4, 64, dtype=torch.bfloat16)
    assert validate.may_share_memory(buf, buf)
    assert validate.may_share_memory(buf, buf.view(-1))
    assert validate.may_share_memory(buf[0], buf[0, 5:7])
    assert validate.may_share_memory(buf[:, :, 1], buf[:, :8])
    # Interleaved: no common element, but the byte ranges intersect -> refused (conservative).
    assert validate.may_share_memory(buf[..., :32], buf[..., 32:])


def test_views_of_one_storage_that_do_not_overlap():
    buf = torch.empty(2, 16, 4, 64, dtype=torch.bfloat16)
    assert not validate.may_share_memory(buf[0], buf[1])
    assert not validate.may_share_memory(buf[0, :8], buf[0, 8:])
    flat = torch.empty(100, dtype=torch.bfloat16)
    assert not validate.may_share_memory(flat[:50], flat[50:])  # adjacent, end is exclusive
    assert validate.may_share_memory(flat[:51], flat[50:])


def test_separate_storages_and_meta_tensors_do_not_share_memory():
    a, b = torch.empty(8), torch.empty(8)
    assert not validate.may_share_memory(a, b)
    assert not validate.may_share_memory(a, a.clone())
    m = torch.empty(8, device="meta")
    assert not validate.may_share_memory(m, torch.empty(8, device="meta"))
    assert not validate.may_share_memory(m, m)
    assert not validate.may_share_memory(a, m)


def test_out_beside_q_in_a_packed_buffer_is_accepted(launches):
    """q and out as consecutive blocks of one buffer: same storage, disjoint byte ranges."""
    _, k, v = qkv()
    packed = torch.randn(2, 2, 16, 4, 64, dtype=torch.bfloat16)  # (q | out, batch, ...)
    q, out = packed[0], packed[1]
    got = cuteattn.flash_attn_func(q, k, v, out=out)
    assert got is out and launches[-1]["out"] is out


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_out_overlapping_an_input_is_refused_before_the_launch(launches, which):
    q, k, v = qkv()
    # The input and out both start at the front of one buffer.
    buf = torch.randn(q.numel() + k.numel(), dtype=torch.bfloat16)
    inputs = {"q": q, "k": k, "v": v}
    inputs[which] = buf[: inputs[which].numel()].view(inputs[which].shape)
    out = buf[: q.numel()].view(q.shape)
    with pytest.raises(ValueError, match=rf"^out must not overlap {which}: "):
        cuteattn.flash_attn_func(**inputs, out=out)
    with pytest.raises(ValueError, match=rf"^out must not overlap {which}: "):
        api.forward(**inputs, out=out)
    assert launches == []


def test_out_is_q(launches):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^out must not overlap q: "):
        cuteattn.flash_attn_func(q, k, v, out=q)
    assert launches == []


def test_out_partially_overlapping_q_is_refused(launches):
    _, k, v = qkv()
    buf = torch.randn(3 * 16 * 4 * 64, dtype=torch.bfloat16)
    q = buf[: 2 * 16 * 4 * 64].view(2, 16, 4, 64)
    out = buf[16 * 4 * 64 :].view(2, 16, 4, 64)  # out's batch 0 is q's batch 1
    with pytest.raises(ValueError, match=r"out must not overlap q"):
        cuteattn.flash_attn_func(q, k, v, out=out)
    interleaved = torch.randn(2, 16, 2, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"out must not overlap q.*conservative"):
        cuteattn.flash_attn_func(interleaved[:, :, 0], k, v, out=interleaved[:, :, 1])
    assert launches == []


def test_inputs_may_share_memory_with_each_other(launches):
    """Packed qkv (q, k, v views of one tensor) is fine: only out is written."""
    qkv_packed = torch.randn(2, 16, 3, 4, 64, dtype=torch.bfloat16)
    q, k, v = qkv_packed.unbind(2)
    cuteattn.flash_attn_func(q, k, v, causal=True)
    assert launches[-1]["plan"].causal is True


# api.forward keeps its keyword signature -------------------------------------------------


def test_forward_keeps_its_keyword_signature(launches):
    q, k, v = qkv(dim=128)
    out = torch.empty_like(q)
    got, lse = api.forward(
        q, k, v, softmax_scale=0.1, causal=True, window_size=(None, None), softcap=0.0,
        out=out, family="sm80",
    )
    assert got is out and lse.shape == (2, 4, 16)
    call = launches[-1]
    assert call["plan"].family == "sm80" and call["plan"].causal is True
    assert math.isclose(call["softmax_scale"], 0.1)
    with pytest.raises(TypeError, match=r"positional argument"):
        api.forward(q, k, v, 0.0)


def test_flash_attn_func_and_forward_reach_the_same_plan(launches):
    q, k, v = qkv(dim=128)
    cuteattn.flash_attn_func(q, k, v, 0.0, None, True, return_lse=True)
    api.forward(q, k, v, causal=True)
    assert launches[0]["plan"] == launches[1]["plan"]
    assert launches[0]["plan"].arch == "sm_90a" and launches[0]["plan"].head_dim == 128
    assert launches[0]["plan"].option("lse") is None
    # Without return_lse (and without grad) the kernel writes no lse: its own plan.
    cuteattn.flash_attn_func(q, k, v, 0.0, None, True)
    got, lse = api.forward(q, k, v, causal=True, return_lse=False)
    assert lse is None and launches[2]["plan"] == launches[3]["plan"]
    assert launches[2]["plan"].option("lse") is False


# Local windows ----------------------------------------------------------------------------


def test_local_windows_reach_the_plan(launches):
    """A window is a plan option with causal off; causal forces its right bound to 0; (-1, 0)
    is the causal plan itself."""
    q, k, v = qkv()
    cases = [
        (dict(window_size=(16, 0)), False, (16, 0)),
        (dict(causal=True, window_size=(16, 4)), False, (16, 0)),
        (dict(window_size=(None, 7)), False, (-1, 7)),
        (dict(window_size=(-1, 0)), True, None),
        (dict(window_size=(None, None)), False, None),
    ]
    for kwargs, causal, window in cases:
        cuteattn.flash_attn_func(q, k, v, **kwargs)
        plan = launches[-1]["plan"]
        assert (plan.causal, plan.option("window")) == (causal, window), kwargs


def test_local_windows_with_grad_record_the_training_op(launches):
    q, k, v = (x.requires_grad_() for x in qkv())
    cuteattn.flash_attn_func(q, k, v, window_size=(16, 0))
    assert launches[-1]["plan"].option("window") == (16, 0)


def test_window_bounds_that_hide_nothing_are_unbounded(launches):
    """A left bound >= seqlen_k or a right bound >= seqlen_q hides nothing: unbounded (huge
    values never reach the kernels' 32-bit arithmetic, nor compile kernels of their own)."""
    import sys

    q, k, v = qkv()  # seqlen_q 16, seqlen_k 24
    cases = [
        ((sys.maxsize, 0), True, None),
        ((2**31 - 1, -1), False, None),
        ((24, 3), False, (-1, 3)),
        ((23, 3), False, (23, 3)),
        ((5, 16), False, (5, -1)),
        ((5, 15), False, (5, 15)),
    ]
    for window, causal, planned in cases:
        cuteattn.flash_attn_func(q, k, v, window_size=window)
        plan = launches[-1]["plan"]
        assert (plan.causal, plan.option("window")) == (causal, planned), window
