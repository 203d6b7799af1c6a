"""Planner: a Problem (shapes, dtypes, options, arch) -> a KernelPlan (family and tiling).

Pure Python. It reads shapes and flags, never tensor contents; it neither allocates nor
synchronises. A plan holds exactly what changes the generated code, so it is the compile-cache
key: batch and sequence lengths are runtime values and stay out of it.

Kernel families are tried in preference order (``FAMILY_MODULES``: sm90 before sm80, so Hopper
gets its own family once it exists). A family is skipped when it does not run on the arch or
cannot take the problem; the first one left picks its first tiling that fits. What no family can
do raises NotImplementedError naming each family's reason. ``plan_forward(problem, family=...)``
forces one family, which is how tests and the benchmark reach every family on one GPU.
"""

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cuteattn.arch import ArchCaps

if TYPE_CHECKING:
    from cuteattn.kernels.family import KernelFamily

DTYPES = ("bf16", "fp16")
KINDS = ("forward", "backward")

# Family descriptor modules, most preferred first. A module that does not exist (a family not
# written yet) is skipped; each one that exists exposes FAMILY, a KernelFamily.
FAMILY_MODULES = ("cuteattn.kernels.sm90.family", "cuteattn.kernels.sm80.family")


@dataclass(frozen=True)
class Problem:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    dtype: str  # "bf16" | "fp16"
    causal: bool
    arch: ArchCaps
    # Backward: dq accumulated in a fixed order, bitwise reproducible run to run.
    deterministic: bool = False
    # Logit soft-capping: scores become softcap * tanh(scores / softcap); 0 is off. A plan
    # carries it as the option ("softcap", value): the kernels fold it into constants.
    softcap: float = 0.0
    # A learnable sink logit per query head (its values are a runtime tensor): forward plans
    # carry ("sink", True); the backward needs nothing of it (lse includes the sink).
    sink: bool = False
    # A local window (left, right), each >= 0 or -1 for unbounded, or None. A window that is
    # the causal mask ((-1, 0)) or no mask ((-1, -1)) is given as ``causal`` / None instead.
    window: tuple[int, int] | None = None
    # Packed variable-length sequences (flash_attn_varlen_func): batch is the number of
    # sequences and seqlen_q / seqlen_k the longest ones; ``seqused_k`` caps each one's keys.
    varlen: bool = False
    seqused_k: bool = False
    # Whether the forward's caller reads lse (training, return_lse). A call that does not gets
    # plans with ("lse", False), whose kernels write none (as cuDNN and FlashAttention-4 do).
    lse: bool = True


@dataclass(frozen=True)
class KernelPlan:
    """One compiled kernel: the compile-cache key.

    ``kind`` is the pass: "forward" or "backward" (the main backward kernel: dK, dV and the dQ
    accumulation). ``num_stages`` counts K/V buffers in shared memory (the sm80 family uses 1).
    ``options``
    holds a family's own compile-time switches as (name, value) pairs sorted by name, e.g.
    ``(("intra_wg_overlap", True), ("pingpong", False))``: one field that every family can use,
    rather than a field per switch of one family on every plan. Read them with ``option``.
    """

    family: str  # a KernelFamily name: "sm80", "sm90"
    arch: str  # DSL target, e.g. "sm_90a"
    dtype: str
    head_dim: int
    causal: bool
    tile_m: int
    tile_n: int
    num_threads: int
    num_stages: int = 1
    options: tuple[tuple[str, object], ...] = ()
    kind: str = "forward"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.options, tuple) or not all(
            isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
            for pair in self.options
        ):
            raise TypeError(f"options must be a tuple of (name, value) pairs, got {self.options!r}")
        names = [name for name, _ in self.options]
        if names != sorted(set(names)):
            raise ValueError(f"option names must be unique and sorted, got {names}")

    def option(self, name: str, default=None):
        """The value of option ``name``, or ``default`` if the plan does not set it."""
        return dict(self.options).get(name, default)


@functools.cache
def families() -> tuple["KernelFamily", ...]:
    """The kernel families that exist, in order of preference."""
    loaded = []
    for module_name in FAMILY_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only the family module itself (or its package) may be missing; a missing import
            # inside an existing family is a real error.
            if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
                raise
            continue
        loaded.append(module.FAMILY)
    return tuple(loaded)


def family_names() -> tuple[str, ...]:
    return tuple(family.name for family in families())


def get_family(name: str) -> "KernelFamily":
    for family in families():
        if family.name == name:
            return family
    raise ValueError(
        f"unknown kernel family {name!r} (known: {', '.join(family_names())})"
    )


def _plan_or_reason(
    family: "KernelFamily", problem: Problem, kind: str = "forward"
) -> tuple[KernelPlan | None, str]:
    if not family.supports(problem.arch):
        return None, f"does not run on {problem.arch.name}"
    if kind == "backward" and not family.has_backward:
        return None, "has no backward kernel yet"
    reason = family.reject_reason(problem)
    if reason is not None:
        return None, reason
    plan = family.choose(problem) if kind == "forward" else family.choose_backward(problem)
    if plan is None:
        smem_kb = problem.arch.smem_per_block // 1024
        return None, (
            f"no tiling of head_dim {problem.head_dim} fits {problem.arch.name}'s "
            f"{smem_kb} KB of shared memory"
        )
    return plan, ""


def plan_forward(problem: Problem, family: str | None = None) -> KernelPlan:
    """The plan for ``problem``: the first family that can run it, or the ``family`` named."""
    return _plan(problem, family, "forward")


def plan_backward(problem: Problem, family: str | None = None) -> KernelPlan:
    """The backward plan for ``problem`` (the forward's shapes): the first family with a
    backward kernel that can run it, or the ``family`` named."""
    return _plan(problem, family, "backward")


# Planning is pure, and a model plans the same few problems on every call: a memo of the
# answers (the key adds each family's planning knobs) takes ~50 us of Python off each call's
# host time, which at short rows is time the GPU waits for the next launch. Cleared when full
# (varlen batches bring a new longest sequence per batch).
_PLANS: dict = {}
_PLANS_MAX = 4096


def _plan(problem: Problem, family: str | None, kind: str) -> KernelPlan:
    key = (problem, family, kind, tuple(f.planning_knobs(problem) for f in families()))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan_uncached(problem, family, kind)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _plan_uncached(problem: Problem, family: str | None, kind: str) -> KernelPlan:
    if problem.dtype not in DTYPES:
        raise ValueError(f"dtype {problem.dtype!r} is not one of {DTYPES}")
    if family is not None:
        plan, reason = _plan_or_reason(get_family(family), problem, kind)
        if plan is None:
            raise NotImplementedError(
                f"kernel family {family!r} cannot run this problem's {kind}: {reason}"
            )
        return plan
    reasons = []
    for candidate in families():
        plan, reason = _plan_or_reason(candidate, problem, kind)
        if plan is not None:
            return plan
        reasons.append(f"{candidate.name}: {reason}")
    raise NotImplementedError(
        f"no kernel family can run this problem's {kind} on {problem.arch.name} "
        f"({'; '.join(reasons)})"
    )


def check_plan(plan: KernelPlan, problem: Problem) -> KernelPlan:
    """``plan`` itself, once it is known to match ``problem`` and to be implementable."""
    if not isinstance(plan, KernelPlan):
        raise TypeError(f"plan must be a cuteattn.plan.KernelPlan, got {type(plan).__name__}")
    mismatches = [
        f"{field} {planned!r} (the inputs have {actual!r})"
        for field, planned, actual in (
            ("dtype", plan.dtype, problem.dtype),
            ("head_dim", plan.option("dim", plan.head_dim), problem.head_dim),
            ("head_dim_v", plan.option("dim_v", plan.option("dim", plan.head_dim)),
             problem.head_dim_v),
            ("causal", plan.causal, problem.causal),
            ("arch", plan.arch, problem.arch.name),
        )
        if planned != actual
    ]
    family = get_family(plan.family)
    family_mismatch = family.plan_mismatch(plan, problem)
    if family_mismatch is not None:
        mismatches.append(family_mismatch)
    if mismatches:
        raise ValueError(f"plan does not match the inputs: {', '.join(mismatches)}")
    if not family.supports(problem.arch):
        raise NotImplementedError(f"kernel family {plan.family!r} does not run on {plan.arch}")
    reason = family.reject_reason(problem)
    if reason is not None:
        raise NotImplementedError(f"kernel family {plan.family!r} cannot run this problem: {reason}")
    if not family.can_implement(plan, problem.arch):
        raise ValueError(f"kernel family {plan.family!r} cannot implement {plan}")
    return plan
