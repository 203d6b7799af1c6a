"""acc_as_rows_cols is a correct (rows, cols) view for both MMA kinds, checked at trace time.

Inside a jit function compiled for sm_90a (no GPU needed), an identity tensor of the tile is
partitioned like each MMA's accumulator for several threads; static coordinates are Python ints
during tracing, so the test collects them and checks them after the compile.
"""

import cutlass.cute as cute
import cutlass.utils.hopper_helpers as hopper_helpers
from cutlass import BFloat16, Float32
from cutlass.cute.nvgpu import OperandMajorMode, warp

from cuteattn.kernels.common.fragments import tile_coords

# (name, threads to probe, tile (M, N)) per MMA; the sm80 MMA has 4 warps along M (128 threads),
# the WGMMA 2 warpgroups along M (256 threads). Tiles exceed one MMA tile in both M and N.
SM80_TILE = (128, 64)
SM90_TILE = (128, 256)
SM80_THREADS = (0, 1, 5, 37, 100, 127)
SM90_THREADS = (0, 1, 5, 37, 130, 255)


def collect_views():
    views = []

    @cute.jit
    def probe():
        sm80_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)),
            (4, 1, 1),
            permutation_mnk=(64, 16, 16),
        )
        sm90_mma = hopper_helpers.make_trivial_tiled_mma(
            BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.K, Float32,
            atom_layout_mnk=(2, 1, 1), tiler_mn=(64, 128),
        )
        for name, mma, tile, threads in (
            ("sm80", sm80_mma, SM80_TILE, SM80_THREADS),
            ("sm90", sm90_mma, SM90_TILE, SM90_THREADS),
        ):
            for t in threads:
                thr_mma = mma.get_slice(t)
                part = thr_mma.partition_C(cute.make_identity_tensor(tile))
                view = tile_coords(thr_mma, tile)
                num_rows = cute.size(view, mode=[0])
                num_cols = cute.size(view, mode=[1])
                grid = [[tuple(view[r, c]) for c in range(num_cols)] for r in range(num_rows)]
                flat = [tuple(part[i]) for i in range(cute.size(part))]
                views.append((name, t, tile, grid, flat))

    cute.compile(probe, options="--gpu-arch sm_90a")
    return views


def test_rows_cols_view_of_both_mma_kinds():
    views = collect_views()
    assert {name for name, *_ in views} == {"sm80", "sm90"}
    for name, t, tile, grid, flat in views:
        where = f"{name} thread {t}"
        rows = [row[0][0] for row in grid]
        cols = [col for _, col in grid[0]]
        # One row index per r and one column per c.
        assert all(coord[0] == rows[r] for r, row in enumerate(grid) for coord in row), where
        assert all(row[c][1] == cols[c] for row in grid for c in range(len(cols))), where
        assert len(set(rows)) == len(rows) and len(set(cols)) == len(cols), where
        # The view holds exactly the thread's elements: its rows times its columns, once each.
        assert len(flat) == len(rows) * len(cols) == len(set(flat)), where
        assert {(r, c) for r in rows for c in cols} == set(flat), where
        assert all(0 <= r < tile[0] and 0 <= c < tile[1] for r, c in flat), where
    # Rows come in pairs eight apart (the accumulator's two row halves).
    for name, t, tile, grid, flat in views:
        rows = [row[0][0] for row in grid]
        assert rows[1] - rows[0] == 8, f"{name} thread {t}: rows {rows}"
