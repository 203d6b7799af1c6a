"""The causal mask's closed-form count of a thread's visible columns (kernels/common/mask.py),
against counting them one by one, for the mma accumulators' column layout."""

import pytest

from cuteattn.kernels.common.mask import columns_in_pairs, paired_columns_below


def test_paired_columns_are_the_mma_layout():
    assert columns_in_pairs([0, 1, 8, 9, 16, 17])
    assert not columns_in_pairs([0, 1, 2, 3])
    assert not columns_in_pairs([0, 8, 1, 9])


def test_count_of_columns_below_a_limit():
    for num_cols in (2, 16, 32, 48, 64):
        cols = [8 * (c // 2) + c % 2 for c in range(num_cols)]
        for limit in range(-20, 8 * num_cols + 20):
            assert paired_columns_below(limit, num_cols) == sum(col < limit for col in cols)


def _thread_columns(make_mma, tile_mn, num_threads):
    """Each thread's accumulator columns, relative to its first, per row (host tracing of
    the tiled MMA that ``make_mma`` builds)."""
    import cutlass
    import cutlass.cute as cute

    from cuteattn.kernels.common.fragments import tile_coords

    found = []

    @cute.jit
    def collect():
        tiled_mma = make_mma()
        for t in cutlass.range_constexpr(num_threads):
            coords = tile_coords(tiled_mma.get_slice(t), tile_mn)
            first = coords[0, 0][1]
            for r in cutlass.range_constexpr(cute.size(coords, mode=[0])):
                cols = []
                for c in cutlass.range_constexpr(cute.size(coords, mode=[1])):
                    cols.append(coords[r, c][1] - first)
                found.append(cols)

    # Traced for sm_90a whatever CUTE_DSL_ARCH says (WGMMA atoms need it); nothing runs.
    cute.compile(collect, options="--gpu-arch sm_90a")
    return found


@pytest.mark.compile
def test_every_thread_sees_the_paired_column_pattern():
    """The bit masks count a thread's columns in closed form from its first one: every thread
    of the layouts the masks meet (sm90 S and S^T for the tiles the families offer, sm80's
    m16n8k16 warps along M) has columns 0, 1, 8, 9, ... past its first, in every row."""
    import functools

    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as hopper
    from cutlass import BFloat16, Float32
    from cutlass.cute.nvgpu import OperandMajorMode, warp

    def wgmma(atoms, tile_n):
        return hopper.make_trivial_tiled_mma(
            BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.K, Float32,
            atom_layout_mnk=(atoms, 1, 1), tiler_mn=(64, tile_n),
        )

    def mma_sync(warps):
        return cute.make_tiled_mma(
            warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)), (warps, 1, 1),
            permutation_mnk=(warps * 16, 16, 16),
        )

    cases = [
        (functools.partial(wgmma, wgs, tile_n), (64 * wgs, tile_n), 128 * wgs)
        for wgs, tile_n in ((1, 128), (2, 128), (3, 128), (2, 112), (2, 80), (2, 64), (2, 176))
    ]
    # The backward's S^T: keys x queries, a warpgroup per 64 keys.
    cases += [(functools.partial(wgmma, 2, tile_m), (128, tile_m), 256) for tile_m in (64, 80, 128)]
    cases += [
        (functools.partial(mma_sync, warps), (warps * 16, tile_n), warps * 32)
        for warps, tile_n in ((4, 64), (8, 128))
    ]
    for make_mma, tile_mn, threads in cases:
        rows = _thread_columns(make_mma, tile_mn, threads)
        assert len(rows) >= 2 * threads and all(len(cols) >= 4 for cols in rows), tile_mn
        assert all(columns_in_pairs(cols) for cols in rows), (tile_mn, threads)
