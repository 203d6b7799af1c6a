"""Masks applied to a score tile held in an mma accumulator.

Positions outside the visible set are set to -inf before the online softmax. Coordinates come
from an identity tensor partitioned like the accumulator; thread 0's coordinates are known at
compile time, so each comparison is a constant against a per-thread limit.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cuteattn.kernels.common.fragments import acc_as_rows_cols, tile_coords
from cuteattn.kernels.common.seqlen_info import SeqlenInfo


class AttentionMask:
    def __init__(
        self, *, tile_m: int, tile_n: int, seqlen: SeqlenInfo, pack_gqa: int = 1,
        window: tuple[int, int] | None = None,
    ):
        """tile_m: query positions per tile; pack_gqa: rows per position (packed GQA: row i
        of a tile is position i // pack_gqa of a head of the group), 1 otherwise. window: a
        local window's (left, right), -1 unbounded (``BlockInfo``); ``mask_causal`` then
        applies its bounds."""
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.seqlen = seqlen
        self.pack_gqa = pack_gqa
        self.window = window

    @cute.jit
    def apply(
        self,
        acc_S: cute.Tensor,
        thr_mma: cute.ThrMma,
        m_block: Int32,
        n_block: Int32,
        *,
        mask_seqlen: cutlass.Constexpr[bool],
        mask_causal: cutlass.Constexpr[bool],
    ):
        scores = acc_as_rows_cols(acc_S)
        tile_mn = (self.tile_m * self.pack_gqa, self.tile_n)
        coords = tile_coords(thr_mma, tile_mn)
        coords_t0 = tile_coords(thr_mma.get_slice(0), tile_mn)
        thread_row0 = coords[0, 0][0]
        thread_col0 = coords[0, 0][1]
        seqlen_q, seqlen_k = self.seqlen.seqlen_q, self.seqlen.seqlen_k
        # Column limits relative to this thread's first column, so the loop compares constants.
        col_limit_seqlen = seqlen_k - n_block * self.tile_n - thread_col0
        if cutlass.const_expr(mask_causal and self.window is not None):
            self._apply_window(
                scores, coords_t0, thread_row0, thread_col0, m_block, n_block,
                col_limit_seqlen, mask_seqlen=mask_seqlen,
            )
        elif cutlass.const_expr(not mask_causal):
            if cutlass.const_expr(mask_seqlen):
                for c in cutlass.range_constexpr(cute.size(scores, mode=[1])):
                    if coords_t0[0, c][1] >= col_limit_seqlen:
                        for r in cutlass.range_constexpr(cute.size(scores, mode=[0])):
                            scores[r, c] = -Float32.inf
        else:
            # Row i (global) sees columns j < i + 1 + seqlen_k - seqlen_q.
            # Packed GQA: row i is at position i // pack_gqa (one division per row).
            first_row = thread_row0 if cutlass.const_expr(self.pack_gqa == 1) else 0
            diag_offset = (
                m_block * self.tile_m + first_row + 1 + seqlen_k - seqlen_q
                - n_block * self.tile_n - thread_col0
            )
            for r in cutlass.range_constexpr(cute.size(scores, mode=[0])):
                if cutlass.const_expr(self.pack_gqa == 1):
                    col_limit = diag_offset + coords_t0[r, 0][0]
                else:
                    position = (thread_row0 + coords_t0[r, 0][0]) // self.pack_gqa
                    col_limit = diag_offset + position
                if cutlass.const_expr(mask_seqlen):
                    col_limit = cutlass.min(col_limit, col_limit_seqlen)
                for c in cutlass.range_constexpr(cute.size(scores, mode=[1])):
                    # A select, not an `if` statement: a runtime `if` becomes a branch that
                    # carries every score written so far (~2000 selects per tile, not 64).
                    scores[r, c] = (
                        -Float32.inf if coords_t0[0, c][1] >= col_limit else scores[r, c]
                    )

    @cute.jit
    def _apply_window(
        self, scores, coords_t0, thread_row0, thread_col0, m_block: Int32, n_block: Int32,
        col_limit_seqlen, *, mask_seqlen: cutlass.Constexpr[bool],
    ):
        """Hide the keys outside row i's window: j < i + shift - left or j > i + shift + right
        (and past seqlen_k when ``mask_seqlen``)."""
        left, right = self.window
        first_row = thread_row0 if cutlass.const_expr(self.pack_gqa == 1) else 0
        # The key aligned with this thread's first row, relative to its first column.
        diag = (
            m_block * self.tile_m + first_row + self.seqlen.seqlen_k - self.seqlen.seqlen_q
            - n_block * self.tile_n - thread_col0
        )
        for r in cutlass.range_constexpr(cute.size(scores, mode=[0])):
            if cutlass.const_expr(self.pack_gqa == 1):
                row_diag = diag + coords_t0[r, 0][0]
            else:
                row_diag = diag + (thread_row0 + coords_t0[r, 0][0]) // self.pack_gqa
            col_end = col_limit_seqlen
            if cutlass.const_expr(right >= 0):
                col_end = row_diag + (right + 1)
                if cutlass.const_expr(mask_seqlen):
                    col_end = cutlass.min(col_end, col_limit_seqlen)
            col_start = row_diag - left
            for c in cutlass.range_constexpr(cute.size(scores, mode=[1])):
                col = coords_t0[0, c][1]
                if cutlass.const_expr(left >= 0 and (right >= 0 or mask_seqlen)):
                    hidden = (col >= col_end) | (col < col_start)
                elif cutlass.const_expr(left >= 0):
                    hidden = col < col_start
                else:
                    hidden = col >= col_end
                scores[r, c] = -Float32.inf if hidden else scores[r, c]

