"""Compile checks (no GPU): forward kernels of every family compiled with fake tensors for sm_80,
sm_90a and sm_120a, through the family registry and the planner's choices (so the 99 KB tilings
of sm_120a are compiled too), for each of the family's representative problems.

Marker ``compile``: a covering sample (each head dim of each family once per arch, both dtypes
and both causal modes on every arch), run by default. Marker ``compile_full``: every (family,
arch, head dim, causal, dtype); deselected by default, run with ``pytest -m compile_full``.
``pytest -m compile`` runs both (plans compile once per process, so the overlap is free).
"""

import pytest

from cuteattn.arch import arch_from_name
from cuteattn.plan import Problem, families, get_family, plan_backward, plan_forward
from cuteattn.runtime.compile import compile_backward, compile_forward

TARGETS = ("sm_80", "sm_90a", "sm_120a")
DTYPES = ("bf16", "fp16")


def full_matrix():
    for arch in TARGETS:
        for family in families():
            if not family.supports(arch_from_name(arch)):
                continue
            for head_dim in family.head_dims:
                for causal in (False, True):
                    for dtype in DTYPES:
                        yield family.name, arch, head_dim, causal, dtype


def covering_sample():
    """Head dim j of a family on target i: causal when j is odd, dtype alternating every two
    head dims (shifted per target), so each arch sees all four (causal, dtype) pairs."""
    for i, arch in enumerate(TARGETS):
        for family in families():
            if not family.supports(arch_from_name(arch)):
                continue
            for j, head_dim in enumerate(family.head_dims):
                yield family.name, arch, head_dim, j % 2 == 1, DTYPES[(j // 2 + i) % 2]


def case_id(case):
    family, arch, head_dim, causal, dtype = case
    return f"{family}-{arch}-d{head_dim}-{'causal' if causal else 'full'}-{dtype}"


def planned(family, arch, head_dim, causal, dtype) -> list:
    """The distinct plans the planner picks with ``family`` forced on ``arch``, over the family's
    representative problems (a choice may depend on sizes, e.g. persistence on short queries)."""
    caps = arch_from_name(arch)
    plans = []
    for problem in get_family(family).representative_problems(
        dtype=dtype, head_dim=head_dim, causal=causal, arch=caps
    ):
        plan = plan_forward(problem, family=family)
        if plan not in plans:
            plans.append(plan)
    return plans


def compile_case(family, arch, head_dim, causal, dtype):
    plans = planned(family, arch, head_dim, causal, dtype)
    assert plans and all((p.family, p.arch) == (family, arch_from_name(arch).name) for p in plans)
    for plan in plans:
        assert compile_forward(plan) is not None, plan


def test_sample_covers_every_head_dim_dtype_and_mode_per_arch():
    sample = list(covering_sample())
    for arch in TARGETS:
        for family in families():
            if not family.supports(arch_from_name(arch)):
                continue
            cases = [c for c in sample if c[:2] == (family.name, arch)]
            assert sorted(c[2] for c in cases) == sorted(family.head_dims)
            if len(family.head_dims) >= 4:
                assert {(c[3], c[4]) for c in cases} == {(a, b) for a in (False, True) for b in DTYPES}
    assert set(sample) <= set(full_matrix())


@pytest.mark.compile
@pytest.mark.parametrize("case", list(covering_sample()), ids=case_id)
def test_forward_compiles(case):
    compile_case(*case)


@pytest.mark.compile
@pytest.mark.compile_full
@pytest.mark.parametrize("case", list(full_matrix()), ids=case_id)
def test_forward_compiles_full_matrix(case):
    compile_case(*case)


def backward_cases(cases):
    """The (family, arch, ...) cases of families that have a backward kernel."""
    return [case for case in cases if get_family(case[0]).has_backward]


def compile_backward_case(family, arch, head_dim, causal, dtype):
    """Both backward variants the family has for the case: dq by plain atomics, and in
    key-tile order (deterministic). sm90's backward covers head dims up to 128, the sm80 one
    every case."""
    compiled = 0
    for deterministic in (False, True):
        problem = Problem(
            batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1, head_dim=head_dim,
            head_dim_v=head_dim, dtype=dtype, causal=causal, arch=arch_from_name(arch),
            deterministic=deterministic,
        )
        try:
            plan = plan_backward(problem, family=family)
        except NotImplementedError:
            assert family != "sm80", (family, arch, head_dim, deterministic)
            continue
        assert plan.kind == "backward" and plan.arch == arch_from_name(arch).name
        assert compile_backward(plan) is not None, plan
        compiled += 1
    assert compiled or head_dim > 128, (family, arch, head_dim)


@pytest.mark.compile
@pytest.mark.parametrize("case", backward_cases(covering_sample()), ids=case_id)
def test_backward_compiles(case):
    compile_backward_case(*case)


@pytest.mark.compile
@pytest.mark.compile_full
@pytest.mark.parametrize("case", backward_cases(full_matrix()), ids=case_id)
def test_backward_compiles_full_matrix(case):
    compile_backward_case(*case)


@pytest.mark.compile
@pytest.mark.parametrize("arch", TARGETS)
def test_backward_preprocess_compiles(arch):
    from cuteattn.runtime.compile import compile_backward_preprocess

    for head_dim, dtype in ((64, "bf16"), (96, "fp16"), (256, "bf16")):
        assert compile_backward_preprocess(arch_from_name(arch).name, dtype, head_dim) is not None
