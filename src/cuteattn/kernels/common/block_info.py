"""Which key tiles (n_blocks) a query tile (m_block) visits, and which of them need a mask.

Causal attention is aligned bottom-right: query row i (0-based) sees key j iff
j <= i + seqlen_k - seqlen_q. A query tile iterates its key tiles from the last to the first;
the last one may be partial (seqlen mask) and the ones from ``n_block_causal_start`` up cross
the diagonal and need the causal mask; every tile below it is fully visible to every row of the
query tile.

A local window (left, right) (flash-attn's ``window_size``; -1 unbounded) lets row i see keys
i + shift - left <= j <= i + shift + right, shift = seqlen_k - seqlen_q. Its query tile visits
the key tiles [n_block_min, n_block_max) only, so the cost follows the window, not seqlen_k;
the tiles across the right bound (from ``n_block_right_mask_start`` up) and across the left
bound (below ``n_block_left_mask_end``) are masked, the ones between are not
(``window_tile_counts``). Split-KV will narrow the range here too.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32

from cuteattn.kernels.common.seqlen_info import SeqlenInfo


@dataclass(frozen=True)
class BlockInfo:
    """Compile-time tiling of the attention matrix and mask; the lengths come per work tile.

    ``window``: a local window's (left, right), each >= 0 or -1 for unbounded, or None (then
    ``causal`` says whether the mask is causal; a plan never has both).
    """

    tile_m: int
    tile_n: int
    causal: bool
    window: tuple[int, int] | None = None

    @property
    def window_left(self) -> int | None:
        """The window's left bound, None when unbounded (or no window)."""
        return None if self.window is None or self.window[0] < 0 else self.window[0]

    @property
    def window_right(self) -> int | None:
        """The window's right bound, None when unbounded (or no window)."""
        return None if self.window is None or self.window[1] < 0 else self.window[1]

    @cute.jit
    def n_block_min_max(self, seqlen: SeqlenInfo, m_block: Int32) -> tuple[Int32, Int32]:
        """[n_block_min, n_block_max): the key tiles some row of this query tile can see.

        n_block_max may be <= n_block_min (a causal query tile above the diagonal's start sees
        no key when seqlen_q > seqlen_k; a window may hold no key of a query tile).
        """
        n_block_max = cute.ceil_div(seqlen.seqlen_k, self.tile_n)
        n_block_min = Int32(0)
        if cutlass.const_expr(self.causal):
            last_row_limit = (m_block + 1) * self.tile_m + seqlen.seqlen_k - seqlen.seqlen_q
            n_block_max = cutlass.min(
                n_block_max, cute.ceil_div(cutlass.max(last_row_limit, 0), self.tile_n)
            )
        if cutlass.const_expr(self.window_right is not None):
            last_row_limit = (
                (m_block + 1) * self.tile_m + seqlen.seqlen_k - seqlen.seqlen_q
                + self.window_right
            )
            n_block_max = cutlass.min(
                n_block_max, cute.ceil_div(cutlass.max(last_row_limit, 0), self.tile_n)
            )
        if cutlass.const_expr(self.window_left is not None):
            first_key = m_block * self.tile_m + seqlen.seqlen_k - seqlen.seqlen_q - self.window_left
            n_block_min = cutlass.max(first_key, 0) // self.tile_n
        return n_block_min, n_block_max

    @cute.jit
    def window_tile_counts(
        self, seqlen: SeqlenInfo, m_block: Int32, n_block_min: Int32, n_block_max: Int32
    ) -> tuple[Int32, Int32, Int32]:
        """A windowed query tile's key tiles after its first one (n_block_max - 1, always
        masked), from the last down: (masked across the right bound, unmasked, masked across
        the left bound). A tile across both bounds counts as right-masked; every masked tile
        takes both bounds (``AttentionMask`` with a window)."""
        shift = seqlen.seqlen_k - seqlen.seqlen_q
        right_start = n_block_max  # no right bound: only the seqlen mask, on the first tile
        if cutlass.const_expr(self.window_right is not None):
            # The first row's first hidden key on the right.
            first_hidden = m_block * self.tile_m + 1 + shift + self.window_right
            right_start = cutlass.max(first_hidden, 0) // self.tile_n
        left_end = n_block_min
        if cutlass.const_expr(self.window_left is not None):
            # The last row's first visible key: tiles starting before it hide keys.
            last_visible = (m_block + 1) * self.tile_m - 1 + shift - self.window_left
            left_end = cute.ceil_div(cutlass.max(last_visible, 0), self.tile_n)
        high_start = cutlass.min(
            cutlass.max(cutlass.max(right_start, left_end), n_block_min), n_block_max - 1
        )
        low_end = cutlass.min(cutlass.max(left_end, n_block_min), high_start)
        return n_block_max - 1 - high_start, high_start - low_end, low_end - n_block_min

    @cute.jit
    def n_block_causal_start(self, seqlen: SeqlenInfo, m_block: Int32) -> Int32:
        """First key tile that some row of this query tile must not fully see."""
        first_row_limit = m_block * self.tile_m + 1 + seqlen.seqlen_k - seqlen.seqlen_q
        return cutlass.max(first_row_limit, 0) // self.tile_n

    @cute.jit
    def m_block_min(self, seqlen: SeqlenInfo, n_block: Int32) -> Int32:
        """The backward's view: the first query tile with a row that sees some key of key tile
        ``n_block`` (causal, or a window's right bound; 0 otherwise). Without a left bound
        every later query tile sees it too (``m_block_max``)."""
        m_block_min = Int32(0)
        if cutlass.const_expr(self.causal):
            first_row = n_block * self.tile_n - seqlen.seqlen_k + seqlen.seqlen_q
            m_block_min = cutlass.max(first_row, 0) // self.tile_m
        if cutlass.const_expr(self.window_right is not None):
            first_row = (
                n_block * self.tile_n - seqlen.seqlen_k + seqlen.seqlen_q - self.window_right
            )
            m_block_min = cutlass.max(first_row, 0) // self.tile_m
        return m_block_min

    @cute.jit
    def m_block_max(self, seqlen: SeqlenInfo, n_block: Int32) -> Int32:
        """The backward's view: one past the last query tile with a row that sees some key of
        key tile ``n_block`` (a window's left bound cuts it; else the last query tile)."""
        m_block_max = cute.ceil_div(seqlen.seqlen_q, self.tile_m)
        if cutlass.const_expr(self.window_left is not None):
            # The last row that sees the tile's last key, plus one.
            row_end = (
                (n_block + 1) * self.tile_n - seqlen.seqlen_k + seqlen.seqlen_q + self.window_left
            )
            m_block_max = cutlass.min(
                m_block_max, cute.ceil_div(cutlass.max(row_end, 0), self.tile_m)
            )
        return m_block_max

    @cute.jit
    def needs_mask(self, seqlen: SeqlenInfo, m_block: Int32, n_block: Int32):
        """Whether tile (m_block, n_block) hides a key from a row: keys past seqlen_k (only in
        the last key tile) or, causal, a key above some row's diagonal (the tile's last key
        against its first row); a window: a key past either bound of some row (its right
        bound for the first row, its left bound for the last)."""
        needs_mask = (n_block + 1) * self.tile_n > seqlen.seqlen_k
        if cutlass.const_expr(self.causal):
            needs_mask = needs_mask | (
                n_block >= self.n_block_causal_start(seqlen, m_block)
            )
        if cutlass.const_expr(self.window is not None):
            needs_mask = needs_mask | self.hides_window_keys(seqlen, m_block, n_block)
        return needs_mask

    @cute.jit
    def hides_window_keys(self, seqlen: SeqlenInfo, m_block: Int32, n_block: Int32):
        """Whether a window bound hides a key of tile (m_block, n_block) from one of its rows:
        the right bound of its first row, or the left bound of its last."""
        hides = Boolean(False)
        shift = seqlen.seqlen_k - seqlen.seqlen_q
        if cutlass.const_expr(self.window_right is not None):
            first_row_end = m_block * self.tile_m + shift + self.window_right + 1
            hides = hides | ((n_block + 1) * self.tile_n > first_row_end)
        if cutlass.const_expr(self.window_left is not None):
            last_row_start = (m_block + 1) * self.tile_m - 1 + shift - self.window_left
            hides = hides | (n_block * self.tile_n < last_row_start)
        return hides

