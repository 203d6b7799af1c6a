"""sm80-only fragment views: swizzled shared-memory tiles for ldmatrix, and the score
accumulator of warp mma.sync (m16n8k16) re-read as the A operand of P @ V."""

import cutlass
import cutlass.cute as cute


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


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """Score accumulator ((2, 2), MMA_M, MMA_N) -> A operand ((2, 2, 2), MMA_M, MMA_N / 2).

    An m16n8k16 A fragment covers 16 columns, i.e. two consecutive n8 accumulator atoms, so
    pairs of MMA_N tiles fold into the value mode.
    """
    paired = cute.logical_divide(acc.layout, (None, None, 2))
    operand_a = cute.make_layout(
        ((paired.shape[0], paired.shape[2][0]), paired.shape[1], paired.shape[2][1]),
        stride=((paired.stride[0], paired.stride[2][0]), paired.stride[1], paired.stride[2][1]),
    )
    return cute.make_tensor(acc.iterator, operand_a)
