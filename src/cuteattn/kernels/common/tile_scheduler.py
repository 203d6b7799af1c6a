"""Tile schedulers: which (m_block, head, batch) work tiles each CTA computes, and in what order.

One protocol for every scheduler, so a kernel's loop is the same for all of them:

    host (in the kernel's @cute.jit __call__):
        counts = ...                     # the scheduler's counts record, see below
        grid = Scheduler.grid_shape(counts, persistent=..., max_ctas=...)  # launch with this
        # pass ``counts`` to the @cute.kernel as an argument (a NamedTuple of Int32)
    device (in the @cute.kernel):
        scheduler = Scheduler.create(counts, longest_first=causal, persistent=...)
        work = scheduler.initial_work_tile()
        while work.is_valid:
            ...compute work.m_block, work.head, work.batch...
            work = scheduler.advance()

Two schedulers:

``SingleTileScheduler`` (counts: ``TileCounts.create(...)``; the sm80 forward). One CTA per work
tile, grid (m_blocks, heads, batches): blockIdx is the work tile, so the launch order the
hardware follows in practice (x fastest) runs the query tiles of one (batch, head) together.
Single tile only: asking it for a persistent launch raises. Its ``is_valid`` is a constant (true,
then false after ``advance``), so the compiler folds the loop into straight-line code. A kernel
that only ever runs one tile per CTA may also take ``initial_work_tile()`` and skip the loop (the
sm80 forward does: the folded loop still perturbed its register allocation and added spills to
its main loop).

``LinearTileScheduler`` (counts: ``make_linear_tile_counts(...)``; the sm90 forward). Work tiles
are numbered along one linear index (``decode_linear_tile``) so that CTAs running at the same time
share K and V in L2: the (batch, head) pairs, batch-major, are cut into sections of
``heads_per_section`` consecutive pairs whose K and V fit in an L2 budget together (the last
section may hold fewer), and a section's tiles are numbered query tile by query tile, every pair
of the section at each, before the next section starts. Single tile: grid (tiles, 1, 1), the
CTA's index is its tile. Persistent: grid (min(max_ctas, tiles), 1, 1), each CTA taking every
grid_dim-th tile until the index runs out; ``max_ctas`` (the SM count, say) comes at run time,
so one compiled kernel fits every SKU.

``longest_first`` is for causal attention: the query tiles with the most key tiles start first
(SingleTileScheduler: m_block counts down the grid; LinearTileScheduler: within each section),
so short ones fill the tail of the launch instead of leaving SMs idle at its end.

Schedulers carry DSL state through the kernel's ``while`` loop via ``__extract_mlir_values__``
and ``__new_from_mlir_values__``; compile-time configuration stays plain Python.
"""

from typing import NamedTuple, Protocol

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64

# K and V of the heads in flight should stay in L2 (50 MB on H100/H200) with room for Q and O.
L2_BUDGET_BYTES = 32 * 1024 * 1024
MAX_SECTION_LOG2 = 15


class WorkTile(NamedTuple):
    m_block: Int32  # query tile index along seqlen_q
    head: Int32  # query head
    batch: Int32
    is_valid: Boolean  # False once the CTA has no more work


class TileCounts(NamedTuple):
    """``SingleTileScheduler``'s counts: how many query tiles, heads and batches a launch has;
    built on the host, passed to the kernel as an argument."""

    num_m_blocks: Int32
    num_heads: Int32
    num_batches: Int32

    @staticmethod
    def create(*, seqlen_q: Int32, tile_m: int, num_heads: Int32, num_batches: Int32) -> "TileCounts":
        return TileCounts(
            num_m_blocks=cute.ceil_div(seqlen_q, tile_m),
            num_heads=num_heads,
            num_batches=num_batches,
        )


class LinearTileCounts(NamedTuple):
    """``LinearTileScheduler``'s counts: built on the host (``make_linear_tile_counts``), passed
    to the kernel as an argument."""

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


class TileScheduler(Protocol):
    @staticmethod
    def grid_shape(
        counts: TileCounts | LinearTileCounts, *, persistent: bool = False, max_ctas=None
    ) -> tuple:
        """Host side: the launch grid (x, y, z). ``max_ctas`` bounds a persistent grid."""

    @classmethod
    def create(
        cls, counts: TileCounts | LinearTileCounts, *, longest_first: bool,
        persistent: bool = False,
    ) -> "TileScheduler":
        """Device side: this CTA's scheduler, at its first work tile."""

    def initial_work_tile(self) -> WorkTile:
        """The CTA's first work tile (invalid if it has none)."""

    def get_current_work(self) -> WorkTile:
        """The work tile the scheduler is at."""

    def advance(self) -> WorkTile:
        """Move to the CTA's next work tile and return it."""


def _single_tile_only(persistent: bool):
    if persistent:
        raise ValueError(
            "SingleTileScheduler runs one tile per CTA; use LinearTileScheduler for a persistent "
            "launch"
        )


class SingleTileScheduler:
    """One CTA per work tile: grid (m_blocks, heads, batches), blockIdx is the work tile."""

    def __init__(self, counts: TileCounts, *, longest_first: bool, done: bool = False):
        self.counts = counts
        self.longest_first = longest_first
        self._done = done  # plain Python: a compile-time constant, so the kernel loop folds

    @staticmethod
    def grid_shape(counts: TileCounts, *, persistent: bool = False, max_ctas=None) -> tuple:
        _single_tile_only(persistent)
        return (counts.num_m_blocks, counts.num_heads, counts.num_batches)

    @classmethod
    def create(
        cls, counts: TileCounts, *, longest_first: bool, persistent: bool = False
    ) -> "SingleTileScheduler":
        _single_tile_only(persistent)
        return cls(counts, longest_first=longest_first)

    def get_current_work(self) -> WorkTile:
        m_block, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.longest_first):
            m_block = self.counts.num_m_blocks - 1 - m_block
        return WorkTile(
            m_block=Int32(m_block), head=Int32(head), batch=Int32(batch),
            is_valid=Boolean(not self._done),
        )

    def initial_work_tile(self) -> WorkTile:
        return self.get_current_work()

    def advance(self) -> WorkTile:
        self._done = True
        return self.get_current_work()

    def __extract_mlir_values__(self):
        return cutlass.extract_mlir_values(self.counts)

    def __new_from_mlir_values__(self, values):
        counts = cutlass.new_from_mlir_values(self.counts, values)
        return SingleTileScheduler(counts, longest_first=self.longest_first, done=self._done)


def decode_linear_tile(tile_idx, counts: LinearTileCounts, *, longest_first: bool):
    """(m_block, head, batch) of a linear work index, for DSL integers and Python ints alike
    (``cutlass.min`` of two ints is the builtin's int).

    Section s holds pairs [s * heads_per_section, (s + 1) * heads_per_section) of the batch-major
    (batch, head) pairs (fewer in the last section); its tiles run query tile by query tile,
    from the last query tile down if ``longest_first``, every pair of the section at each.
    """
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
    """Single tile or persistent over the linear index of ``decode_linear_tile``."""

    def __init__(
        self, counts: LinearTileCounts, *, longest_first: bool, persistent: bool, tile_idx: Int32
    ):
        self.counts = counts
        self.longest_first = longest_first
        self.persistent = persistent
        self._tile_idx = tile_idx

    @staticmethod
    def grid_shape(
        counts: LinearTileCounts, *, persistent: bool = False, max_ctas: Int32 | None = None
    ) -> tuple:
        """``max_ctas``: how many CTAs may be resident at once (e.g. the SM count); a
        persistent grid needs it."""
        tiles = counts.num_tiles()
        if not persistent:
            return (tiles, 1, 1)
        if max_ctas is None:
            raise ValueError("a persistent LinearTileScheduler grid needs max_ctas")
        return (cutlass.min(max_ctas, tiles), 1, 1)

    @classmethod
    def create(
        cls, counts: LinearTileCounts, *, longest_first: bool, persistent: bool = False
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
