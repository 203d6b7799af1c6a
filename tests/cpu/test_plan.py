"""Planner: the family registry, choices per arch, shared-memory fit, forced families, errors, and
a golden snapshot of whole plans (the compile keys)."""

import dataclasses

import pytest

from cuteattn.arch import KNOWN_ARCHS, arch_from_name
from cuteattn.kernels.family import KernelFamily
from cuteattn.kernels.sm80.forward import FlashForwardSm80
from cuteattn.kernels.sm80.tiling import SUPPORTED_HEAD_DIMS
from cuteattn.plan import (
    FAMILY_MODULES,
    KernelPlan,
    Problem,
    check_plan,
    families,
    family_names,
    get_family,
    plan_backward,
    plan_forward,
)

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_120a")


def problem(head_dim=128, causal=False, arch="sm_90a", **overrides):
    fields = dict(
        batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=8, heads_kv=2, head_dim=head_dim,
        head_dim_v=head_dim, dtype="bf16", causal=causal,
        arch=arch_from_name(arch) if isinstance(arch, str) else arch,
    )
    fields.update(overrides)
    return Problem(**fields)


def sm90_plan(
    *, persistent=False, pingpong=True, pack_gqa=1, dynamic=False, one_q_stage=False, **fields
):
    options = (("pack_gqa", pack_gqa), ("persistent", persistent), ("pingpong", pingpong))
    options += (("q_stages", 1),) if one_q_stage else ()
    # d64 rescales O at every key tile (``default_eager_rescale``) and holds its GEMM
    # descriptors in registers (``default_hold_descriptors``).
    if fields.get("head_dim", 128) <= 64:
        options += (("eager_rescale", True), ("hold_descriptors", True))
    base = dict(
        family="sm90", arch="sm_90a", dtype="bf16", head_dim=128, causal=False, tile_m=128,
        tile_n=128, num_threads=384, num_stages=2,
        options=tuple(sorted(((("dynamic", True),) if dynamic else ()) + options)),
    )
    base.update(fields)
    return KernelPlan(**base)


def sm80_plan(**fields):
    base = dict(
        family="sm80", arch="sm_90a", dtype="bf16", head_dim=128, causal=False, tile_m=128,
        tile_n=64, num_threads=128,
    )
    base.update(fields)
    return KernelPlan(**base)


def test_registry_lists_existing_families_in_preference_order():
    names = family_names()
    assert "sm80" in names
    assert all(isinstance(family, KernelFamily) for family in families())
    order = [m.rsplit(".", 2)[-2] for m in FAMILY_MODULES]
    assert list(names) == [name for name in order if name in names]
    assert get_family("sm80").name == "sm80"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_sm80_plan_is_implementable_and_fits(arch, causal, head_dim):
    caps = arch_from_name(arch)
    plan = plan_forward(problem(head_dim, causal, arch), family="sm80")
    assert plan.family == "sm80" and plan.arch == caps.name
    assert get_family("sm80").can_implement(plan, caps)
    assert FlashForwardSm80.can_implement(
        head_dim, plan.tile_m, plan.tile_n, plan.num_threads, caps.smem_per_block
    )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_default_plan_comes_from_the_first_family_that_runs(arch, head_dim):
    caps = arch_from_name(arch)
    plan = plan_forward(problem(head_dim, True, arch))
    first = next(f for f in families() if f.supports(caps) and f.choose(problem(head_dim, True, arch)))
    assert plan.family == first.name
    assert get_family(plan.family).can_implement(plan, caps)


@pytest.mark.parametrize("family", family_names())
def test_plan_ignores_runtime_sizes(family):
    """Sizes are runtime values: one compiled kernel serves every batch, head count and key
    length. The query length may only pick a variant (sm90: persistent for short queries), and
    the query heads per KV head may only pick packed GQA (sm90)."""
    for seqlen_q in (1, 1000, 16384):
        small = plan_forward(
            problem(batch=1, seqlen_q=seqlen_q, seqlen_k=1, heads_q=8, heads_kv=1), family=family
        )
        large = plan_forward(
            problem(batch=64, seqlen_q=seqlen_q, seqlen_k=4097, heads_q=64, heads_kv=8),
            family=family,
        )
        assert small == large


def test_sm80_plan_ignores_every_size():
    small = plan_forward(problem(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1), "sm80")
    large = plan_forward(problem(batch=64, seqlen_q=16384, seqlen_k=4097), "sm80")
    assert small == large


def test_plans_are_hashable_cache_keys():
    plans = {plan_forward(problem(d, c)) for d in SUPPORTED_HEAD_DIMS for c in (False, True)}
    assert len(plans) == 2 * len(SUPPORTED_HEAD_DIMS)


@pytest.mark.parametrize("head_dim", (8, 32, 40, 72, 160, 248))
def test_head_dims_between_the_kernels(head_dim):
    """Both families pad a head dim between their kernels' to the next one (plan option
    ("dim", d)), forward and backward, on every arch they run on."""
    kernel_dim = min(d for d in (64, 96, 128, 192, 256) if d >= head_dim)
    plan = plan_forward(problem(head_dim=head_dim))
    assert (plan.family, plan.head_dim, plan.option("dim")) == ("sm90", kernel_dim, head_dim)
    assert check_plan(plan, problem(head_dim=head_dim)) is plan
    for arch, family in (("sm_90a", "sm80"), ("sm_80", None), ("sm_120a", None)):
        sm80 = plan_forward(problem(head_dim=head_dim, arch=arch), family=family)
        assert (sm80.family, sm80.head_dim, sm80.option("dim")) == ("sm80", kernel_dim, head_dim)
        assert check_plan(sm80, problem(head_dim=head_dim, arch=arch)) is sm80
        assert sm80.options == tuple(sorted(sm80.options))
        backward = plan_backward(problem(head_dim=head_dim, arch=arch), family=family)
        assert (backward.head_dim, backward.option("dim")) == (kernel_dim, head_dim)
        assert backward.option("deterministic") is False
    backward = plan_backward(problem(head_dim=head_dim))
    assert (backward.head_dim, backward.option("dim")) == (kernel_dim, head_dim)
    assert check_plan(backward, problem(head_dim=head_dim)) is backward


@pytest.mark.parametrize("head_dim", (4, 12, 260))
def test_head_dims_no_kernel_pads_to(head_dim):
    with pytest.raises((NotImplementedError, ValueError), match="head_dim|head dim"):
        plan_forward(problem(head_dim=head_dim, arch="sm_80"))


def test_unsupported_requests():
    with pytest.raises(NotImplementedError, match=r"dim_v 64 with head_dim 128: .*\(192, 128\)"):
        plan_forward(problem(head_dim=128, head_dim_v=64))
    with pytest.raises(ValueError, match="dtype 'fp32'"):
        plan_forward(problem(dtype="fp32"))


@pytest.mark.parametrize("sizes", ({"batch": 65536}, {"heads_q": 65536, "heads_kv": 1}))
def test_sm80_grid_limits(sizes):
    """The sm80 family puts heads and batch on grid y and z, which CUDA caps at 65535."""
    with pytest.raises(NotImplementedError, match=r"must each be <= 65535"):
        plan_forward(problem(**sizes), family="sm80")
    plan_forward(problem(batch=65535, heads_q=65535, heads_kv=5), family="sm80")


def test_forced_family():
    plan = plan_forward(problem(128, True, "sm_120a"), family="sm80")
    assert (plan.family, plan.arch) == ("sm80", "sm_120a")


def test_forced_unknown_family_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown kernel family 'sm70' \(known: .*sm80"):
        plan_forward(problem(), family="sm70")
    with pytest.raises(ValueError, match=r"unknown kernel family"):
        get_family("")


def test_forced_family_that_does_not_run_on_the_arch():
    class NeedsWgmma(KernelFamily):
        name = "wgmma-only"
        head_dims = SUPPORTED_HEAD_DIMS

        def supports(self, arch):
            return arch.wgmma

        def candidates(self, problem):
            return (sm80_plan(family=self.name, arch=problem.arch.name),)

        def can_implement(self, plan, arch):
            return True

        def kernel(self, plan):
            raise AssertionError("not compiled here")

    family = NeedsWgmma()
    from cuteattn import plan as plan_module

    assert plan_module._plan_or_reason(family, problem(arch="sm_80"))[1] == "does not run on sm_80"
    assert plan_module._plan_or_reason(family, problem(arch="sm_90a"))[0].family == "wgmma-only"


def test_no_tiling_fits_is_reported():
    tiny = dataclasses.replace(arch_from_name("sm_80"), name="sm_tiny", smem_per_block=8 * 1024)
    with pytest.raises(NotImplementedError, match=r"no tiling of head_dim 128 fits sm_tiny's 8 KB"):
        plan_forward(problem(arch=tiny), family="sm80")


def test_plan_options_are_canonical():
    plan = sm80_plan(options=(("a", 1), ("b", True)))
    assert plan.option("b") is True and plan.option("c", 7) == 7
    with pytest.raises(ValueError, match="unique and sorted"):
        sm80_plan(options=(("b", 1), ("a", 2)))
    with pytest.raises(TypeError, match="pairs"):
        sm80_plan(options=("a",))


def test_check_plan_accepts_the_planned_plan():
    prob = problem(64, True)
    plan = plan_forward(prob, family="sm80")
    assert check_plan(plan, prob) is plan


@pytest.mark.parametrize(
    "change,message",
    [
        ({"dtype": "fp16"}, r"dtype 'fp16' \(the inputs have 'bf16'\)"),
        ({"head_dim": 64}, r"head_dim 64 \(the inputs have 128\)"),
        ({"causal": True}, r"causal True \(the inputs have False\)"),
        ({"arch": "sm_80"}, r"arch 'sm_80' \(the inputs have 'sm_90a'\)"),
    ],
)
def test_check_plan_rejects_a_plan_for_other_inputs(change, message):
    with pytest.raises(ValueError, match=message):
        check_plan(sm80_plan(**change), problem(128, False))


def test_check_plan_rejects_unimplementable_plans():
    with pytest.raises(ValueError, match=r"cannot implement"):
        check_plan(sm80_plan(tile_m=100), problem())
    with pytest.raises(ValueError, match=r"cannot implement"):
        check_plan(sm80_plan(num_stages=2), problem())
    with pytest.raises(ValueError, match=r"unknown kernel family"):
        check_plan(sm80_plan(family="nope"), problem())
    with pytest.raises(TypeError, match=r"KernelPlan"):
        check_plan((128, 64, 128), problem())
    with pytest.raises(NotImplementedError, match=r"must each be <= 65535"):
        check_plan(sm80_plan(), problem(batch=70000))


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_plan_covers_each_arch_choice_once(head_dim, causal):
    family = get_family("sm80")
    h200 = arch_from_name("sm_90a")
    plans = family.every_plan(dtype="fp16", head_dim=head_dim, causal=causal, run_on=h200)
    assert len(plans) == len(set(plans)) >= 1
    assert all(p.arch == "sm_90a" and family.can_implement(p, h200) for p in plans)
    chosen = {
        dataclasses.replace(plan_forward(problem(head_dim, causal, caps.name, dtype="fp16"),
                                         family="sm80"), arch="sm_90a")
        for caps in KNOWN_ARCHS.values()
    }
    assert set(plans) == chosen
    # A 99 KB machine cannot run the 163/227 KB tiles: they are left out there.
    small = family.every_plan(
        dtype="fp16", head_dim=head_dim, causal=causal, run_on=arch_from_name("sm_86")
    )
    assert all(family.can_implement(p, arch_from_name("sm_86")) for p in small)


# Golden compile keys: a change of plan must show up here as a reviewed diff. Keys are
# (arch, head_dim, causal, dtype, forced family or None for the planner's own choice, seqlen of
# q and k: the sm90 family makes short queries persistent).
GOLDEN = {
    ("sm_80", 64, False, "bf16", None, 1000): sm80_plan(arch="sm_80", head_dim=64, tile_n=128),
    ("sm_80", 192, True, "fp16", None, 1000): sm80_plan(
        arch="sm_80", dtype="fp16", head_dim=192, causal=True, num_threads=256
    ),
    ("sm_86", 64, False, "bf16", None, 1000): sm80_plan(arch="sm_86", head_dim=64, tile_n=128),
    ("sm_86", 192, False, "bf16", None, 1000): sm80_plan(arch="sm_86", head_dim=192, num_threads=256),
    ("sm_86", 256, True, "fp16", None, 1000): sm80_plan(
        arch="sm_86", dtype="fp16", head_dim=256, causal=True, tile_m=64
    ),
    # The planner's own choice on Hopper: the sm90 family.
    # d128 without a mask keeps one Q stage where two would fit.
    ("sm_90a", 128, False, "bf16", None, 1000): sm90_plan(persistent=True, one_q_stage=True),
    # Short queries with 4 query heads per KV head (problem()'s 8 / 2): packed GQA.
    ("sm_90a", 128, False, "bf16", None, 1): sm90_plan(
        persistent=True, pack_gqa=4, one_q_stage=True
    ),
    ("sm_90a", 64, True, "bf16", None, 40): sm90_plan(
        head_dim=64, causal=True, persistent=True, pack_gqa=4
    ),
    # d64 causal: 128-row tiles for short queries, 192 rows (three consumer warpgroups) long.
    # Causal with more than two query tiles: the tiles handed out dynamically.
    ("sm_90a", 64, True, "bf16", None, 1000): sm90_plan(
        head_dim=64, causal=True, persistent=True, dynamic=True
    ),
    ("sm_90a", 64, True, "bf16", None, 16384): sm90_plan(
        head_dim=64, causal=True, persistent=True, tile_m=192, num_threads=512, dynamic=True
    ),
    ("sm_90a", 64, False, "bf16", None, 16384): sm90_plan(
        head_dim=64, persistent=True, tile_m=192, num_threads=512
    ),
    # d128 causal past 8k queries: the static stride (measured faster at 16k).
    ("sm_90a", 128, True, "bf16", None, 8192): sm90_plan(
        causal=True, persistent=True, dynamic=True
    ),
    ("sm_90a", 128, True, "bf16", None, 16384): sm90_plan(causal=True, persistent=True),
    # d192 / d256: persistent with O in V's stages; short queries take the narrower key tiles.
    ("sm_90a", 192, False, "bf16", None, 1000): sm90_plan(
        head_dim=192, tile_n=96, pingpong=False, persistent=True
    ),
    ("sm_90a", 192, False, "bf16", None, 16384): sm90_plan(
        head_dim=192, tile_n=112, pingpong=False, persistent=True
    ),
    ("sm_90a", 192, True, "bf16", None, 1000): sm90_plan(
        head_dim=192, causal=True, tile_n=96, pingpong=False, persistent=True, dynamic=True
    ),
    ("sm_90a", 192, True, "bf16", None, 4096): sm90_plan(
        head_dim=192, causal=True, tile_n=112, pingpong=False
    ),
    ("sm_90a", 256, False, "bf16", None, 1000): sm90_plan(
        head_dim=256, tile_n=64, pingpong=False, persistent=True
    ),
    ("sm_90a", 256, False, "bf16", None, 16384): sm90_plan(
        head_dim=256, tile_n=80, pingpong=False, persistent=True
    ),
    ("sm_90a", 256, True, "fp16", None, 1000): sm90_plan(
        dtype="fp16", head_dim=256, causal=True, tile_n=64, pingpong=False, persistent=True,
        dynamic=True,
    ),
    ("sm_90a", 256, True, "fp16", None, 16384): sm90_plan(
        dtype="fp16", head_dim=256, causal=True, tile_n=64, pingpong=False
    ),
    ("sm_90a", 64, False, "bf16", "sm80", 1000): sm80_plan(head_dim=64, tile_n=128),
    ("sm_90a", 64, True, "bf16", "sm80", 1000): sm80_plan(head_dim=64, causal=True),
    ("sm_90a", 96, False, "fp16", "sm80", 1000): sm80_plan(dtype="fp16", head_dim=96),
    ("sm_90a", 128, False, "bf16", "sm80", 1000): sm80_plan(),
    ("sm_90a", 128, True, "bf16", "sm80", 1000): sm80_plan(causal=True),
    ("sm_90a", 192, False, "bf16", "sm80", 1000): sm80_plan(head_dim=192, num_threads=256),
    ("sm_90a", 256, False, "bf16", "sm80", 1000): sm80_plan(head_dim=256, tile_m=64),
    ("sm_90a", 256, True, "fp16", "sm80", 1000): sm80_plan(
        dtype="fp16", head_dim=256, causal=True, tile_m=64
    ),
    ("sm_120a", 64, False, "bf16", None, 1000): sm80_plan(arch="sm_120a", head_dim=64, tile_n=128),
    ("sm_120a", 128, True, "bf16", None, 1000): sm80_plan(arch="sm_120a", causal=True),
    ("sm_120a", 192, True, "fp16", None, 1000): sm80_plan(
        arch="sm_120a", dtype="fp16", head_dim=192, causal=True, num_threads=256
    ),
    ("sm_120a", 256, False, "bf16", None, 1000): sm80_plan(arch="sm_120a", head_dim=256, tile_m=64),
}


@pytest.mark.parametrize("key", sorted(GOLDEN, key=str), ids=str)
def test_golden_plans(key):
    arch, head_dim, causal, dtype, family, seqlen = key
    prob = problem(head_dim, causal, arch, dtype=dtype, seqlen_q=seqlen, seqlen_k=seqlen)
    assert plan_forward(prob, family=family) == GOLDEN[key]


def test_can_implement_requires_whole_copy_passes():
    # 256 threads copy 32 rows of a d256 tile per pass: a 16-row key tile cannot be copied.
    assert not FlashForwardSm80.can_implement(256, 128, 16, 256, 227 * 1024)
    assert FlashForwardSm80.can_implement(256, 128, 32, 256, 227 * 1024)
    assert not FlashForwardSm80.can_implement(256, 128, 128, 256, 99 * 1024)  # 192 KB


@pytest.mark.parametrize(
    "seqlen_q,heads_q,heads_kv,tile_m,expected",
    [
        (1, 8, 8, 128, False),  # MHA: nothing to pack
        (1, 8, 1, 128, True),  # decode, MQA: 8 rows used instead of 1
        (1, 32, 8, 128, True),
        (40, 8, 2, 128, True),  # 160 of 256 rows used packed (2 tiles), 40 of 128 unpacked
        (100, 8, 2, 128, False),  # 400 / 512 packed vs 100 / 128: not worth it
        (1000, 32, 4, 128, False),  # long queries fill their tiles
        (1, 256, 1, 128, False),  # a group larger than a tile
        (7, 28, 4, 128, True),  # a group of 7: 18 positions per tile, 2 rows idle
    ],
)
def test_should_pack_gqa(seqlen_q, heads_q, heads_kv, tile_m, expected):
    from cuteattn.kernels.sm90.family import should_pack_gqa

    assert should_pack_gqa(seqlen_q, heads_q, heads_kv, tile_m) is expected


def test_packed_plan_must_match_the_head_group():
    packed = sm90_plan(persistent=True, pack_gqa=4)
    check_plan(packed, problem(seqlen_q=1, seqlen_k=1))  # 8 / 2 heads: a group of 4
    with pytest.raises(ValueError, match="pack_gqa 4"):
        check_plan(packed, problem(seqlen_q=1, seqlen_k=1, heads_q=8, heads_kv=1))
    assert not get_family("sm90").can_implement(
        sm90_plan(pack_gqa=129), arch_from_name("sm_90a")
    )


@pytest.mark.parametrize("family,arch", [("sm80", "sm_80"), ("sm90", "sm_90a")])
def test_backward_plans_carry_the_deterministic_switch(family, arch):
    for deterministic in (False, True):
        call = problem(deterministic=deterministic, arch=arch)
        plan = plan_backward(call, family=family)
        assert (plan.family, plan.kind) == (family, "backward")
        assert dict(plan.options).pop("deterministic") == deterministic
        # The one other option a backward plan may carry: the sm90 family holds its GEMM
        # descriptors up to d128 (``default_hold_descriptors``).
        held = family == "sm90"
        assert plan.options == tuple(sorted(
            (("deterministic", deterministic),) + ((("hold_descriptors", True),) if held else ())
        ))
        check_plan(plan, call)
        with pytest.raises(ValueError, match=r"deterministic"):
            check_plan(plan, problem(deterministic=not deterministic, arch=arch))
    forward = plan_forward(problem(deterministic=True, arch=arch), family=family)
    assert "deterministic" not in dict(forward.options)  # the forward is deterministic already


def test_hopper_deterministic_backward_tile():
    """Deterministic d128 runs 64 query rows per step like the rest (two dQ buffers per
    warpgroup, each with its own writer warp, hide the wait of each step's dQ addition for
    the previous key tile's); it fits shared memory with the second buffers."""
    def tile_m(**kwargs):
        return plan_backward(problem(128, **kwargs)).tile_m

    for kwargs in ({}, {"causal": True}, {"window": (256, 0)}):
        assert tile_m(deterministic=True, **kwargs) == tile_m(deterministic=False, **kwargs) == 64
    assert plan_backward(problem(64, deterministic=True)).tile_m == 128
    assert plan_backward(problem(128, deterministic=True, arch="sm_80")).family == "sm80"


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_hopper_backward_family(head_dim):
    """sm90's backward takes every head dim, deterministic or not: 128 keys per CTA up to
    d128 (128 queries per step at d64, else 64), 96 at d192 (two Q stages, one dO stage) and 64
    at d256 (one stage): the wide variant, sized to shared memory."""
    plan = plan_backward(problem(head_dim))
    assert (plan.kind, plan.family) == ("backward", "sm90")
    assert plan_backward(problem(head_dim, deterministic=True)).family == "sm90"
    assert plan_backward(problem(head_dim, arch="sm_80")).family == "sm80"
    tile_m, tile_n, stages = {64: (128, 128, 2), 192: (64, 96, 2), 256: (64, 64, 1)}.get(
        head_dim, (64, 128, 2)
    )
    assert (plan.tile_m, plan.tile_n, plan.num_threads, plan.num_stages) == (
        tile_m, tile_n, 384, stages
    )
    with pytest.raises(ValueError, match=r"deterministic"):
        check_plan(plan, problem(head_dim, deterministic=True))
    from cuteattn.kernels.sm90.family import backward_smem_bytes

    assert backward_smem_bytes(head_dim, tile_m, tile_n, stages) <= arch_from_name(
        "sm_90a"
    ).smem_per_block


@pytest.mark.parametrize("family,arch", [("sm80", "sm_80"), ("sm80", "sm_90a"), ("sm90", "sm_90a")])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_plans_carry_the_softcap_value(family, arch, head_dim):
    """softcap is a compile-time value: an option of forward and backward plans of every family
    (sorted among the family's own), absent when off; the plan is implementable either way."""
    for softcap in (0.0, 30.0):
        base = problem(head_dim=head_dim, causal=True, arch=arch, softcap=softcap)
        for plan in (plan_forward(base, family=family), plan_backward(base, family=family)):
            assert plan.option("softcap") == (softcap or None)
            names = [name for name, _ in plan.options]
            assert names == sorted(names)
            assert get_family(family).can_implement(plan, arch_from_name(arch))
            assert check_plan(plan, base) is plan


def test_softcap_plans_are_distinct_keys_and_checked():
    capped = plan_forward(problem(softcap=30.0))
    assert capped != plan_forward(problem(softcap=50.0)) and capped != plan_forward(problem())
    with pytest.raises(ValueError, match=r"softcap 30.0 \(the call asks for 50.0\)"):
        check_plan(capped, problem(softcap=50.0))
    with pytest.raises(ValueError, match=r"softcap"):
        check_plan(plan_forward(problem()), problem(softcap=30.0))
    family = get_family(capped.family)
    for bad in (-1.0, 0.0, float("inf"), 30):
        options = tuple((n, bad if n == "softcap" else v) for n, v in capped.options)
        assert not family.can_implement(
            dataclasses.replace(capped, options=options), arch_from_name("sm_90a")
        )


@pytest.mark.parametrize("family,arch", [("sm80", "sm_80"), ("sm90", "sm_90a")])
def test_forward_plans_carry_the_sink_switch_and_backward_plans_do_not(family, arch):
    call = problem(arch=arch, sink=True)
    forward = plan_forward(call, family=family)
    assert forward.option("sink") is True and check_plan(forward, call) is forward
    with pytest.raises(ValueError, match=r"sink True \(the call asks for False\)"):
        check_plan(forward, problem(arch=arch))
    backward = plan_backward(call, family=family)
    assert backward.option("sink") is None  # lse carries the sink into the backward
    assert backward == plan_backward(problem(arch=arch), family=family)
    bad = dataclasses.replace(
        backward, options=tuple(sorted(backward.options + (("sink", True),)))
    )
    assert not get_family(family).can_implement(bad, arch_from_name(arch))


@pytest.mark.parametrize("family,arch", [("sm80", "sm_80"), ("sm90", "sm_90a")])
def test_window_plans(family, arch):
    """A local window is a plan option of forward and backward plans (non-causal plan, each
    value its own kernels); malformed windows are not implementable."""
    call = problem(arch=arch, window=(256, 0))
    plan = plan_forward(call, family=family)
    assert plan.option("window") == (256, 0) and plan.causal is False
    assert check_plan(plan, call) is plan
    with pytest.raises(ValueError, match=r"window \(256, 0\) \(the call asks for None\)"):
        check_plan(plan, problem(arch=arch))
    backward = plan_backward(call, family=family)
    assert backward.option("window") == (256, 0) and check_plan(backward, call) is backward
    caps = arch_from_name(arch)
    for bad in ((-1, -1), (-1, 0), (-2, 5), (3,), (1.5, 2), (True, 2)):
        options = tuple(sorted(
            [pair for pair in plan.options if pair[0] != "window"] + [("window", bad)]
        ))
        assert not get_family(family).can_implement(dataclasses.replace(plan, options=options), caps)
    causal_windowed = dataclasses.replace(plan, causal=True)
    assert not get_family(family).can_implement(causal_windowed, caps)


@pytest.mark.parametrize("arch", ("sm_80", "sm_90a", "sm_120a"))
def test_dim_v_pair_plans(arch):
    """(192, 128), MLA-style: the kernels take v and out of 128 columns (plan option
    ("dim_v", 128)), forward and backward, in the sm90 family on Hopper (128 x 128 forward
    tiles), the sm80 family elsewhere."""
    mla = problem(head_dim=192, head_dim_v=128, arch=arch)
    family = "sm90" if arch == "sm_90a" else "sm80"
    for plan in (plan_forward(mla), plan_backward(mla)):
        assert (plan.family, plan.head_dim, plan.option("dim_v")) == (family, 192, 128)
        assert check_plan(plan, mla) is plan
    if family == "sm90":
        assert (plan_forward(mla).tile_m, plan_forward(mla).tile_n) == (128, 128)
    with pytest.raises(ValueError, match=r"head_dim_v 192 \(the inputs have 128\)"):
        check_plan(plan_forward(problem(head_dim=192, arch=arch)), mla)


def test_varlen_plans_in_the_sm90_family_on_hopper():
    """Packed batches (seqused_k too): the sm90 family's forward and backward on Hopper
    (not packed GQA; the forward persistent like a fixed-length batch's)."""
    packed = problem(heads_q=8, heads_kv=1, varlen=True)
    forward, backward = plan_forward(packed), plan_backward(packed)
    assert (forward.family, backward.family) == ("sm90", "sm90")
    assert (forward.option("persistent"), forward.option("pack_gqa")) == (True, 1)
    # Causal: persistent at d64, single-tile at d128 (SM90_VARLEN_PERSISTENT).
    for head_dim, persistent, tile_m in ((64, True, 192), (128, False, 128)):
        causal = plan_forward(problem(head_dim=head_dim, causal=True, varlen=True, seqlen_q=5000))
        assert (causal.option("persistent"), causal.tile_m) == (persistent, tile_m), head_dim
    used = problem(varlen=True, seqused_k=True)
    assert (plan_forward(used).family, plan_backward(used).family) == ("sm90", "sm90")


def test_softcap_forward_plans_share_exponentials_with_the_fma_pipe(monkeypatch):
    """A soft-capped sm90 forward plan carries ("exp2_poly", 8); the environment overrides it
    (0: none), and a malformed value is refused by name."""
    from cuteattn.kernels.sm90.family import EXP2_POLY_ENV

    capped = problem(softcap=30.0)
    assert plan_forward(capped).option("exp2_poly") == 8
    assert plan_forward(problem()).option("exp2_poly") is None
    assert plan_backward(capped).option("exp2_poly") is None
    monkeypatch.setenv(EXP2_POLY_ENV, "0")
    assert plan_forward(capped).option("exp2_poly") is None
    monkeypatch.setenv(EXP2_POLY_ENV, "1")
    assert plan_forward(capped).option("exp2_poly") == 1
    monkeypatch.setenv(EXP2_POLY_ENV, "two")
    with pytest.raises(ValueError, match=EXP2_POLY_ENV):
        plan_forward(capped)


def test_sm90_forward_rescales_o_eagerly_at_d64_only():
    """d64 forward plans carry ("eager_rescale", True) (``default_eager_rescale``), the others
    rescale lazily; either way, O rescaled before the next P V or after the softmax, the GEMM
    descriptors held in registers or not, and an exp2 share without softcap, are plans the
    family can run (tune_sm90 times them); a non-bool value is not."""
    family = get_family("sm90")
    arch = arch_from_name("sm_90a")
    for head_dim in (8, 40, 64, 96, 128, 192, 256):
        plan = plan_forward(problem(head_dim=head_dim, head_dim_v=head_dim))
        assert plan.option("eager_rescale") is (True if head_dim <= 64 else None), head_dim
    plan = plan_forward(problem())
    for extra in (
        {"eager_rescale": True}, {"eager_rescale": False}, {"exp2_poly": 8},
        {"rescale_before_pv": True}, {"rescale_before_pv": False},
        {"hold_descriptors": True}, {"hold_descriptors": False},
    ):
        options = tuple(sorted((dict(plan.options) | extra).items()))
        assert family.can_implement(dataclasses.replace(plan, options=options), arch), extra
    for bad in ({"eager_rescale": 1}, {"rescale_before_pv": "yes"}, {"hold_descriptors": 0}):
        options = tuple(sorted((dict(plan.options) | bad).items()))
        assert not family.can_implement(dataclasses.replace(plan, options=options), arch), bad


def test_sm90_backward_holds_descriptors_up_to_d128():
    """Backward plans carry ("hold_descriptors", True) from the planner up to d128
    (``default_hold_descriptors``); the family runs either value at every head dim (the wide
    d192 / d256 kernels too) and refuses a non-bool."""
    family = get_family("sm90")
    arch = arch_from_name("sm_90a")
    for head_dim in (64, 96, 128, 192, 256):
        plan = plan_backward(problem(head_dim=head_dim, head_dim_v=head_dim))
        planned = True if head_dim <= 128 else None
        assert plan.option("hold_descriptors") is planned, head_dim
        for held in (True, False, 1):
            options = tuple(sorted(dict(plan.options, hold_descriptors=held).items()))
            implementable = family.can_implement(dataclasses.replace(plan, options=options), arch)
            assert implementable is (type(held) is bool), (head_dim, held)


def test_dynamic_tile_counter_only_for_persistent_fixed_length_causal_or_window_forwards():
    """The sm90 family hands out work tiles from a counter (one per stream, left zero by each
    launch)
    exactly where tiles differ in work and the kernel is persistent over a fixed-length batch."""
    sm90, sm80 = get_family("sm90"), get_family("sm80")
    causal = plan_forward(problem(causal=True))
    assert causal.option("persistent") and sm90.uses_tile_counter(causal)
    assert not sm90.uses_tile_counter(plan_forward(problem()))  # dense: a static stride
    window = plan_forward(problem(window=(256, 0)))
    assert sm90.uses_tile_counter(window) is bool(window.option("persistent"))
    assert not sm90.uses_tile_counter(plan_forward(problem(causal=True, varlen=True)))
    # Two query tiles or fewer per head (decoding): no counter to zero per call.
    short = plan_forward(problem(causal=True, seqlen_q=256))
    assert short.option("persistent") and not sm90.uses_tile_counter(short)
    assert not sm90.uses_tile_counter(plan_backward(problem(causal=True)))
    assert not sm80.uses_tile_counter(plan_forward(problem(causal=True), family="sm80"))
    assert sm90.fake_tile_counter(plan_forward(problem())) is None


def test_one_q_stage_only_where_measured_and_only_on_persistent_plans():
    """d128 without a mask keeps one Q stage where two fit (plan option ("q_stages", 1));
    masked d128 and d64 take as many as fit; the option is refused on single-tile plans and
    with any other value, and reaches the kernel."""
    sm90, h200 = get_family("sm90"), arch_from_name("sm_90a")
    dense = plan_forward(problem(128, False, seqlen_q=4096, seqlen_k=4096))
    assert dense.option("persistent") and dense.option("q_stages") == 1
    for other in (problem(128, True), problem(128, False, window=(256, 0)), problem(64, False)):
        assert plan_forward(other).option("q_stages") is None
    assert sm90.can_implement(dense, h200)
    for options in (
        tuple((n, False if n == "persistent" else v) for n, v in dense.options),
        tuple((n, 2 if n == "q_stages" else v) for n, v in dense.options),
        tuple((n, True if n == "q_stages" else v) for n, v in dense.options),
    ):
        assert not sm90.can_implement(dataclasses.replace(dense, options=options), h200)
    two = dataclasses.replace(
        dense, options=tuple((n, v) for n, v in dense.options if n != "q_stages")
    )
    assert sm90.kernel(dense).q_stages == 1 and sm90.kernel(two).q_stages == 2


def test_plans_are_memoized_and_the_memo_is_bounded(monkeypatch):
    """A problem planned again gets the same plan object without planning (host time per
    call); a refusal is not remembered; a full memo starts over."""
    from cuteattn import plan as planner

    monkeypatch.setattr(planner, "_PLANS", {})
    monkeypatch.setattr(planner, "_PLANS_MAX", 3)
    first = plan_forward(problem())
    assert plan_forward(problem()) is first
    assert plan_forward(problem(), family="sm80") is not first  # the override is in the key
    with pytest.raises(NotImplementedError):
        plan_forward(problem(head_dim=512))
    assert len(planner._PLANS) == 2
    plan_forward(problem(causal=True))
    plan_forward(problem(batch=3))
    assert len(planner._PLANS) == 1


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_a_forward_without_lse_is_its_own_plan(family):
    """("lse", False) on the forward plan of a caller that reads no lse (its kernel writes
    none); the default and every backward plan carry no such option."""
    with_lse = plan_forward(problem(causal=True), family=family)
    without = plan_forward(problem(causal=True, lse=False), family=family)
    assert with_lse.option("lse") is None and without.option("lse") is False
    assert dataclasses.replace(without, options=tuple(
        pair for pair in without.options if pair[0] != "lse"
    )) == with_lse
    assert plan_backward(problem(causal=True, lse=False), family=family).option("lse") is None


def test_sm90_persistent_forwards_with_an_o_buffer_double_buffer_q():
    """Every tile the sm90 planner offers: two Q stages exactly where O has a buffer of its own
    and a second Q tile fits too (d64, d96, d128; d128 128 x 128 with two K / V stages: 224 KB
    of tiles), else one; the accounting includes the second stage and its barriers."""
    from cuteattn.kernels.sm90 import family, tiling

    capacity = arch_from_name("sm_90a").smem_per_block
    tile_sets = (family.SM90_TILES, family.SM90_SHORT_TILES)
    tiles = {
        (head_dim, tile) for tile_set in tile_sets for (head_dim, _), offered in tile_set.items()
        for tile in offered
    }
    for head_dim, (tile_m, tile_n, stages, _) in tiles:
        q_stages = tiling.separate_o_q_stages(head_dim, tile_m, tile_n, stages, capacity)
        separate_o = tiling.separate_o_fits(head_dim, tile_m, tile_n, stages, capacity)
        assert q_stages == (2 if head_dim <= 128 else 1), (head_dim, tile_m, tile_n)
        assert separate_o == (head_dim <= 128)
        two = tiling.smem_bytes(head_dim, tile_m, tile_n, stages, True, q_stages=2)
        one = tiling.smem_bytes(head_dim, tile_m, tile_n, stages, True)
        assert two - one == tile_m * head_dim * tiling.ELEM_BYTES + 2 * tiling.MBARRIER_BYTES
        assert (two <= capacity) == (q_stages == 2)
    # The d128 tile: Q 2 x 32 KB, K and V 2 x 32 KB each, O 32 KB, within the 227 KB.
    assert tiling.smem_bytes(128, 128, 128, 2, True, q_stages=2) <= capacity
