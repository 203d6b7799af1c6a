"""Which key tiles (n_blocks) a query tile (m_block) visits, and which of them need a mask.

Causal attention is aligned bottom-right: query row i (0-based) sees key j iff
j <= i + seqlen_k - seqlen_q. A query tile iterates its key tiles from the last to the first;
the last one may be partial (seqlen mask) and the ones from ``n_block_causal_start`` up cross
the diagonal and need the causal mask; every tile below it is fully visible to every row of the
query tile. Local windows and split-KV will narrow ``n_block_min`` / ``n_block_max`` here.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from cuteattn.kernels.common.seqlen_info import SeqlenInfo


@dataclass(frozen=True)
class BlockInfo:
    """Compile-time tiling of the attention matrix; the lengths come per work tile."""

    tile_m: int
    tile_n: int
    causal: bool

    @cute.jit
    def n_block_min_max(self, seqlen: SeqlenInfo, m_block: Int32) -> tuple[Int32, Int32]:
        """[n_block_min, n_block_max): the key tiles some row of this query tile can see.

        n_block_max may be <= n_block_min (a causal query tile above the diagonal's start sees
        no key when seqlen_q > seqlen_k).
        """
        n_block_max = cute.ceil_div(seqlen.seqlen_k, self.tile_n)
        if cutlass.const_expr(self.causal):
            last_row_limit = (m_block + 1) * self.tile_m + seqlen.seqlen_k - seqlen.seqlen_q
            n_block_max = cutlass.min(
                n_block_max, cute.ceil_div(cutlass.max(last_row_limit, 0), self.tile_n)
            )
        return Int32(0), n_block_max

    @cute.jit
    def n_block_causal_start(self, seqlen: SeqlenInfo, m_block: Int32) -> Int32:
        """First key tile that some row of this query tile must not fully see."""
        first_row_limit = m_block * self.tile_m + 1 + seqlen.seqlen_k - seqlen.seqlen_q
        return cutlass.max(first_row_limit, 0) // self.tile_n

    @cute.jit
    def m_block_min(self, seqlen: SeqlenInfo, n_block: Int32) -> Int32:
        """The backward's view: the first query tile with a row that sees some key of key tile
        ``n_block`` (causal; 0 otherwise). Every later query tile sees it too."""
        m_block_min = Int32(0)
        if cutlass.const_expr(self.causal):
            first_row = n_block * self.tile_n - seqlen.seqlen_k + seqlen.seqlen_q
            m_block_min = cutlass.max(first_row, 0) // self.tile_m
        return m_block_min

    @cute.jit
    def needs_mask(self, seqlen: SeqlenInfo, m_block: Int32, n_block: Int32):
        """Whether tile (m_block, n_block) hides a key from a row: keys past seqlen_k (only in
        the last key tile) or, causal, a key above some row's diagonal (the tile's last key
        against its first row)."""
        needs_mask = (n_block + 1) * self.tile_n > seqlen.seqlen_k
        if cutlass.const_expr(self.causal):
            needs_mask = needs_mask | (
                n_block >= self.n_block_causal_start(seqlen, m_block)
            )
        return needs_mask

