"""Which key tiles (n_blocks) a query tile (m_block) visits, and which of them need a mask.

Causal attention is aligned bottom-right: query row i (0-based) sees key j iff
j <= i + seqlen_k - seqlen_q. A query tile iterates its key tiles from the last to the first;
the last one may be partial (seqlen mask) and the ones crossing the diagonal need the causal
mask; every tile below ``n_block_causal_start`` is fully visible to every row of the query tile.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32


class BlockRange:
    def __init__(self, tile_m: int, tile_n: int, causal: bool, seqlen_q: Int32, seqlen_k: Int32):
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal
        self.seqlen_q = seqlen_q
        self.seqlen_k = seqlen_k

    @cute.jit
    def n_block_max(self, m_block: Int32) -> Int32:
        """One past the last key tile any row of this query tile can see (may be <= 0)."""
        n_block_max = cute.ceil_div(self.seqlen_k, self.tile_n)
        if cutlass.const_expr(self.causal):
            last_row_limit = (m_block + 1) * self.tile_m + self.seqlen_k - self.seqlen_q
            n_block_max = cutlass.min(
                n_block_max, cute.ceil_div(cutlass.max(last_row_limit, 0), self.tile_n)
            )
        return n_block_max

    @cute.jit
    def n_block_causal_start(self, m_block: Int32) -> Int32:
        """First key tile that some row of this query tile must not fully see."""
        first_row_limit = m_block * self.tile_m + 1 + self.seqlen_k - self.seqlen_q
        return cutlass.max(first_row_limit, 0) // self.tile_n
