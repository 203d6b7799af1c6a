"""api.forward's family and plan overrides, on the CPU: the launch (ops.launch_forward, which the
custom op and the explicit-plan path both call) is replaced by a recorder, so these test what
reaches the launch (the plan), not the kernel."""

import dataclasses

import pytest
import torch

import cuteattn
from cuteattn import api
from cuteattn.plan import KernelPlan
from launch_recorder import qkv, record_launches


@pytest.fixture
def launches(monkeypatch):
    """The plans the launch gets, in order."""
    calls = record_launches(monkeypatch)
    return _PlanView(calls)


class _PlanView:
    def __init__(self, calls):
        self._calls = calls

    def __getitem__(self, index):
        return self._calls[index]["plan"]

    def __iter__(self):
        return (call["plan"] for call in self._calls)


def test_flash_attn_func_goes_through_forward(launches):
    q, k, v = qkv()
    out = cuteattn.flash_attn_func(q, k, v, causal=True)
    assert out.shape == q.shape
    out, lse = cuteattn.flash_attn_func(q, k, v, return_lse=True)
    assert lse.shape == (2, 4, 16)
    assert [p.causal for p in launches] == [True, False]
    assert all(p.arch == "sm_90a" and p.head_dim == 64 for p in launches)


def test_family_is_forced(launches):
    q, k, v = qkv(dim=128)
    api.forward(q, k, v, family="sm80")
    assert launches[-1].family == "sm80"


def test_explicit_plan_runs_as_given(launches):
    q, k, v = qkv(dim=128)
    api.forward(q, k, v, causal=True, family="sm80")
    planned = launches[-1]
    other = dataclasses.replace(planned, tile_m=64, tile_n=64, num_threads=128)
    api.forward(q, k, v, causal=True, plan=other)
    assert launches[-1] is other


def test_explicit_plan_decides_whether_lse_is_written(launches):
    """A plan that writes no lse needs return_lse=False; return_lse=False drops the lse of a
    plan that writes one."""
    q, k, v = qkv(dim=128)
    api.forward(q, k, v, causal=True, family="sm80", return_lse=False)
    without = launches[-1]
    assert without.option("lse") is False
    with pytest.raises(ValueError, match=r"^plan writes no lse"):
        api.forward(q, k, v, causal=True, plan=without)
    assert api.forward(q, k, v, causal=True, plan=without, return_lse=False)[1] is None
    with_lse = dataclasses.replace(
        without, options=tuple(pair for pair in without.options if pair[0] != "lse")
    )
    assert api.forward(q, k, v, causal=True, plan=with_lse)[1] is not None
    assert api.forward(q, k, v, causal=True, plan=with_lse, return_lse=False)[1] is None


def test_explicit_plan_must_match_the_inputs(launches):
    q, k, v = qkv(dim=128)
    api.forward(q, k, v, family="sm80")
    plan = launches[-1]
    with pytest.raises(ValueError, match=r"plan does not match the inputs: causal False"):
        api.forward(q, k, v, causal=True, plan=plan)
    with pytest.raises(ValueError, match=r"dtype 'bf16' \(the inputs have 'fp16'\)"):
        api.forward(*qkv(dim=128, dtype=torch.float16), plan=plan)
    with pytest.raises(ValueError, match=r"head_dim 128 \(the inputs have 64\)"):
        api.forward(*qkv(dim=64), plan=plan)
    with pytest.raises(ValueError, match=r"cannot implement"):
        api.forward(q, k, v, plan=dataclasses.replace(plan, tile_m=48))


def test_forced_family_that_cannot_take_the_problem(launches):
    q, k, _ = qkv(dim=64)
    _, _, v = qkv(dim=32)  # dim_v != dim: no family yet
    with pytest.raises(NotImplementedError, match=r"kernel family 'sm80' cannot run this problem"):
        api.forward(q, k, v, family="sm80")
    with pytest.raises(NotImplementedError, match=r"no kernel family can run this problem"):
        api.forward(q, k, v)


def test_unknown_family_and_bad_plan_arguments_come_before_the_device_check():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"unknown kernel family 'sm99' \(known: .*sm80"):
        api.forward(q, k, v, family="sm99")
    with pytest.raises(TypeError, match=r"plan must be a cuteattn.plan.KernelPlan"):
        api.forward(q, k, v, plan=("sm80", 128, 64))
    plan = KernelPlan(
        family="sm80", arch="sm_90a", dtype="bf16", head_dim=64, causal=False, tile_m=128,
        tile_n=64, num_threads=128,
    )
    with pytest.raises(ValueError, match=r"give family or plan, not both"):
        api.forward(q, k, v, family="sm80", plan=plan)
    with pytest.raises(ValueError, match=r"CUDA device"):
        api.forward(q, k, v, family="sm80")


def test_dim_v_reaches_a_plan_with_its_own_value_columns(launches):
    """q, k of head dim 192 and v of 128 (MLA-style): out has v's columns and the plan carries
    ("dim_v", 128); another dim_v says which pairs exist, before any launch."""
    q = torch.randn(2, 16, 4, 192, dtype=torch.bfloat16)
    k = torch.randn(2, 24, 2, 192, dtype=torch.bfloat16)
    v = torch.randn(2, 24, 2, 128, dtype=torch.bfloat16)
    out = cuteattn.flash_attn_func(q, k, v, causal=True)
    assert out.shape == (2, 16, 4, 128)
    assert (launches[0].family, launches[0].head_dim, launches[0].option("dim_v")) == (
        "sm90", 192, 128
    )
    with pytest.raises(NotImplementedError, match=r"\(192, 128\)"):
        cuteattn.flash_attn_func(q, k, torch.randn(2, 24, 2, 64, dtype=torch.bfloat16))
