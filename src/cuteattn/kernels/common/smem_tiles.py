"""Shared-memory row tiles that both kernel families use: the swizzled 8-row atom of K-major
(rows, head_dim) tiles that ldmatrix and 16-byte row copies read conflict-free, the copies that
fill and drain such tiles one row at a time, and the transposed view of a tile."""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync


def smem_tile_atom(dtype: type[cutlass.Numeric], head_dim: int) -> cute.ComposedLayout:
    """Swizzled 8-row atom of a K-major (rows, head_dim) tile, conflict-free for ldmatrix.

    Rows of 64 elements (128 bytes) use a 3-bit swizzle over 16-byte chunks; head dims that are
    only a multiple of 32 (96, 160, ...) use 32-element rows and a 2-bit swizzle.
    """
    atom_cols = 64 if head_dim % 64 == 0 else 32
    swizzle_bits = 3 if atom_cols == 64 else 2
    elems_per_16b = 128 // dtype.width
    base_bits = elems_per_16b.bit_length() - 1
    return cute.make_composed_layout(
        cute.make_swizzle(swizzle_bits, base_bits, base_bits),
        0,
        cute.make_layout((8, atom_cols), stride=(atom_cols, 1)),
    )


def gmem_row_copies(
    dtype: type[cutlass.Numeric], tile_atom: cute.ComposedLayout, num_threads: int
) -> tuple[cute.TiledCopy, cute.TiledCopy]:
    """(cp.async global -> shared, 128-bit shared -> global) tiled copies of (rows, dim) tiles
    whose shared side uses ``tile_atom``: 16 bytes per thread per access, the threads of a row
    covering one row of the swizzle atom."""
    elems_per_copy = 128 // dtype.width
    threads_per_row = tile_atom.outer.shape[1] // elems_per_copy
    thread_layout = cute.make_layout(
        (num_threads // threads_per_row, threads_per_row), stride=(threads_per_row, 1)
    )
    value_layout = cute.make_layout((1, elems_per_copy))
    load = cute.make_tiled_copy_tv(
        cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
            dtype,
            num_bits_per_copy=128,
        ),
        thread_layout,
        value_layout,
    )
    store = cute.make_tiled_copy_tv(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128),
        thread_layout,
        value_layout,
    )
    return load, store


def transposed(tensor: cute.Tensor) -> cute.Tensor:
    """(rows, cols, ...) smem tensor seen as (cols, rows, ...): V as the B operand of P V."""
    shape = (tensor.shape[1], tensor.shape[0], *tensor.shape[2:])
    order = (1, 0, *range(2, cute.rank(tensor)))
    return cute.composition(tensor, cute.make_ordered_layout(shape, order=order))
