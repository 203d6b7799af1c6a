"""sm80-only building blocks: the ldmatrix copy atoms, and the score accumulator of warp
mma.sync (m16n8k16) re-read as the A operand of P @ V (the shared-memory row tiles both families
use: ``kernels/common/smem_tiles.py``)."""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp


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


def warp_grid_mma(dtype: type[cutlass.Numeric], warps_mn: tuple[int, int]) -> cute.TiledMma:
    """m16n8k16 atoms (fp32 accumulators) on a (warps along M, warps along N) grid; each warp
    takes 16 columns of N per step, so ldmatrix x4 feeds B."""
    warps_m, warps_n = warps_mn
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(dtype, cutlass.Float32, (16, 8, 16)),
        (warps_m, warps_n, 1),
        permutation_mnk=(warps_m * 16, warps_n * 16, 16),
    )


def ldmatrix_atoms(dtype: type[cutlass.Numeric]) -> tuple[cute.CopyAtom, cute.CopyAtom]:
    """(ldmatrix x4, ldmatrix x4 transposed): MMA operands from shared memory, K-major and
    MN-major."""
    return tuple(
        cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=4), dtype)
        for transpose in (False, True)
    )
