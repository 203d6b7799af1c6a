"""Warp-level mma.sync GEMM over a tile, with shared -> register loads one k-slice ahead.

While the tensor cores work on k-slice k, ldmatrix already fetches slice k + 1, which hides the
shared-memory latency behind the MMAs.
"""

from typing import NamedTuple

import cutlass
import cutlass.cute as cute


class SmemOperand(NamedTuple):
    """An MMA operand read from shared memory: its smem partition, the register fragment seen
    through the copy's layout, and the thread's ldmatrix copy."""

    smem: cute.Tensor
    regs_view: cute.Tensor
    thr_copy: cute.TiledCopy


def _load_k_slice(operand: SmemOperand, k: int):
    cute.copy(operand.thr_copy, operand.smem[None, None, k], operand.regs_view[None, None, k])


@cute.jit
def gemm(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    b_from_smem: SmemOperand,
    a_from_smem: SmemOperand | None = None,
):
    """acc += A B. B comes from shared memory; A too when ``a_from_smem`` is given, otherwise
    tCrA already holds it (e.g. P, converted in registers from the score accumulator)."""
    num_k = cute.size(tCrA, mode=[2])
    operands = (b_from_smem,) if a_from_smem is None else (a_from_smem, b_from_smem)
    for operand in operands:
        _load_k_slice(operand, 0)
    for k in cutlass.range_constexpr(num_k):
        if cutlass.const_expr(k + 1 < num_k):
            for operand in operands:
                _load_k_slice(operand, k + 1)
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
