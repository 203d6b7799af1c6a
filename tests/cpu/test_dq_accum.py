"""The backward's fp32 dq accumulator layouts (CPU; the postprocess kernel that reads them:
tests/gpu/test_dq_postprocess.py)."""

import pytest
import torch

from cuteattn.ops import new_dq_accum


def test_accumulator_layout():
    """(batch, heads, chunks, rows, chunk_dim + row_pad), zeroed; the kernel's head dim when it
    pads q's (the postprocess kernel reads it: tests/gpu/test_dq_postprocess.py)."""
    q = torch.empty(2, 70, 3, 40, dtype=torch.bfloat16)
    accum = new_dq_accum(q, 128, 2, 8, head_dim=64)
    assert accum.shape == (2, 3, 2, 128, 40)
    assert accum.dtype == torch.float32 and not accum.any()
    assert new_dq_accum(q, 128, 1, 0).shape == (2, 3, 1, 128, 40)


def test_sm90_backward_tiles_fit_shared_memory():
    """Every backward tile the sm90 family offers fits the H200's shared memory (the model is
    the kernel's SharedStorage), its dq rows whole 16-byte units for the bulk reductions."""
    from cuteattn.arch import arch_from_name
    from cuteattn.kernels.sm90.family import (
        BACKWARD_TILES,
        backward_dq_buffers,
        backward_dq_chunks,
        backward_dq_single_wg,
        backward_do_stages,
        backward_dq_slots,
        backward_smem_bytes,
    )

    capacity = arch_from_name("sm_90a").smem_per_block
    assert backward_dq_chunks(128, 80) == (2, 0)
    assert backward_dq_chunks(64, 128) == (1, 0) and backward_dq_chunks(64, 64) == (2, 0)
    assert backward_dq_chunks(96, 64) == (1, 0) and backward_dq_chunks(256, 64) == (4, 8)
    # d192: a 96-column chunk per warpgroup, over all the keys (``WIDE_DQ_CHUNK``).
    assert backward_dq_chunks(192, 64) == (2, 8)
    # d192's 64 x 96 with two Q stages keeps one dO stage (``BACKWARD_DO_STAGES``): it fits
    # only so (two of each: 244 KB).
    assert backward_do_stages(192, 64, 96, 2) == 1 and backward_do_stages(192, 64, 96, 1) == 1
    assert backward_do_stages(128, 64, 128, 2) == 2
    assert backward_smem_bytes(192, 64, 96, 2) == 227_328 <= capacity
    # d96: warpgroup 0 alone computes dQ (one buffer, one addition per element); no other.
    assert backward_dq_single_wg(96, 64) and backward_dq_buffers(96, 64) == 1
    for head_dim, tiles in BACKWARD_TILES.items():
        for tile_m, _, _ in tiles:
            if head_dim != 96:
                assert not backward_dq_single_wg(head_dim, tile_m), (head_dim, tile_m)
                assert backward_dq_buffers(head_dim, tile_m) == 2
    for head_dim, tiles in BACKWARD_TILES.items():
        for tile_m, tile_n, stages in tiles:
            chunks, pad = backward_dq_chunks(head_dim, tile_m)
            assert (head_dim // chunks + pad) * 4 % 16 == 0
            assert backward_smem_bytes(head_dim, tile_m, tile_n, stages) <= capacity
            # Deterministic up to d128: two dQ buffers per warpgroup where they fit.
            slots = backward_dq_slots(head_dim, tile_m, tile_n, stages, deterministic=True)
            assert slots == (1 if head_dim > 128 or (head_dim, tile_m) == (128, 80) else 2)
            assert backward_dq_slots(head_dim, tile_m, tile_n, stages, deterministic=False) == 1
            assert backward_smem_bytes(head_dim, tile_m, tile_n, stages, slots) <= capacity
    # V and dO with dim_v columns: 182,272 bytes, the compiled d192 / dim_v 128 struct's size
    # at 64 x 96 (the kernel asserts the model at every compile).
    assert backward_smem_bytes(192, 64, 96, 1, head_dim_v=128) == 182_272


def test_sm90_fragment_order_geometry():
    """The sm90 backward's dQ in fragment order (``kernels/sm90/dq_fragments.py``): for every
    tile it offers up to d128, the warpgroups' blocks cover the query tile exactly once (split
    by keys, or d96's warpgroup 0 alone: one block holds the whole tile), each thread's share
    is whole 16-byte vectors, and the blocks are the unpadded (rows, chunk) regions of dq_accum
    the postprocess reads."""
    pytest.importorskip("cutlass")
    from cuteattn.kernels.sm90.dq_fragments import THREADS, VECTOR, DqSplit
    from cuteattn.kernels.sm90.family import BACKWARD_TILES, backward_dq_chunks

    for head_dim in (64, 96, 128):
        for tile_m, _, _ in BACKWARD_TILES[head_dim]:
            split = DqSplit(head_dim, tile_m)
            chunks, row_pad = backward_dq_chunks(head_dim, tile_m)
            assert row_pad == 0
            block = split.buffer_rows * split.chunk_cols
            assert block % (THREADS * VECTOR) == 0, (head_dim, tile_m)
            by_keys = not (split.by_dim or split.by_rows)
            assert split.blocks * block == tile_m * head_dim, (head_dim, tile_m)
            assert by_keys == (split.blocks == 1 and chunks == 1 and not split.by_rows)
            assert split.transposed == (tile_m % 64 != 0)
            rows, cols = split.tile()
            assert rows * cols == (tile_m * head_dim if split.by_dim else block)


@pytest.mark.parametrize(
    "family,deterministic,causal,window,seqlen_q,seqlen_k,zeroed,head_dim",
    [
        # Not deterministic: the claimed first addition stores where each key tile starts at
        # a query tile of its own (d64: 128-row query tiles, 128-key tiles).
        ("sm90", False, False, None, 1000, 1000, False, 64),  # 8 query tiles, 8 key tiles
        ("sm90", False, False, None, 4097, 1, False, 64),
        ("sm90", False, False, None, 129, 4097, True, 64),  # 33 key tiles start at 2 tiles
        ("sm90", False, True, None, 1000, 1000, False, 64),  # each key tile at its diagonal
        ("sm90", False, True, None, 1000, 1100, False, 64),  # one key tile left of the diagonal
        ("sm90", False, True, None, 700, 1100, True, 64),  # four key tiles start at tile 0
        ("sm90", False, True, None, 1100, 700, True, 64),  # the first 400 rows see no key
        ("sm90", False, False, (100, 30), 900, 900, True, 64),  # no claims with a window
        ("sm90", False, False, None, 1000, 1000, False, 256),
        ("sm90", False, False, None, 1000, 1000, True, 128),  # d128: no claims
        # d96, d192: claims up to ``CLAIM_MAX_KEYS`` keys.
        ("sm90", False, True, None, 1000, 1000, False, 96),
        ("sm90", False, False, None, 4096, 4096, False, 192),
        ("sm90", False, False, None, 4097, 4097, True, 192),
        ("sm90", False, True, None, 8192, 8192, True, 96),
        ("sm80", False, False, None, 1000, 1000, True, 64),  # additions in any order
        # Deterministic: every query tile's first turn stores.
        ("sm90", True, False, None, 1000, 1000, False, 128),
        ("sm90", True, False, None, 4097, 1, False, 128),
        ("sm90", True, True, None, 700, 1100, False, 128),  # causal: every row sees key 0
        ("sm90", True, True, None, 1000, 1000, False, 128),
        ("sm90", True, True, None, 1100, 700, True, 128),  # the first 400 rows see no key
        ("sm90", True, False, (100, 30), 900, 900, True, 128),  # a window may leave tiles keyless
        ("sm80", True, False, None, 1000, 1000, True, 128),  # sm80 adds every turn
    ],
)
def test_dq_accum_zeroed_unless_every_query_tile_has_a_first_store(
    family, deterministic, causal, window, seqlen_q, seqlen_k, zeroed, head_dim
):
    from cuteattn.arch import arch_from_name
    from cuteattn.ops import dq_accum_needs_zeros
    from cuteattn.plan import Problem, plan_backward

    problem = Problem(
        batch=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=4, heads_kv=2, head_dim=head_dim,
        head_dim_v=head_dim, dtype="bf16", causal=causal, arch=arch_from_name("sm_90a"),
        deterministic=deterministic, window=window,
    )
    plan = plan_backward(problem, family=family)
    assert dq_accum_needs_zeros(plan, seqlen_q, seqlen_k) == zeroed
    q = torch.empty(2, seqlen_q, 4, 128, dtype=torch.bfloat16)
    rows = -(-seqlen_q // plan.tile_m) * plan.tile_m
    accum = new_dq_accum(q, rows, 2, 0, zeroed=zeroed)
    assert accum.shape == (2, 4, 2, rows, 64)
    if zeroed:
        assert not accum.any()


def test_sm90_backward_counters():
    """The sm90 backward takes per-query-tile counters where it orders (deterministic) or
    claims (fixed length, no window) the additions; varlen and windowed non-deterministic
    kernels add in any order into a zeroed accumulator and take none; sm80 only its turns."""
    from cuteattn.kernels.sm90.family import claims_first_addition
    from cuteattn.plan import get_family

    def plan(family, head_dim=64, **options):
        from cuteattn.plan import KernelPlan

        opts = dict(deterministic=False) | options
        if opts.get("claims") is False:
            del opts["claims"]
        elif family == "sm90" and claims_first_addition(
            deterministic=opts["deterministic"], varlen=opts.get("varlen", False),
            window=opts.get("window"), head_dim=head_dim,
        ):
            opts["claims"] = True  # as the planner sets it
        return KernelPlan(
            family=family, arch="sm_90a", dtype="bf16", head_dim=head_dim, causal=False,
            tile_m=128 if head_dim == 64 else 64, tile_n=128, num_threads=384, num_stages=2,
            options=tuple(sorted(opts.items())), kind="backward",
        )

    sm90, sm80 = get_family("sm90"), get_family("sm80")
    assert sm90.dq_counters(plan("sm90")) and sm90.dq_counters(plan("sm90", deterministic=True))
    assert not sm90.dq_counters(plan("sm90", varlen=True))
    # A plan without ``claims`` (d128; d96 / d192 past 4k keys) adds in any order into a
    # zeroed accumulator.
    assert not sm90.dq_counters(plan("sm90", head_dim=128))
    assert not sm90.stores_first_additions(plan("sm90", head_dim=128), 1000, 1000)
    assert not sm90.dq_counters(plan("sm90", claims=False))
    assert sm90.dq_counters(plan("sm90", head_dim=128, deterministic=True))
    assert not sm90.stores_first_additions(plan("sm90", varlen=True), 1000, 1000)
    # Counters start free where claims run; claimed and stored where dq_accum is zeroed (every
    # key tile adds at once); turns start at 0.
    assert sm90.dq_counters_start(plan("sm90"), accum_zeroed=False) == 0
    assert sm90.dq_counters_start(plan("sm90"), accum_zeroed=True) == 2
    assert sm90.dq_counters_start(plan("sm90", deterministic=True), accum_zeroed=True) == 0
    assert not sm90.dq_counters(plan("sm90", window=(100, 30)))
    assert sm90.dq_counters(plan("sm90", deterministic=True, varlen=True))
    assert not sm80.dq_counters(plan("sm80")) and sm80.dq_counters(plan("sm80", deterministic=True))


@pytest.mark.parametrize("seqlen_k", (1000, 4096, 4097))
@pytest.mark.parametrize("deterministic", (False, True))
@pytest.mark.parametrize("head_dim", (64, 96, 128, 192, 256))
def test_sm90_backward_kernel_claims_where_the_host_plans_them(head_dim, deterministic, seqlen_k):
    """The kernel claims its first additions exactly where the host skips the zero fill for
    them (``backward_claims_first_addition``): non-deterministic, ``CLAIM_HEAD_DIMS`` at every
    length, ``SHORT_CLAIM_HEAD_DIMS`` up to ``CLAIM_MAX_KEYS`` keys."""
    pytest.importorskip("cutlass")
    from cuteattn.arch import arch_from_name
    from cuteattn.kernels.sm90.family import (
        CLAIM_HEAD_DIMS,
        CLAIM_MAX_KEYS,
        SHORT_CLAIM_HEAD_DIMS,
        backward_claims_first_addition,
    )
    from cuteattn.plan import Problem, get_family, plan_backward

    plan = plan_backward(Problem(
        batch=2, seqlen_q=1000, seqlen_k=seqlen_k, heads_q=4, heads_kv=2, head_dim=head_dim,
        head_dim_v=head_dim, dtype="bf16", causal=False, arch=arch_from_name("sm_90a"),
        deterministic=deterministic,
    ), family="sm90")
    claims = get_family("sm90").kernel(plan).claims
    assert claims == backward_claims_first_addition(plan)
    assert claims == (not deterministic and (
        head_dim in CLAIM_HEAD_DIMS
        or (head_dim in SHORT_CLAIM_HEAD_DIMS and seqlen_k <= CLAIM_MAX_KEYS)
    ))


def test_sm90_backward_claims_option_is_checked():
    """``claims`` is True or absent, and only where a kernel can claim (not deterministic,
    fixed length, no window, a claiming head dim); the kernel refuses it elsewhere too."""
    import dataclasses

    from cuteattn.arch import arch_from_name
    from cuteattn.plan import Problem, get_family, plan_backward

    arch = arch_from_name("sm_90a")
    family = get_family("sm90")

    def with_options(plan, **changes):
        options = dict(plan.options) | changes
        options = {name: value for name, value in options.items() if value is not None}
        return dataclasses.replace(plan, options=tuple(sorted(options.items())))

    def planned(head_dim, **fields):
        return plan_backward(Problem(
            batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2, head_dim=head_dim,
            head_dim_v=head_dim, dtype="bf16", causal=False, arch=arch, **fields,
        ), family="sm90")

    d96 = planned(96)
    assert d96.option("claims") is True and family.can_implement(d96, arch)
    assert family.can_implement(with_options(d96, claims=None), arch)  # adds into zeros
    for bad in (False, 1, "yes"):
        assert not family.can_implement(with_options(d96, claims=bad), arch), bad
    for plan in (planned(128), planned(96, deterministic=True), planned(96, window=(100, 30))):
        assert plan.option("claims") is None
        assert not family.can_implement(with_options(plan, claims=True), arch), plan
    pytest.importorskip("cutlass")
    with pytest.raises(ValueError, match="claims"):
        family.kernel(with_options(planned(128), claims=True))
