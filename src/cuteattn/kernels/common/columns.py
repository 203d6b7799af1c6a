"""Padded head dims in kernels that copy tiles row by row in 16-byte chunks (the sm80 family):
a kernel compiled for head dim D runs inputs of fewer columns (a multiple of 8) without copying
them. The chunks past the inputs' columns are never read or written in global memory; in shared
memory they hold zeros, written once before the first load (no load ever lands there), so the
MMAs over the kernel's D columns add nothing for them."""

import cutlass
import cutlass.cute as cute


@cute.jit
def copy_row(
    tiled_copy: cute.TiledCopy,
    src: cute.Tensor,
    dst: cute.Tensor,
    thread_coords: cute.Tensor,
    columns: cutlass.Constexpr,
):
    """One row of a thread's copy partitions ((CPY, CPY_K) slices of (CPY, CPY_M, CPY_K)),
    src -> dst; with ``columns`` (the inputs' head dim, None when it is the kernel's) only the
    chunks left of it. ``thread_coords``: the row's identity coordinates, sliced alike."""
    if cutlass.const_expr(columns is None):
        cute.copy(tiled_copy, src, dst)
    else:
        for k in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            if thread_coords[0, k][1] < columns:
                cute.copy(tiled_copy, src[None, k], dst[None, k])


@cute.jit
def zero_columns_past(dst: cute.Tensor, thread_coords: cute.Tensor, columns: int):
    """Zero this thread's chunks of a shared tile (a (CPY, CPY_M, CPY_K) copy partition) at or
    past column ``columns``."""
    for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
        for k in cutlass.range_constexpr(cute.size(dst, mode=[2])):
            if thread_coords[0, m, k][1] >= columns:
                dst[None, m, k].fill(0)
