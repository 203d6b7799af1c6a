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
            num_cols = cute.size(scores, mode=[1])
            paired = columns_in_pairs([coords_t0[0, c][1] for c in range(num_cols)])
            for r in cutlass.range_constexpr(cute.size(scores, mode=[0])):
                if cutlass.const_expr(self.pack_gqa == 1):
                    col_limit = diag_offset + coords_t0[r, 0][0]
                else:
                    position = (thread_row0 + coords_t0[r, 0][0]) // self.pack_gqa
                    col_limit = diag_offset + position
                if cutlass.const_expr(mask_seqlen):
                    col_limit = cutlass.min(col_limit, col_limit_seqlen)
                if cutlass.const_expr(paired):
                    keep_range(scores, r, None, paired_columns_below(col_limit, num_cols))
                else:
                    for c in cutlass.range_constexpr(num_cols):
                        # A select, not an `if` statement: a runtime `if` becomes a branch
                        # that carries every score written so far (~2000 selects per tile).
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
        num_cols = cute.size(scores, mode=[1])
        paired = columns_in_pairs([coords_t0[0, c][1] for c in range(num_cols)])
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
            # The bounds the compare below applies: col_end unless only the left one is set.
            bounded_end = left < 0 or right >= 0 or mask_seqlen
            if cutlass.const_expr(paired):
                # Kept: columns col_start .. col_end - 1 (either bound open where unset).
                end = num_cols
                if cutlass.const_expr(bounded_end):
                    end = paired_columns_below(col_end, num_cols)
                start = None
                if cutlass.const_expr(left >= 0):
                    start = paired_columns_below(col_start, num_cols)
                keep_range(scores, r, start, end)
            else:
                for c in cutlass.range_constexpr(num_cols):
                    col = coords_t0[0, c][1]
                    if cutlass.const_expr(left >= 0 and bounded_end):
                        hidden = (col >= col_end) | (col < col_start)
                    elif cutlass.const_expr(left >= 0):
                        hidden = col < col_start
                    else:
                        hidden = col >= col_end
                    scores[r, c] = -Float32.inf if hidden else scores[r, c]


# A row's kept columns as a bit mask, 32 per word: ptxas turns the bit tests of one word with
# constant positions into R2P (a word's bits into predicates), so a masked row costs a few
# integer ops and one select per score instead of a compare and a select per score.
MASK_WORD_BITS = 32


def columns_in_pairs(cols: list) -> bool:
    """Whether a thread's columns (thread 0's, compile-time) run 0, 1, 8, 9, 16, 17, ...: the
    mma accumulators' layout (two adjacent columns per 8), which ``paired_columns_below``
    counts in closed form (every thread's columns, relative to its first, run so)."""
    return all(isinstance(col, int) for col in cols) and cols == [
        8 * (c // 2) + c % 2 for c in range(len(cols))
    ]


def paired_columns_below(col_limit: Int32, num_cols: int) -> Int32:
    """How many of the columns 0, 1, 8, 9, ... (``num_cols`` of them) are below col_limit: a
    prefix of the row, since they increase. Plain arithmetic: DSL integers in a kernel, Python
    ints in the CPU tests."""
    pairs = col_limit >> 3  # arithmetic: negative limits give negative counts, clamped below
    count = 2 * pairs + cutlass.min(col_limit & 7, 2)
    return cutlass.max(cutlass.min(count, num_cols), 0)


def _prefix_bits(count, word: int):
    """Word ``word``'s bits of a row's first ``count`` columns (64-bit shift: a whole word, a
    shift by 32, needs no special case)."""
    in_word = cutlass.max(cutlass.min(count - word * MASK_WORD_BITS, MASK_WORD_BITS), 0)
    return cutlass.Uint32((cutlass.Uint64(1) << cutlass.Uint64(in_word)) - cutlass.Uint64(1))


@cute.jit
def keep_range(scores: cute.Tensor, r: cutlass.Constexpr[int], start, end):
    """-inf in row r outside its scores start .. end - 1 (element indices, 0 <= start, end <=
    the row's length; ``start`` None: from the first)."""
    num_cols = cute.size(scores, mode=[1])
    for word in cutlass.range_constexpr(-(-num_cols // MASK_WORD_BITS)):
        bits = _prefix_bits(end, word)
        if cutlass.const_expr(start is not None):
            bits = bits & ~_prefix_bits(start, word)
        for i in cutlass.range_constexpr(min(MASK_WORD_BITS, num_cols - word * MASK_WORD_BITS)):
            c = word * MASK_WORD_BITS + i
            keep = cutlass.Boolean(bits & cutlass.Uint32(1 << i))
            scores[r, c] = scores[r, c] if keep else -Float32.inf
