"""Compile checks (no GPU): forward kernels of every family compiled with fake tensors for sm_80,
sm_90a and sm_120a, through the family registry and the planner's choices (so the 99 KB tilings
of sm_120a are compiled too), for each of the family's representative problems.

Marker ``compile``: a covering sample (each head dim of each family once per arch, both dtypes
and both causal modes on every arch), run by default. Marker ``compile_full``: every (family,
arch, head dim, causal, dtype); deselected by default, run with ``pytest -m compile_full``.
``pytest -m compile`` runs both (plans compile once per process, so the overlap is free).
"""

import dataclasses

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
def test_backward_preprocess_and_postprocess_compile(arch):
    """The preprocess per dim; the dq postprocess of fixed-length batches for each dq_accum
    layout the families use: plain rows in one chunk, padded rows in chunks (the sm90 wide
    backward's), a padded head dim, and the sm80 and sm90 backwards' fragment orders."""
    from cuteattn.runtime.compile import compile_backward_preprocess, compile_dq_postprocess

    name = arch_from_name(arch).name
    for head_dim, dtype in ((64, "bf16"), (96, "fp16"), (256, "bf16")):
        assert compile_backward_preprocess(name, dtype, head_dim) is not None
    # d192's wide backward: 96-column chunks (136: padded to 192, the second chunk partly).
    layouts = ((64, 64, 1, 0), (128, 128, 2, 8), (200, 256, 4, 8), (136, 192, 2, 8))
    for head_dim, kernel_dim, chunks, row_pad in layouts:
        assert compile_dq_postprocess(name, "bf16", head_dim, kernel_dim, chunks, row_pad)
    # The sm80 backward's dq_accum in fragment order: its first plan per head dim (40: padded
    # to 64), fixed-length.
    sm80 = get_family("sm80")
    for head_dim in (40, 64, 128, 192, 256):
        plan = plan_backward(
            Problem(
                batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=4, head_dim=head_dim,
                head_dim_v=head_dim, dtype="bf16", causal=False, arch=arch_from_name(arch),
            ),
            family="sm80",
        )
        assert compile_dq_postprocess(
            name, "bf16", head_dim, plan.head_dim, 1, 0,
            fragment_order=sm80.dq_accum_fragment_order(plan),
        ), plan
    # The sm90 backward's (d64 / d96 / d128, every tile it offers; 40: padded to 64).
    if get_family("sm90").supports(arch_from_name(arch)):
        from cuteattn.kernels.sm90.family import BACKWARD_TILES, backward_dq_chunks

        for head_dim, kernel_dim in ((40, 64), (64, 64), (96, 96), (128, 128)):
            for tile_m, _, _ in BACKWARD_TILES[kernel_dim]:
                chunks, row_pad = backward_dq_chunks(kernel_dim, tile_m)
                assert compile_dq_postprocess(
                    name, "bf16", head_dim, kernel_dim, chunks, row_pad,
                    fragment_order=("sm90", tile_m),
                ), (head_dim, tile_m)


@pytest.mark.compile
@pytest.mark.parametrize("deterministic", (False, True))
def test_backward_candidates_past_the_first_compile(deterministic):
    """The backward plans the families offer after their first (sm90: d64's 64 x 128, d128's
    80 x 128, d192's 64 x 96 with one Q / dO stage and 64 x 64 with two, d256's 64 x 48 with
    two; sm80: d64's 64 x 128), compiled once
    each: causal with the deterministic variant, else not; varlen too where the plan allows
    it."""
    compiled = []
    for family_name, arch_name, head_dim in (
        ("sm90", "sm_90a", 64), ("sm90", "sm_90a", 128), ("sm90", "sm_90a", 192),
        ("sm90", "sm_90a", 256), ("sm80", "sm_80", 64),
    ):
        family, arch = get_family(family_name), arch_from_name(arch_name)
        problem = Problem(
            batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1, head_dim=head_dim,
            head_dim_v=head_dim, dtype="fp16" if deterministic else "bf16",
            causal=deterministic, arch=arch, deterministic=deterministic,
            varlen=not deterministic,
        )
        for plan in family.backward_candidates(problem)[1:]:
            assert family.can_implement(plan, arch), plan
            assert compile_backward(plan) is not None, plan
            compiled.append((family_name, head_dim, plan.tile_m, plan.tile_n))
    assert compiled == [
        ("sm90", 64, 64, 128), ("sm90", 128, 80, 128), ("sm90", 192, 64, 96),
        ("sm90", 192, 64, 64), ("sm90", 256, 64, 48), ("sm80", 64, 64, 128),
    ]


# Soft-capping (a plan option, so its own kernels): every kernel class once per target, both
# causal modes and dtypes across the sample. (family, arch, head_dim, causal, dtype, kinds)
SOFTCAP_CASES = (
    ("sm80", "sm_80", 64, True, "bf16", ("forward", "backward")),
    ("sm80", "sm_80", 256, False, "fp16", ("forward", "backward")),
    ("sm80", "sm_120a", 128, True, "fp16", ("forward", "backward")),
    ("sm80", "sm_90a", 96, False, "bf16", ("forward", "backward")),
    ("sm90", "sm_90a", 128, True, "bf16", ("forward", "backward")),
    ("sm90", "sm_90a", 64, False, "fp16", ("forward", "backward")),
    ("sm90", "sm_90a", 256, True, "fp16", ("forward", "backward")),
)


@pytest.mark.compile
@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=lambda c: case_id(c[:5]) + "-softcap")
def test_softcap_compiles(case):
    family, arch, head_dim, causal, dtype, kinds = case
    problem = Problem(
        batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1, head_dim=head_dim,
        head_dim_v=head_dim, dtype=dtype, causal=causal, arch=arch_from_name(arch), softcap=30.0,
    )
    for kind in kinds:
        plan = (plan_forward if kind == "forward" else plan_backward)(problem, family=family)
        assert plan.option("softcap") == 30.0, plan
        compile_kernel = compile_forward if kind == "forward" else compile_backward
        assert compile_kernel(plan) is not None, plan


# The learnable sink (a forward plan option; the kernel takes the logits): each forward kernel
# class per target, packed GQA included (sm90: a short query with 8 query heads per KV head).
SINK_CASES = (
    ("sm80", "sm_80", 128, True, "bf16"),
    ("sm80", "sm_120a", 64, False, "fp16"),
    ("sm90", "sm_90a", 128, True, "fp16"),
    ("sm90", "sm_90a", 256, False, "bf16"),
)


def short_and_long_plans(family, arch, head_dim, dtype, causal, **features):
    """The forward plans of a short (1) and a long (4096) problem with 8 query heads per KV
    head (sm90: packed GQA and not, persistent or not), and the long problem."""
    plans = set()
    for seqlen in (1, 4096):
        problem = Problem(
            batch=1, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=8, heads_kv=1, head_dim=head_dim,
            head_dim_v=head_dim, dtype=dtype, causal=causal, arch=arch_from_name(arch),
            **features,
        )
        plans.add(plan_forward(problem, family=family))
    return plans, problem


@pytest.mark.compile
@pytest.mark.parametrize("case", SINK_CASES, ids=lambda c: case_id(c) + "-sink")
def test_sink_compiles(case):
    family, arch, head_dim, causal, dtype = case
    plans, _ = short_and_long_plans(family, arch, head_dim, dtype, causal, sink=True)
    for plan in plans:
        assert plan.option("sink") is True, plan
        assert compile_forward(plan) is not None, plan
    if family == "sm90":
        assert {plan.option("pack_gqa") for plan in plans} == {1, 8}


# Forwards whose caller reads no lse (a plan option: the kernel gets no lse tensor): each
# forward kernel class per target, packed GQA and persistent on sm90, and varlen.
NO_LSE_CASES = (
    ("sm80", "sm_80", 64, True, "bf16"),
    ("sm80", "sm_120a", 128, False, "fp16"),
    ("sm90", "sm_90a", 128, True, "bf16"),
    ("sm90", "sm_90a", 256, False, "fp16"),
)


@pytest.mark.compile
@pytest.mark.parametrize("case", NO_LSE_CASES, ids=lambda c: case_id(c) + "-no-lse")
def test_forward_without_lse_compiles(case):
    family, arch, head_dim, causal, dtype = case
    plans, problem = short_and_long_plans(family, arch, head_dim, dtype, causal, lse=False)
    varlen = dataclasses.replace(problem, varlen=True, batch=3)
    plans.add(plan_forward(varlen, family=family))
    for plan in plans:
        assert plan.option("lse") is False, plan
        assert compile_forward(plan) is not None, plan


# Local windows (a plan option): each kernel class per target, with a window bounded on both
# sides, on the left only and on the right only; packed GQA on sm90; the backward too.
WINDOW_CASES = (
    ("sm80", "sm_80", 128, (256, 0), "bf16"),
    ("sm80", "sm_120a", 64, (5, 17), "fp16"),
    ("sm80", "sm_90a", 256, (-1, 64), "bf16"),
    ("sm90", "sm_90a", 128, (1000, -1), "bf16"),
    ("sm90", "sm_90a", 64, (0, 0), "fp16"),
    ("sm90", "sm_90a", 256, (256, 0), "bf16"),
)


@pytest.mark.compile
@pytest.mark.parametrize(
    "case", WINDOW_CASES, ids=lambda c: f"{c[0]}-{c[1]}-d{c[2]}-window{c[3][0]}_{c[3][1]}-{c[4]}"
)
def test_window_compiles(case):
    family, arch, head_dim, window, dtype = case
    plans, problem = short_and_long_plans(family, arch, head_dim, dtype, False, window=window)
    for plan in plans:
        assert plan.option("window") == window, plan
        assert compile_forward(plan) is not None, plan
    # The backward, deterministic where the key tiles take turns at a query tile.
    backward = plan_backward(
        dataclasses.replace(problem, deterministic=head_dim != 64), family=family
    )
    assert backward.option("window") == window
    assert compile_backward(backward) is not None, backward


# Varlen (packed sequences): each target, with seqused_k, a window, a padded head dim (40);
# forward, backward (deterministic where causal), the varlen preprocess and dq postprocess.
VARLEN_CASES = (
    ("sm_80", 64, True, "bf16", False, None),
    ("sm_90a", 128, False, "fp16", True, (256, 0)),
    ("sm_90a", 40, True, "bf16", False, None),
    ("sm_120a", 256, True, "bf16", True, None),
)


@pytest.mark.compile
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{c[0]}-d{c[1]}-varlen")
def test_varlen_compiles(case):
    arch, head_dim, causal, dtype, seqused_k, window = case
    problem = Problem(
        batch=5, seqlen_q=1000, seqlen_k=3000, heads_q=8, heads_kv=2, head_dim=head_dim,
        head_dim_v=head_dim, dtype=dtype, causal=causal, arch=arch_from_name(arch),
        varlen=True, seqused_k=seqused_k, window=window,
    )
    # The planner's family (sm90 on Hopper: persistent, not packed GQA), and the sm80
    # family's there too, forward and backward.
    plan = plan_forward(problem)
    expected = "sm90" if arch == "sm_90a" else "sm80"
    assert (plan.family, plan.option("varlen")) == (expected, True), plan
    assert compile_forward(plan) is not None, plan
    if plan.family != "sm80":
        assert compile_forward(plan_forward(problem, family="sm80")) is not None
    backward = plan_backward(dataclasses.replace(problem, deterministic=causal))
    assert (backward.family, backward.option("varlen")) == (expected, True), backward
    assert compile_backward(backward) is not None, backward
    if backward.family != "sm80":
        sm80 = plan_backward(dataclasses.replace(problem, deterministic=causal), family="sm80")
        assert compile_backward(sm80) is not None, sm80
    from cuteattn.plan import get_family
    from cuteattn.runtime.compile import compile_backward_preprocess, compile_dq_postprocess

    assert compile_backward_preprocess(
        backward.arch, dtype, head_dim, varlen_rows_tile=backward.tile_m
    ) is not None
    for plan in (backward, sm80) if backward.family != "sm80" else (backward,):
        family = get_family(plan.family)
        chunks, row_pad = family.dq_accum_chunks(plan)
        for zero_kv_dims in (None, (head_dim, head_dim)):
            assert compile_dq_postprocess(
                plan.arch, dtype, head_dim, plan.head_dim, chunks, row_pad, plan.tile_m,
                zero_kv_dims=zero_kv_dims, fragment_order=family.dq_accum_fragment_order(plan),
            ) is not None


# Head dims between the kernels' (the sm90 forward pads them to the next one; the inputs keep
# their own dim): short and long problems (persistent, packed GQA) per case.
PADDED_DIM_CASES = (
    (8, True, "bf16"), (40, False, "fp16"), (80, True, "bf16"), (160, False, "bf16"),
    (248, True, "fp16"),
)


@pytest.mark.compile
@pytest.mark.parametrize("case", PADDED_DIM_CASES, ids=lambda c: f"sm90-sm_90a-d{c[0]}-padded")
def test_padded_head_dims_compile(case):
    head_dim, causal, dtype = case
    plans, problem = short_and_long_plans(None, "sm_90a", head_dim, dtype, causal)
    for plan in plans:
        assert plan.option("dim") == head_dim and plan.head_dim > head_dim, plan
        assert compile_forward(plan) is not None, plan
    backward = plan_backward(dataclasses.replace(problem, deterministic=causal))
    assert backward.option("dim") == head_dim, backward
    assert compile_backward(backward) is not None, backward


# The sm80 family pads the same way (chunks past the inputs' columns skipped, zeros in shared
# memory): forward and backward per arch, one case packed (varlen).
SM80_PADDED_DIM_CASES = (
    ("sm_80", 8, True, "bf16", False),
    ("sm_90a", 40, False, "fp16", True),
    ("sm_120a", 80, True, "fp16", False),
    ("sm_80", 160, False, "bf16", False),
    ("sm_120a", 248, True, "bf16", True),
)


@pytest.mark.compile
@pytest.mark.parametrize(
    "case", SM80_PADDED_DIM_CASES,
    ids=lambda c: f"sm80-{c[0]}-d{c[1]}-padded" + ("-varlen" if c[4] else ""),
)
def test_sm80_padded_head_dims_compile(case):
    arch, head_dim, causal, dtype, varlen = case
    problem = Problem(
        batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=8, heads_kv=2, head_dim=head_dim,
        head_dim_v=head_dim, dtype=dtype, causal=causal, arch=arch_from_name(arch),
        varlen=varlen,
    )
    plan = plan_forward(problem, family="sm80")
    assert (plan.option("dim"), plan.option("varlen")) == (head_dim, varlen or None), plan
    assert compile_forward(plan) is not None, plan
    backward = plan_backward(dataclasses.replace(problem, deterministic=causal), family="sm80")
    assert backward.option("dim") == head_dim and backward.head_dim > head_dim, backward
    assert compile_backward(backward) is not None, backward


# (dim, dim_v) = (192, 128), MLA-style: forward and backward per arch.
DIM_V_CASES = (("sm_80", True, "bf16", False), ("sm_90a", False, "fp16", True),
               ("sm_120a", True, "bf16", True))


@pytest.mark.compile
@pytest.mark.parametrize("case", DIM_V_CASES, ids=lambda c: f"{c[0]}-d192-v128")
def test_dim_v_compiles(case):
    arch, causal, dtype, deterministic = case
    problem = Problem(
        batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=8, heads_kv=2, head_dim=192,
        head_dim_v=128, dtype=dtype, causal=causal, arch=arch_from_name(arch),
        deterministic=deterministic,
    )
    # The forward: the sm90 family's on Hopper (and the sm80 family's there too); the
    # backward: the sm80 family's everywhere.
    plan = plan_forward(problem)
    expected = "sm90" if arch == "sm_90a" else "sm80"
    assert (plan.family, plan.option("dim_v")) == (expected, 128), plan
    assert compile_forward(plan) is not None, plan
    if plan.family != "sm80":
        assert compile_forward(plan_forward(problem, family="sm80")) is not None
    backward = plan_backward(problem)
    assert (backward.family, backward.option("dim_v")) == (expected, 128), backward
    assert compile_backward(backward) is not None, backward
    if backward.family != "sm80":
        assert compile_backward(plan_backward(problem, family="sm80")) is not None
    from cuteattn.runtime.compile import compile_backward_preprocess

    assert compile_backward_preprocess(backward.arch, dtype, 128) is not None


# Persistent sm90 forwards with no room for an O buffer of their own (d192, d256), fixed-length
# and packed: O in V's stages (the planner's tiles), or in Q's buffer (d256 with one stage of
# 112 keys: the only tiles left where V's stages are too small).
SHARED_O_CASES = (
    (192, True, False, None, "v"), (256, False, False, None, "v"), (256, True, True, None, "v"),
    (256, False, False, (300, 0), "v"), (256, False, True, None, "q"),
    (256, True, False, None, "q"),
)


@pytest.mark.compile
@pytest.mark.parametrize(
    "case", SHARED_O_CASES, ids=lambda c: f"sm90-sm_90a-d{c[0]}-o-in-{c[4]}"
)
def test_persistent_forward_without_an_o_buffer_compiles(case):
    from cuteattn.kernels.sm90 import tiling

    head_dim, causal, varlen, window, o_buffer = case
    arch = arch_from_name("sm_90a")
    problem = Problem(
        batch=3, seqlen_q=1500, seqlen_k=700, heads_q=8, heads_kv=2, head_dim=head_dim,
        head_dim_v=head_dim, dtype="bf16", causal=causal, arch=arch, varlen=varlen,
        window=window,
    )
    plan = plan_forward(problem, family="sm90")
    options = tuple((name, True if name == "persistent" else v) for name, v in plan.options)
    plan = dataclasses.replace(plan, options=options)
    if o_buffer == "q":
        plan = dataclasses.replace(plan, tile_n=112, num_stages=1)
    assert get_family("sm90").can_implement(plan, arch), plan
    assert not tiling.separate_o_fits(
        head_dim, plan.tile_m, plan.tile_n, plan.num_stages, arch.smem_per_block
    )
    assert tiling.o_in_v_fits(plan.tile_m, plan.tile_n, plan.num_stages) == (o_buffer == "v")
    assert compile_forward(plan) is not None, plan


# The sm90 forward's tuning options that are off in every default plan (tune_sm90 times them):
# descriptors held in registers (d64 two Q stages, d128 causal dynamic, d256 O in V, varlen),
# O rescaled before the next P V.
TUNING_OPTION_CASES = (
    (64, False, False, {"hold_descriptors": True}),
    (128, True, False, {"hold_descriptors": True}),
    (256, False, False, {"hold_descriptors": True}),
    (128, False, True, {"hold_descriptors": True, "rescale_before_pv": True}),
)


@pytest.mark.compile
@pytest.mark.parametrize(
    "case", TUNING_OPTION_CASES,
    ids=lambda c: f"sm90-sm_90a-d{c[0]}-{'causal' if c[1] else 'full'}"
    + ("-varlen" if c[2] else "") + "-" + "-".join(c[3]),
)
def test_forward_tuning_options_compile(case):
    head_dim, causal, varlen, extra = case
    arch = arch_from_name("sm_90a")
    problem = Problem(
        batch=2, seqlen_q=4096, seqlen_k=4096, heads_q=8, heads_kv=8, head_dim=head_dim,
        head_dim_v=head_dim, dtype="bf16", causal=causal, arch=arch, varlen=varlen,
    )
    plan = plan_forward(problem, family="sm90")
    plan = dataclasses.replace(plan, options=tuple(sorted((dict(plan.options) | extra).items())))
    assert get_family("sm90").can_implement(plan, arch), plan
    assert compile_forward(plan) is not None, plan


# The sm90 backward with its descriptors held in registers (a tuning option): d64-d128 and
# the wide kernels (d192's dK / dV split the keys, d256's the head dim).
BACKWARD_HELD_CASES = (
    (64, True, False), (96, False, False), (128, False, True), (192, False, False),
    (256, True, False),
)


@pytest.mark.compile
@pytest.mark.parametrize(
    "case", BACKWARD_HELD_CASES,
    ids=lambda c: f"sm90-sm_90a-d{c[0]}-{'causal' if c[1] else 'full'}"
    + ("-deterministic" if c[2] else "") + "-held",
)
def test_backward_with_held_descriptors_compiles(case):
    head_dim, causal, deterministic = case
    arch = arch_from_name("sm_90a")
    problem = Problem(
        batch=2, seqlen_q=4096, seqlen_k=4096, heads_q=8, heads_kv=2, head_dim=head_dim,
        head_dim_v=head_dim, dtype="bf16", causal=causal, arch=arch,
        deterministic=deterministic,
    )
    plan = plan_backward(problem, family="sm90")
    options = tuple(sorted(dict(plan.options, hold_descriptors=True).items()))
    plan = dataclasses.replace(plan, options=options)
    assert get_family("sm90").can_implement(plan, arch), plan
    assert compile_backward(plan) is not None, plan


def test_ptxas_options_join_the_compile_options():
    """``CUTEATTN_PTXAS_OPTIONS`` (benchmarks) reaches ``cute.compile`` as --ptxas-options;
    unset, the options are the defaults."""
    from cuteattn.runtime.compile import compile_options

    assert compile_options("sm_90a") == "--enable-tvm-ffi --gpu-arch sm_90a"
    assert compile_options("sm_90a", "-O2") == (
        "--enable-tvm-ffi --gpu-arch sm_90a --ptxas-options '-O2'"
    )
    with pytest.raises(ValueError, match="CUTEATTN_PTXAS_OPTIONS"):
        compile_options("sm_90a", "-O2 '")
