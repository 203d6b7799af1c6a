"""Tile schedulers: which (m_block, head, batch) work tiles each CTA computes, and in what order.

One protocol for every scheduler, so a kernel's loop is the same for all of them:

    host (in the kernel's @cute.jit __call__):
        counts = TileCounts.create(seqlen_q=..., tile_m=..., num_heads=..., num_batches=...)
        grid = Scheduler.grid_shape(counts, max_ctas=...)    # launch with this grid
        # pass ``counts`` to the @cute.kernel as an argument (a NamedTuple of Int32)
    device (in the @cute.kernel):
        scheduler = Scheduler.create(counts, longest_first=causal)
        work = scheduler.initial_work_tile()
        while work.is_valid:
            ...compute work.m_block, work.head, work.batch...
            work = scheduler.advance()

``SingleTileScheduler`` launches one CTA per work tile. Its ``is_valid`` is a constant (true,
then false after ``advance``), so the compiler folds the loop into straight-line code. A kernel
that only ever runs one tile per CTA may also take ``initial_work_tile()`` and skip the loop
(the sm80 forward does: the folded loop still perturbed its register allocation and added
spills to its main loop). ``PersistentTileScheduler`` launches at most ``max_ctas`` CTAs (one
per SM, say), each striding over a linearised work space.

``longest_first`` is for causal attention: the query tiles with the most key tiles start first,
so short ones fill the tail of the launch instead of leaving SMs idle at its end.

Schedulers carry DSL state through the kernel's ``while`` loop via ``__extract_mlir_values__``
and ``__new_from_mlir_values__``; compile-time configuration stays plain Python.
"""

from typing import NamedTuple, Protocol

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32


class WorkTile(NamedTuple):
    m_block: Int32  # query tile index along seqlen_q
    head: Int32  # query head
    batch: Int32
    is_valid: Boolean  # False once the CTA has no more work


class TileCounts(NamedTuple):
    """How many query tiles, heads and batches a launch has; built on the host, passed to the
    kernel as an argument."""

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


class TileScheduler(Protocol):
    @staticmethod
    def grid_shape(counts: TileCounts, *, max_ctas=None) -> tuple:
        """Host side: the launch grid (x, y, z)."""

    @classmethod
    def create(cls, counts: TileCounts, *, longest_first: bool) -> "TileScheduler":
        """Device side: this CTA's scheduler, at its first work tile."""

    def initial_work_tile(self) -> WorkTile:
        """The CTA's first work tile (invalid if it has none)."""

    def get_current_work(self) -> WorkTile:
        """The work tile the scheduler is at."""

    def advance(self) -> WorkTile:
        """Move to the CTA's next work tile and return it."""


class SingleTileScheduler:
    """One CTA per work tile: grid (m_blocks, heads, batches), blockIdx is the work tile."""

    def __init__(self, counts: TileCounts, *, longest_first: bool, done: bool = False):
        self.counts = counts
        self.longest_first = longest_first
        self._done = done  # plain Python: a compile-time constant, so the kernel loop folds

    @staticmethod
    def grid_shape(counts: TileCounts, *, max_ctas=None) -> tuple:
        return (counts.num_m_blocks, counts.num_heads, counts.num_batches)

    @classmethod
    def create(cls, counts: TileCounts, *, longest_first: bool) -> "SingleTileScheduler":
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


def decode_tile_index(tile_idx, counts: TileCounts, *, longest_first: bool):
    """(m_block, head, batch) of a linear work index, for DSL integers and Python ints alike.

    Longest first (causal): m_block is the slowest index, from the last (longest) query tile
    down, and within one m_block the heads of a batch are adjacent, so CTAs running together on
    a GQA group share its K and V in L2. Otherwise m_block is the fastest index: the CTAs running
    together are query tiles of one (batch, head) and share its K and V in L2.
    """
    if longest_first:
        tiles_per_m_block = counts.num_heads * counts.num_batches
        m_rank = tile_idx // tiles_per_m_block
        batch_head = tile_idx - m_rank * tiles_per_m_block
        batch = batch_head // counts.num_heads
        head = batch_head - batch * counts.num_heads
        m_block = counts.num_m_blocks - 1 - m_rank
    else:
        batch_head = tile_idx // counts.num_m_blocks
        m_block = tile_idx - batch_head * counts.num_m_blocks
        batch = batch_head // counts.num_heads
        head = batch_head - batch * counts.num_heads
    return m_block, head, batch


class PersistentTileScheduler:
    """At most ``max_ctas`` CTAs (grid x), each taking every grid_dim-th work tile of the
    linearised space of ``decode_tile_index``, until the space is exhausted."""

    def __init__(self, counts: TileCounts, *, longest_first: bool, tile_idx: Int32):
        self.counts = counts
        self.longest_first = longest_first
        self._tile_idx = tile_idx

    @staticmethod
    def num_tiles(counts: TileCounts):
        return counts.num_m_blocks * counts.num_heads * counts.num_batches

    @staticmethod
    def grid_shape(counts: TileCounts, *, max_ctas) -> tuple:
        """``max_ctas``: how many CTAs may be resident at once (e.g. the SM count), given at
        run time so one compiled kernel fits every SKU."""
        return (cutlass.min(max_ctas, PersistentTileScheduler.num_tiles(counts)), 1, 1)

    @classmethod
    def create(cls, counts: TileCounts, *, longest_first: bool) -> "PersistentTileScheduler":
        return cls(counts, longest_first=longest_first, tile_idx=Int32(cute.arch.block_idx()[0]))

    def get_current_work(self) -> WorkTile:
        m_block, head, batch = decode_tile_index(
            self._tile_idx, self.counts, longest_first=self.longest_first
        )
        return WorkTile(
            m_block=Int32(m_block), head=Int32(head), batch=Int32(batch),
            is_valid=Boolean(self._tile_idx < self.num_tiles(self.counts)),
        )

    def initial_work_tile(self) -> WorkTile:
        return self.get_current_work()

    def advance(self) -> WorkTile:
        self._tile_idx = self._tile_idx + Int32(cute.arch.grid_dim()[0])
        return self.get_current_work()

    def __extract_mlir_values__(self):
        return cutlass.extract_mlir_values((self.counts, self._tile_idx))

    def __new_from_mlir_values__(self, values):
        counts, tile_idx = cutlass.new_from_mlir_values((self.counts, self._tile_idx), values)
        return PersistentTileScheduler(counts, longest_first=self.longest_first, tile_idx=tile_idx)
