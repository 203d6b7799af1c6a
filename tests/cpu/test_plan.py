"""Planner: choices per arch, shared-memory fit, errors, and a golden snapshot of compile keys."""


import pytest

from cuteattn.kernels.sm80.forward import FlashForwardSm80
from cuteattn.plan import SUPPORTED_HEAD_DIMS, Problem, plan_forward
from cuteattn.arch import arch_from_capability, arch_from_name

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_120a")


def problem(head_dim=128, causal=False, arch="sm_90a", **overrides):
    fields = dict(
        batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=8, heads_kv=2, head_dim=head_dim,
        head_dim_v=head_dim, dtype="bf16", causal=causal, arch=arch_from_name(arch),
    )
    fields.update(overrides)
    return Problem(**fields)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_plan_is_implementable_and_fits(arch, causal, head_dim):
    caps = arch_from_name(arch)
    plan = plan_forward(problem(head_dim, causal, arch))
    assert plan.family == "sm80" and plan.arch == caps.name
    assert FlashForwardSm80.can_implement(
        head_dim, plan.tile_m, plan.tile_n, plan.num_threads, caps.smem_per_block
    )


def test_plan_ignores_runtime_sizes():
    """Sizes are runtime values: one compiled kernel serves every batch and sequence length."""
    small = plan_forward(problem(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1))
    large = plan_forward(problem(batch=64, seqlen_q=16384, seqlen_k=4097))
    assert small == large


def test_plans_are_hashable_cache_keys():
    plans = {plan_forward(problem(d, c)) for d in SUPPORTED_HEAD_DIMS for c in (False, True)}
    assert len(plans) == 2 * len(SUPPORTED_HEAD_DIMS)


def test_unsupported_requests():
    with pytest.raises(ValueError, match="head_dim 40"):
        plan_forward(problem(head_dim=40))
    with pytest.raises(NotImplementedError, match="dim_v != dim"):
        plan_forward(problem(head_dim=128, head_dim_v=64))
    with pytest.raises(NotImplementedError, match="compute capability 7.5"):
        arch_from_capability(7, 5)


# Golden compile keys: a change of tiling must show up here as a reviewed diff.
GOLDEN = {
    ("sm_90a", 64, False): (128, 128, 128),
    ("sm_90a", 64, True): (128, 64, 128),
    ("sm_90a", 96, False): (128, 64, 128),
    ("sm_90a", 128, False): (128, 64, 128),
    ("sm_90a", 128, True): (128, 64, 128),
    ("sm_90a", 192, False): (128, 64, 256),
    ("sm_90a", 256, False): (64, 64, 128),
    ("sm_90a", 256, True): (64, 64, 128),
    ("sm_80", 192, True): (128, 64, 256),
    ("sm_86", 192, False): (128, 64, 256),
    ("sm_120a", 128, True): (128, 64, 128),
    ("sm_120a", 256, False): (64, 64, 128),
}


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_golden_compile_keys(key):
    arch, head_dim, causal = key
    plan = plan_forward(problem(head_dim, causal, arch))
    assert (plan.tile_m, plan.tile_n, plan.num_threads) == GOLDEN[key]


def test_can_implement_requires_whole_copy_passes():
    # 256 threads copy 32 rows of a d256 tile per pass: a 16-row key tile cannot be copied.
    assert not FlashForwardSm80.can_implement(256, 128, 16, 256, 227 * 1024)
    assert FlashForwardSm80.can_implement(256, 128, 32, 256, 227 * 1024)
    assert not FlashForwardSm80.can_implement(256, 128, 128, 256, 99 * 1024)  # 192 KB
