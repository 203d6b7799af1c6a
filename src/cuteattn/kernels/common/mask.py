"""Masks applied to a score tile held in an mma accumulator.

Positions outside the visible set are set to -inf before the online softmax. Coordinates come
from an identity tensor partitioned like the accumulator; thread 0's coordinates are known at
compile time, so each comparison is a constant against a per-thread limit.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cuteattn.kernels.common.fragments import acc_as_rows_cols


class AttentionMask:
    def __init__(self, tile_m: int, tile_n: int, seqlen_q: Int32, seqlen_k: Int32):
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.seqlen_q = seqlen_q
        self.seqlen_k = seqlen_k

    @cute.jit
    def apply(
        self,
        acc_S: cute.Tensor,
        thr_mma: cute.ThrMma,
        m_block: Int32,
        n_block: Int32,
        mask_seqlen: cutlass.Constexpr[bool],
        mask_causal: cutlass.Constexpr[bool],
    ):
        scores = acc_as_rows_cols(acc_S)
        tile_coords = cute.make_identity_tensor((self.tile_m, self.tile_n))
        coords = acc_as_rows_cols(thr_mma.partition_C(tile_coords))
        coords_t0 = acc_as_rows_cols(thr_mma.get_slice(0).partition_C(tile_coords))
        thread_row0 = coords[0, 0][0]
        thread_col0 = coords[0, 0][1]
        # Column limits relative to this thread's first column, so the loop compares constants.
        col_limit_seqlen = self.seqlen_k - n_block * self.tile_n - thread_col0
        if cutlass.const_expr(not mask_causal):
            if cutlass.const_expr(mask_seqlen):
                for c in cutlass.range_constexpr(cute.size(scores, mode=[1])):
                    if coords_t0[0, c][1] >= col_limit_seqlen:
                        for r in cutlass.range_constexpr(cute.size(scores, mode=[0])):
                            scores[r, c] = -Float32.inf
        else:
            # Row i (global) sees columns j < i + 1 + seqlen_k - seqlen_q.
            diag_offset = (
                m_block * self.tile_m + thread_row0 + 1 + self.seqlen_k - self.seqlen_q
                - n_block * self.tile_n - thread_col0
            )
            for r in cutlass.range_constexpr(cute.size(scores, mode=[0])):
                col_limit = diag_offset + coords_t0[r, 0][0]
                if cutlass.const_expr(mask_seqlen):
                    col_limit = cutlass.min(col_limit, col_limit_seqlen)
                for c in cutlass.range_constexpr(cute.size(scores, mode=[1])):
                    if coords_t0[0, c][1] >= col_limit:
                        scores[r, c] = -Float32.inf
