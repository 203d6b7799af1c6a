"""A tile scheduler over one linear work index, in L2-sized sections, single-tile or persistent.

Work tiles (m_block, head, batch) are numbered so that CTAs running at the same time share K
and V in L2: the (batch, head) pairs are cut into sections of ``heads_per_section`` pairs whose
K and V fit in the L2 budget together, and a section's tiles are numbered query tile by query
tile, every pair of the section at each. With ``longest_first`` (causal) query tiles are taken
from the last one down: the longest tiles start first and short ones fill the tail.

Single tile: grid (number of tiles, 1, 1), the CTA's index is its tile. Persistent: grid
(min(max_ctas, tiles), 1, 1); each CTA takes every grid_dim-th tile.

Same protocol as ``tile_scheduler`` (``create``, ``initial_work_tile``, ``advance``).
"""

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64

from cuteattn.kernels.common.tile_scheduler import WorkTile

# K and V of the heads in flight should stay in L2 (50 MB on H100/H200) with room for Q and O.
L2_BUDGET_BYTES = 32 * 1024 * 1024
MAX_SECTION_LOG2 = 15


class LinearTileCounts(NamedTuple):
    """Built on the host (``make_linear_tile_counts``), passed to the kernel as an argument."""

    num_m_blocks: Int32
    num_heads: Int32
    num_batches: Int32
    heads_per_section: Int32  # (batch, head) pairs per L2 section, a power of two

    def num_tiles(self):
        return self.num_m_blocks * self.num_heads * self.num_batches


@cute.jit
def make_linear_tile_counts(
    *, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int], num_heads: Int32,
    num_batches: Int32, kv_bytes_per_key: cutlass.Constexpr[int],
) -> LinearTileCounts:
    """Host side. kv_bytes_per_key: bytes of K and V per key of one head (2 * dim * elem)."""
    head_bytes = cutlass.max(Int64(seqlen_k) * kv_bytes_per_key, Int64(1))
    fit = Int64(L2_BUDGET_BYTES) // head_bytes
    # Largest power of two <= fit, at least 1.
    heads = Int32(1)
    for bit in cutlass.range_constexpr(1, MAX_SECTION_LOG2 + 1):
        if fit >= (1 << bit):
            heads = Int32(1 << bit)
    return LinearTileCounts(
        num_m_blocks=cute.ceil_div(seqlen_q, tile_m),
        num_heads=num_heads,
        num_batches=num_batches,
        heads_per_section=heads,
    )


def decode_linear_tile(tile_idx, counts: LinearTileCounts, *, longest_first: bool):
    """(m_block, head, batch) of a linear work index (DSL integers or Python ints)."""
    num_pairs = counts.num_heads * counts.num_batches
    section_tiles = counts.heads_per_section * counts.num_m_blocks
    section = tile_idx // section_tiles
    in_section = tile_idx - section * section_tiles
    first_pair = section * counts.heads_per_section
    # The last section may hold fewer pairs.
    pairs_here = cutlass.min(counts.heads_per_section, num_pairs - first_pair)
    m_rank = in_section // pairs_here
    pair = first_pair + in_section - m_rank * pairs_here
    m_block = counts.num_m_blocks - 1 - m_rank if longest_first else m_rank
    batch = pair // counts.num_heads
    head = pair - batch * counts.num_heads
    return m_block, head, batch


class LinearTileScheduler:
    def __init__(
        self, counts: LinearTileCounts, *, longest_first: bool, persistent: bool, tile_idx: Int32
    ):
        self.counts = counts
        self.longest_first = longest_first
        self.persistent = persistent
        self._tile_idx = tile_idx

    @staticmethod
    def grid_shape(counts: LinearTileCounts, *, persistent: bool, max_ctas: Int32) -> tuple:
        tiles = counts.num_tiles()
        return (cutlass.min(max_ctas, tiles) if persistent else tiles, 1, 1)

    @classmethod
    def create(
        cls, counts: LinearTileCounts, *, longest_first: bool, persistent: bool
    ) -> "LinearTileScheduler":
        return cls(
            counts, longest_first=longest_first, persistent=persistent,
            tile_idx=Int32(cute.arch.block_idx()[0]),
        )

    def get_current_work(self) -> WorkTile:
        m_block, head, batch = decode_linear_tile(
            self._tile_idx, self.counts, longest_first=self.longest_first
        )
        return WorkTile(
            m_block=Int32(m_block), head=Int32(head), batch=Int32(batch),
            is_valid=Boolean(self._tile_idx < self.counts.num_tiles()),
        )

    def initial_work_tile(self) -> WorkTile:
        return self.get_current_work()

    def advance(self) -> WorkTile:
        if cutlass.const_expr(self.persistent):
            self._tile_idx = self._tile_idx + Int32(cute.arch.grid_dim()[0])
        else:
            self._tile_idx = self.counts.num_tiles()  # one tile per CTA
        return self.get_current_work()

    def __extract_mlir_values__(self):
        return cutlass.extract_mlir_values((self.counts, self._tile_idx))

    def __new_from_mlir_values__(self, values):
        counts, tile_idx = cutlass.new_from_mlir_values((self.counts, self._tile_idx), values)
        return LinearTileScheduler(
            counts, longest_first=self.longest_first, persistent=self.persistent,
            tile_idx=tile_idx,
        )
