"""The forward epilogue shared by every family: LSE rows and the O tile to global memory.

LSE: each row's value lives in the four threads of a quad after the softmax's reductions; the
thread holding the row's column 0 writes it. O: registers -> shared memory in the MMA's
accumulator layout, then shared -> registers -> global in whole 16-byte row chunks through a
tiled copy (coalesced 128-bit stores), skipping rows past the sequence end.
"""

from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from cuteattn.kernels.common.columns import copy_row


@cute.jit
def store_lse(gLSE: cute.Tensor, lse: cute.Tensor, coords: cute.Tensor, rows_left: Int32):
    """Write this thread's row LSEs.

    gLSE: (tile_m,) the query tile's LSE; lse: one value per row of this thread's accumulator,
    in the order of ``coords`` (``fragments.tile_coords`` of the score tile); rows at or past
    ``rows_left`` (seqlen_q - first row of the tile) are not written.
    """
    if coords[0, 0][1] == 0:
        for r in cutlass.range_constexpr(cute.size(lse)):
            row = coords[r, 0][0]
            if row < rows_left:
                gLSE[row] = lse[r]


@cute.jit
def store_o(
    acc_O: cute.Tensor,
    sO: cute.Tensor,
    gO: cute.Tensor,
    rows_left: Int32,
    *,
    tiled_mma: cute.TiledMma,
    gmem_tiled_copy: cute.TiledCopy,
    tidx: Int32,
    sync: Callable[[], None],
    smem_copy_atom: cute.CopyAtom | None = None,
    columns: cutlass.Constexpr = None,
):
    """O accumulator (fp32, already normalised) -> gO, rows at or past ``rows_left`` skipped.

    sO: a (tile_m, head_dim) shared buffer no thread still reads (the caller's sync);
    gmem_tiled_copy: 128-bit copies of whole rows, with the threads that run this epilogue;
    sync: the barrier among those threads (the CTA barrier, or a named barrier of the warps
    that own O); smem_copy_atom: the register -> shared copy (default: plain stores);
    columns: a padded head dim's input columns (only those are stored), else None.
    """
    dtype = gO.element_type
    rO = cute.make_fragment_like(acc_O, dtype)
    rO.store(acc_O.load().to(dtype))
    if cutlass.const_expr(smem_copy_atom is None):
        smem_copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype)
    smem_thr_store = cute.make_tiled_copy_C(smem_copy_atom, tiled_mma).get_slice(tidx)
    cute.copy(smem_copy_atom, smem_thr_store.retile(rO), smem_thr_store.partition_D(sO))
    sync()

    store_rows(sO, gO, rows_left, gmem_tiled_copy=gmem_tiled_copy, tidx=tidx, columns=columns)


@cute.jit
def store_rows(
    sO: cute.Tensor,
    gO: cute.Tensor,
    rows_left: Int32,
    *,
    gmem_tiled_copy: cute.TiledCopy,
    tidx: Int32,
    columns: cutlass.Constexpr = None,
):
    """A (tile_m, head_dim) shared tile -> gO in whole 16-byte row chunks, rows at or past
    ``rows_left`` skipped (``store_o``'s second half; the caller has synchronised the threads
    that wrote sO)."""
    dtype = gO.element_type
    gmem_thr_store = gmem_tiled_copy.get_slice(tidx)
    tOsO = gmem_thr_store.partition_S(sO)
    tOgO = gmem_thr_store.partition_D(gO)
    tOrO = cute.make_fragment_like(tOgO, dtype)
    cute.autovec_copy(tOsO, tOrO)
    # Row bound relative to this thread's first row, so the loop compares constants (thread
    # 0's rows) against one per-thread limit.
    coords = cute.make_identity_tensor(gO.shape)
    thread_coords = gmem_thr_store.partition_S(coords)
    thread_rows_left = rows_left - thread_coords[0][0]
    coords_t0 = gmem_tiled_copy.get_slice(0).partition_S(coords)
    for m in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
        if coords_t0[0, m, 0][0] < thread_rows_left:
            copy_row(
                gmem_tiled_copy, tOrO[None, m, None], tOgO[None, m, None],
                thread_coords[None, m, None], columns,
            )
