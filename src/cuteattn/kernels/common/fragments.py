"""Views of MMA accumulator fragments that every family shares.

Masks, the online softmax and the epilogue index an accumulator by (row, column) of the score
or output tile, never by raw accumulator modes. Both MMA kinds keep, per thread, pairs of
neighbouring columns of two rows eight apart:

- warp mma.sync (m16n8k16): ``((2 cols, 2 rows), MMA_M, MMA_N)``;
- warpgroup WGMMA (m64nNk16): ``((2 cols, 2 rows, N/8 column groups), MMA_M, MMA_N)``.

``acc_as_rows_cols`` turns either into ``(rows, cols)`` with rows ``(2, MMA_M)`` and cols
``(2, [N/8,] MMA_N)``.
"""

import cutlass.cute as cute


def acc_as_rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """Accumulator ``((2, 2, ...), MMA_M, MMA_N)`` -> ``((2, MMA_M) rows, (2, ..., MMA_N) cols)``.

    The second value mode steps rows; the first and any further value modes step columns.
    """
    shape, stride = acc.layout.shape, acc.layout.stride
    value_shape, value_stride = shape[0], stride[0]
    rows_cols = cute.make_layout(
        (
            (value_shape[1], shape[1]),
            (value_shape[0], *value_shape[2:], shape[2]),
        ),
        stride=(
            (value_stride[1], stride[1]),
            (value_stride[0], *value_stride[2:], stride[2]),
        ),
    )
    return cute.make_tensor(acc.iterator, rows_cols)


def tile_coords(thr_mma: cute.ThrMma, tile_mn: tuple[int, int]) -> cute.Tensor:
    """The (row, col) tile coordinate of each of this thread's accumulator elements, as a
    (rows, cols) view; a static thread's coordinates are compile-time constants."""
    return acc_as_rows_cols(thr_mma.partition_C(cute.make_identity_tensor(tile_mn)))
