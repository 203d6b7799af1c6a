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

Three schedulers:

``SingleTileScheduler`` (counts: ``TileCounts.create(...)``; the sm80 forward). One CTA per work
tile, grid (m_blocks, heads, batches): blockIdx is the work tile, so the launch order the
hardware follows in practice (x fastest) runs the query tiles of one (batch, head) together.
Single tile only: asking it for a persistent launch raises. Its ``is_valid`` is a constant (true,
then false after ``advance``), so the compiler folds the loop into straight-line code. A kernel
that only ever runs one tile per CTA may also take ``initial_work_tile()`` and skip the loop (the
sm80 forward does: the folded loop still perturbed its register allocation and added spills to
its main loop).

``LinearTileScheduler`` (counts: ``make_linear_tile_counts(...)``; the sm90 forward; the sm90
backward's key tiles in the same order: deterministic, ``turns.make_section_counts``, causal,
``make_tail_section_counts``). Work tiles
are numbered along one linear index (``decode_linear_tile``) so that CTAs running at the same time
share K and V in L2: the (batch, head) pairs, batch-major, are cut into sections of
``heads_per_section`` consecutive pairs whose K and V fit in an L2 budget together (the last
section may hold fewer), and a section's tiles are numbered query tile by query tile, every pair
of the section at each, before the next section starts. Single tile: grid (tiles, 1, 1), the
CTA's index is its tile. Persistent: grid (min(max_ctas, tiles), 1, 1), each CTA taking every
grid_dim-th tile until the index runs out; ``max_ctas`` (the SM count, say) comes at run time,
so one compiled kernel fits every SKU.

``VarlenTileScheduler`` (counts: ``make_varlen_tile_counts(...)``; the sm90 kernels' packed
batches). A packed batch's sequences have tiles of their own lengths; a grid over the longest
sequence's tiles for every sequence would launch mostly CTAs with nothing to do (17 sequences of
mixed lengths: two in three). Its work tiles are numbered sequence by sequence, each sequence's
heads one after another, its tiles fastest (``varlen_tile_order`` in plain Python): grid
(num_tiles_bound * heads, 1, 1), an upper bound on the tiles of every sequence together that
needs no host sync (``make_varlen_tile_counts``: never more than a grid over the longest
sequence); each CTA finds its sequence by a warp-wide scan of the tile counts
(``decode_varlen_tile``, 32 sequences a pass), and the CTAs past the last tile get an invalid
work tile. Single tile, or persistent like ``LinearTileScheduler`` (grid (min(max_ctas,
bound), 1, 1), every grid_dim-th work tile, each warp resuming its scan at its last tile's
sequence: the sm90 forward). ``sequences_longest_first`` (up to 32 sequences; the sm90
backward): the sequences in order of their tile counts, most first, so that a launch ends on
the short sequences' tiles (simulated on the benchmark's 17 sequences, 132 SMs: the dense
backward's last wave 2.9% past an even split in the given order, 0.3% longest first; measured
on the H200, docs/PERF.md fourteenth session: d128 dense +1%). The sm90 forward keeps the given
order: the simulation promised its persistent static stride 8.6% -> 2.2% at d128, the H200
measured 2-3% slower (within the between-process noise, no gain).

``longest_first`` is for causal attention: the query tiles with the most key tiles start first
(SingleTileScheduler: m_block counts down the grid; LinearTileScheduler: within each section;
VarlenTileScheduler: within each sequence),
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
    # The kernels' divisions by precomputed divisors (``with_divisors``, which relies on the
    # power of two; at least one query tile and one head); None: plain integer division.
    divisors: "LinearDivisors | None" = None

    def with_divisors(self) -> "LinearTileCounts":
        """These counts with their divisors (host side, in a jit function)."""
        return self._replace(divisors=LinearDivisors.create(self))

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
    ).with_divisors()


# Work tiles of a section that takes turns at each rank (``decode_linear_tile``) so that the
# heaviest come first: about one per SM of an H100 / H200 (132).
TAIL_SECTION_TILES = 128


@cute.jit
def make_tail_section_counts(
    *, num_ranks: Int32, num_heads: Int32, num_batches: Int32, group: Int32
) -> LinearTileCounts:
    """Host side: a causal backward's work tiles (key tile, KV head, batch), key tiles in the
    role of the query tiles, in sections of ``LinearTileScheduler``'s order, so that the
    heaviest key tiles (key tile 0 visits every query tile) of all the launch's pairs come
    first. In grid order each pair's key tiles come in a row, and where a key tile's work is
    large (GQA: ``group`` query heads of each query tile) the last pairs' key tile 0 starts
    near the launch's end: 12% of a d128 8k 32 / 4 launch idle at its end, 1% in sections of
    2 pairs, 0.3% of 4 (``scripts/simulate_tails.py --heads-kv``). A section holds the fewest
    pairs (a power of two) whose key tiles reach ``TAIL_SECTION_TILES``; MHA (``group`` 1)
    keeps one pair a section: the grid order, which L2-sized sections did not beat there
    (wip/README.md: tile-order, ninth session; bwd-sections-always, eighteenth session)."""
    heads = Int32(1)
    if group > 1:
        for bit in cutlass.range_constexpr(1, MAX_SECTION_LOG2 + 1):
            if num_ranks * (1 << (bit - 1)) < TAIL_SECTION_TILES:
                heads = Int32(1 << bit)
    return LinearTileCounts(
        num_m_blocks=num_ranks,
        num_heads=num_heads,
        num_batches=num_batches,
        heads_per_section=heads,
    ).with_divisors()


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


def _launch_grid(tiles, persistent: bool, max_ctas, scheduler: str) -> tuple:
    """One CTA per work tile, or, persistent, at most ``max_ctas`` (the CTAs resident at once,
    e.g. the SM count: it comes at run time, so one compiled kernel fits every SKU)."""
    if not persistent:
        return (tiles, 1, 1)
    if max_ctas is None:
        raise ValueError(f"a persistent {scheduler} grid needs max_ctas")
    return (cutlass.min(max_ctas, tiles), 1, 1)


class _StridedWalk:
    """A CTA's walk over a linear work index: persistent, every grid_dim-th index from its
    block index; single tile, its block index, then done (``_finish``)."""

    persistent: bool
    _tile_idx: Int32

    def initial_work_tile(self) -> WorkTile:
        return self.get_current_work()

    def advance(self) -> WorkTile:
        if cutlass.const_expr(self.persistent):
            self._tile_idx = self._tile_idx + Int32(cute.arch.grid_dim()[0])
        else:
            self._finish()
        return self.get_current_work()


class SingleTileScheduler(_StridedWalk):
    """One CTA per work tile: grid (m_blocks, heads, batches), blockIdx is the work tile."""

    persistent = False

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

    def _finish(self):
        self._done = True

    def get_current_work(self) -> WorkTile:
        m_block, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.longest_first):
            m_block = self.counts.num_m_blocks - 1 - m_block
        return WorkTile(
            m_block=Int32(m_block), head=Int32(head), batch=Int32(batch),
            is_valid=Boolean(not self._done),
        )

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


class LinearDivisors(NamedTuple):
    """``LinearTileCounts``' divisors for ``decode_linear_tile_fast`` (multiply-and-shift
    divisions instead of the integer divisions' emulation, about 100 instructions each, on
    the consumers' path between tiles), made on the host (``create``, in the launching jit
    function): the query tiles, the heads, a section's pairs (a power of two) and the last
    section's pairs."""

    m_blocks: cute.FastDivmodDivisorV2
    heads: cute.FastDivmodDivisorV2
    section_pairs: cute.FastDivmodDivisorV2
    last_pairs: cute.FastDivmodDivisorV2

    @staticmethod
    def create(counts: LinearTileCounts) -> "LinearDivisors":
        num_pairs = counts.num_heads * counts.num_batches
        # Pairs in the last section: 1 .. heads_per_section (a power of two).
        last_pairs = ((num_pairs - 1) & (counts.heads_per_section - 1)) + 1
        return LinearDivisors(
            m_blocks=cute.fast_divmod_create_divisor_v2(counts.num_m_blocks),
            heads=cute.fast_divmod_create_divisor_v2(counts.num_heads),
            section_pairs=cute.FastDivmodDivisorV2(counts.heads_per_section, is_power_of_2=True),
            last_pairs=cute.fast_divmod_create_divisor_v2(last_pairs),
        )


@cute.jit
def decode_linear_tile_fast(
    tile_idx: Int32, counts: LinearTileCounts, divisors: LinearDivisors,
    longest_first: cutlass.Constexpr[bool],
):
    """``decode_linear_tile`` in a kernel, its divisions by precomputed divisors: the section
    is floor(floor(tile_idx / heads_per_section) / num_m_blocks), the query tile and pair
    within it a division by the section's pairs (heads_per_section, or the last section's)."""
    num_pairs = counts.num_heads * counts.num_batches
    section = (tile_idx // divisors.section_pairs) // divisors.m_blocks
    in_section = tile_idx - section * (counts.heads_per_section * counts.num_m_blocks)
    first_pair = section * counts.heads_per_section
    # Both divisions (a shift and a multiply), then a select: no branch.
    full_m_rank, full_pair_rank = divmod(in_section, divisors.section_pairs)
    last_m_rank, last_pair_rank = divmod(in_section, divisors.last_pairs)
    last = first_pair + counts.heads_per_section > num_pairs
    m_rank = Int32(cutlass.select_(last, last_m_rank, full_m_rank))
    pair_rank = Int32(cutlass.select_(last, last_pair_rank, full_pair_rank))
    m_block = m_rank
    if cutlass.const_expr(longest_first):
        m_block = counts.num_m_blocks - 1 - m_rank
    batch, head = divmod(first_pair + pair_rank, divisors.heads)
    return m_block, head, batch


def linear_work_tile(tile_idx, counts: LinearTileCounts, longest_first: bool) -> WorkTile:
    """The work tile of linear index ``tile_idx`` (``decode_linear_tile``, or with the counts'
    divisors ``decode_linear_tile_fast``), valid below the launch's tile count."""
    if counts.divisors is None:
        m_block, head, batch = decode_linear_tile(tile_idx, counts, longest_first=longest_first)
    else:
        m_block, head, batch = decode_linear_tile_fast(
            tile_idx, counts, counts.divisors, longest_first
        )
    return WorkTile(
        m_block=Int32(m_block), head=Int32(head), batch=Int32(batch),
        is_valid=Boolean(tile_idx < counts.num_tiles()),
    )


class LinearTileScheduler(_StridedWalk):
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
        return _launch_grid(counts.num_tiles(), persistent, max_ctas, "LinearTileScheduler")

    @classmethod
    def create(
        cls, counts: LinearTileCounts, *, longest_first: bool, persistent: bool = False
    ) -> "LinearTileScheduler":
        return cls(
            counts, longest_first=longest_first, persistent=persistent,
            tile_idx=Int32(cute.arch.block_idx()[0]),
        )

    def get_current_work(self) -> WorkTile:
        return linear_work_tile(self._tile_idx, self.counts, self.longest_first)

    def _finish(self):
        self._tile_idx = self.counts.num_tiles()  # one tile per CTA

    def __extract_mlir_values__(self):
        return cutlass.extract_mlir_values((self.counts, self._tile_idx))

    def __new_from_mlir_values__(self, values):
        counts, tile_idx = cutlass.new_from_mlir_values((self.counts, self._tile_idx), values)
        return LinearTileScheduler(
            counts, longest_first=self.longest_first, persistent=self.persistent,
            tile_idx=tile_idx,
        )


@cute.jit
def _draw(counter: cute.Tensor) -> Int32:
    """The producer warp: lane 0 draws a ticket (the other lanes hold 0). Not shuffled here,
    so that nothing waits for the atomic until the ticket is published."""
    ticket = Int32(0)
    if cute.arch.lane_idx() == 0:
        ticket = cute.arch.atomic_add(counter.iterator, Int32(1))
    return ticket


@cute.jit
def _publish(
    ticket: Int32, counter: cute.Tensor, num_draws: Int32, slot: cute.Tensor,
    sync_threads: cutlass.Constexpr[int], full_id: cutlass.Constexpr[int],
    empty_id: cutlass.Constexpr[int],
) -> Int32:
    """The producer warp: the next work index (grid_dim + lane 0's ticket) goes into the slot
    once the consumers have read the last one; returns it. A launch draws ``num_draws``
    tickets in all (one per work tile): the lane that drew the last one takes them all back,
    so the counter is zero again for the next launch on the stream (here, where the ticket is
    awaited anyway, not at the draw: the tile's loads must not wait for the atomic)."""
    if cute.arch.lane_idx() == 0:
        if ticket == num_draws - 1:
            cute.arch.atomic_add(counter.iterator, -num_draws)
    tile_idx = Int32(cute.arch.grid_dim()[0]) + cute.arch.shuffle_sync(ticket, 0)
    cute.arch.barrier(barrier_id=empty_id, number_of_threads=sync_threads)
    if cute.arch.lane_idx() == 0:
        slot[0] = tile_idx
    cute.arch.barrier_arrive(barrier_id=full_id, number_of_threads=sync_threads)
    return tile_idx


@cute.jit
def _receive(
    slot: cute.Tensor, sync_threads: cutlass.Constexpr[int], full_id: cutlass.Constexpr[int],
    empty_id: cutlass.Constexpr[int],
) -> Int32:
    """A consumer thread: the next work index once the producer has put it in the slot."""
    cute.arch.barrier(barrier_id=full_id, number_of_threads=sync_threads)
    tile_idx = slot[0]
    cute.arch.barrier_arrive(barrier_id=empty_id, number_of_threads=sync_threads)
    return tile_idx


class DynamicTileScheduler:
    """Persistent over ``decode_linear_tile``'s order, the tiles handed out as CTAs ask for
    them: a CTA's first tile is its block index, each next one grid_dim + a ticket drawn from a
    global int32 counter (zero before the launch, and again after it: ``_publish``;
    ``atomic_add`` returns tickets 0, 1, ...).
    A CTA that drew short tiles (causal) takes more, where a static stride fixes every CTA's
    share up front (simulated, 132 SMs: 2.5-6% of a causal forward idle at its end, 0.2-0.5%
    dynamic). Warp-specialised kernels: the producer warp draws (lane 0) and passes each index
    to the consumer threads through a shared-memory slot and two named barriers (``full``: the
    index is there, ``empty``: the consumers have read it; the consumers arrive on ``empty``
    once before their first tile, ``consumer_start``). Every drawn index is passed on, the
    first past the tiles too, so that producer and consumers end together. The producer draws
    its next ticket as it starts a tile (``prefetch_next``, as FlashAttention-3 does) and
    publishes it after the tile's loads, so the atomic's round trip hides behind them."""

    def __init__(
        self, counts: LinearTileCounts, *, longest_first: bool, counter: cute.Tensor,
        slot: cute.Tensor, producer: bool, sync_threads: int, full_id: int, empty_id: int,
        tile_idx: Int32, ticket: Int32,
    ):
        self.counts = counts
        self.longest_first = longest_first
        self.counter = counter  # global (1,) int32: the tickets
        self.slot = slot  # shared (1,) int32: the next work index
        self.producer = producer
        self.sync_threads = sync_threads  # the producer warp and the consumer threads
        self.full_id = full_id
        self.empty_id = empty_id
        self._tile_idx = tile_idx
        self._ticket = ticket  # producer: the drawn, not yet published ticket (lane 0's)

    @staticmethod
    def grid_shape(counts: LinearTileCounts, *, persistent: bool = True, max_ctas=None) -> tuple:
        return _launch_grid(counts.num_tiles(), True, max_ctas, "DynamicTileScheduler")

    @classmethod
    def create(
        cls, counts: LinearTileCounts, *, longest_first: bool, counter: cute.Tensor,
        slot: cute.Tensor, producer: bool, consumer_threads: int, full_id: int,
        empty_id: int,
    ) -> "DynamicTileScheduler":
        return cls(
            counts, longest_first=longest_first, counter=counter, slot=slot, producer=producer,
            sync_threads=cute.arch.WARP_SIZE + consumer_threads, full_id=full_id,
            empty_id=empty_id, tile_idx=Int32(cute.arch.block_idx()[0]), ticket=Int32(0),
        )

    def prefetch_next(self):
        """The producer, as it starts a tile: draw the ticket of its next one."""
        self._ticket = _draw(self.counter)

    def consumer_start(self):
        """Consumers, once before their first tile: the slot is free for the first index."""
        cute.arch.barrier_arrive(barrier_id=self.empty_id, number_of_threads=self.sync_threads)

    def get_current_work(self) -> WorkTile:
        return linear_work_tile(self._tile_idx, self.counts, self.longest_first)

    def initial_work_tile(self) -> WorkTile:
        return self.get_current_work()

    def advance(self) -> WorkTile:
        if cutlass.const_expr(self.producer):
            self._tile_idx = _publish(
                self._ticket, self.counter, self.counts.num_tiles(), self.slot,
                self.sync_threads, self.full_id, self.empty_id,
            )
        else:
            self._tile_idx = _receive(self.slot, self.sync_threads, self.full_id, self.empty_id)
        return self.get_current_work()

    def _fields(self) -> dict:
        return dict(
            longest_first=self.longest_first, producer=self.producer,
            sync_threads=self.sync_threads, full_id=self.full_id, empty_id=self.empty_id,
        )

    def _state(self) -> tuple:
        return self.counts, self.counter, self.slot, self._tile_idx, self._ticket

    def __extract_mlir_values__(self):
        return cutlass.extract_mlir_values(self._state())

    def __new_from_mlir_values__(self, values):
        counts, counter, slot, tile_idx, ticket = cutlass.new_from_mlir_values(
            self._state(), values
        )
        return DynamicTileScheduler(
            counts, counter=counter, slot=slot, tile_idx=tile_idx, ticket=ticket,
            **self._fields()
        )


class VarlenTileCounts(NamedTuple):
    """``VarlenTileScheduler``'s counts: built on the host (``make_varlen_tile_counts``), passed
    to the kernel as an argument with the cumulative lengths the tiles follow."""

    num_tiles_bound: Int32  # at least the tiles of all sequences together (per head)
    num_heads: Int32
    num_batches: Int32


@cute.jit
def make_varlen_tile_counts(
    *, total_rows: Int32, max_length: Int32, tile: cutlass.Constexpr[int], num_heads: Int32,
    num_batches: Int32,
) -> VarlenTileCounts:
    """Host side. total_rows: the packed tensor's rows (at least the last cumulative length);
    max_length: the longest sequence (the caller's max_seqlen). The sum over sequences of
    ceil(length / tile) is at most (total + batches * (tile - 1)) / tile and at most batches *
    ceil(max_length / tile), neither needing a look at the lengths: the first is tight for
    long sequences of mixed lengths, the second for many of one length (a multiple of the
    tile, or shorter than it) and for packed tensors with many rows past the last sequence."""
    loose = (Int64(total_rows) + Int64(num_batches) * (tile - 1)) // tile
    longest = Int64(num_batches) * ((Int64(max_length) + (tile - 1)) // tile)
    return VarlenTileCounts(
        num_tiles_bound=Int32(cutlass.min(loose, longest)), num_heads=num_heads,
        num_batches=num_batches,
    )


def varlen_tile_order(
    lengths, tile: int, num_heads: int, longest_first: bool, heads_fastest: bool = False,
    sequences_longest_first: bool = False,
) -> list:
    """The (block, head, batch) work tiles of ``VarlenTileScheduler`` in work-index order, in
    plain Python: sequence by sequence, each sequence's heads in turn, its tiles fastest (from
    the last one down if ``longest_first``); ``heads_fastest``: each tile of the
    sequence in turn, its heads fastest. ``sequences_longest_first`` (at most
    ``SORTED_SEQUENCES_MAX`` sequences, else ignored): the sequences by tile count, most first,
    ties in their given order."""
    tile_counts = [-(-length // tile) for length in lengths]
    batches = range(len(lengths))
    if sequences_longest_first and len(lengths) <= SORTED_SEQUENCES_MAX:
        batches = sorted(batches, key=lambda batch: (-tile_counts[batch], batch))
    order = []
    for batch in batches:
        tiles = tile_counts[batch]
        blocks = range(tiles - 1, -1, -1) if longest_first else range(tiles)
        if heads_fastest:
            order += [(block, head, batch) for block in blocks for head in range(num_heads)]
        else:
            order += [(block, head, batch) for head in range(num_heads) for block in blocks]
    return order


# Sequences that ``sequences_longest_first`` sorts: one warp's lanes, one sequence each.
SORTED_SEQUENCES_MAX = 32


@cute.jit
def warp_inclusive_sum(value: Int32) -> Int32:
    """Each lane's sum of ``value`` over lanes 0 .. itself (the whole warp takes part): log2(32)
    shifted adds, a lane below the shift keeping its sum."""
    lane = cute.arch.lane_idx()
    for bit in cutlass.range_constexpr(5):
        below = cute.arch.shuffle_sync_up(value, offset=1 << bit)
        if lane >= (1 << bit):
            value = value + below
    return value


@cute.jit
def decode_varlen_tile(
    tile_idx: Int32, counts: VarlenTileCounts, cu_seqlens: cute.Tensor,
    tile: cutlass.Constexpr[int], longest_first: cutlass.Constexpr[bool],
    heads_fastest: cutlass.Constexpr[bool] = False, scan_from: tuple | None = None,
    sequences_longest_first: cutlass.Constexpr[bool] = False,
):
    """CTA ``tile_idx``'s work tile in ``varlen_tile_order``. Called by whole warps (every lane
    takes part in the scan): each lane counts one sequence's work tiles (tiles x heads), a warp
    prefix sum and ballot find the sequence whose range holds ``tile_idx``, 32 sequences a pass.
    A CTA past every sequence's tiles (the grid is an upper bound) gets the tile just past the
    last sequence's end, head 0, flagged invalid: a kernel that treats tiles past a sequence as
    empty (as for a grid over the longest sequence) needs no check of its own. At least one
    sequence (``counts.num_batches`` >= 1).

    ``scan_from`` (sequence, its first work tile): start the scan there instead of at sequence
    0, a sequence at or before the one holding ``tile_idx`` (a persistent CTA's indices only
    grow: it resumes at its last tile's sequence). Returns the work tile and, with
    ``scan_from``, the (sequence, first work tile) to resume the next scan from.

    ``sequences_longest_first``: up to 32 sequences, one pass where each lane's range starts
    after the work of every sequence with more tiles (ties: lower lanes first), 32 shuffles,
    ``scan_from`` unused; more sequences take the passes above in the given order."""
    lane = cute.arch.lane_idx()
    first_batch = Int32(0)  # this pass's first sequence
    before = Int32(0)  # work tiles of the sequences before the pass
    if cutlass.const_expr(scan_from is not None):
        first_batch, before = scan_from
    resume_batch = first_batch
    resume_start = before
    batch = Int32(-1)
    start = Int32(0)  # the found sequence's first work tile
    tiles_found = Int32(1)
    last_tiles = Int32(0)  # the last sequence's tiles, once a pass has reached it
    if cutlass.const_expr(sequences_longest_first):
        if counts.num_batches <= SORTED_SEQUENCES_MAX:
            tiles = Int32(0)
            if lane < counts.num_batches:
                length = cu_seqlens[lane + 1] - cu_seqlens[lane]
                tiles = (length + (tile - 1)) // tile
            work = tiles * counts.num_heads
            sorted_start = Int32(0)  # the work of the sequences that come before this one
            for other in cutlass.range_constexpr(cute.arch.WARP_SIZE):
                other_tiles = cute.arch.shuffle_sync(tiles, other)
                if other_tiles > tiles or (other_tiles == tiles and other < lane):
                    sorted_start = sorted_start + other_tiles * counts.num_heads
            holds = cute.arch.vote_ballot_sync(
                lane < counts.num_batches and sorted_start <= tile_idx
                and sorted_start + work > tile_idx
            )
            if holds != 0:
                found = cute.arch.popc((holds & -holds) - 1)
                batch = found
                start = cute.arch.shuffle_sync(sorted_start, found)
                tiles_found = cute.arch.shuffle_sync(tiles, found)
            last_tiles = cute.arch.shuffle_sync(tiles, counts.num_batches - 1)
            first_batch = counts.num_batches  # no scan below
    while first_batch < counts.num_batches and batch < 0:
        sequence = first_batch + lane
        tiles = Int32(0)
        if sequence < counts.num_batches:
            length = cu_seqlens[sequence + 1] - cu_seqlens[sequence]
            tiles = (length + (tile - 1)) // tile
        work = tiles * counts.num_heads
        inclusive = warp_inclusive_sum(work)
        holds = cute.arch.vote_ballot_sync(
            sequence < counts.num_batches and before + inclusive > tile_idx
        )
        if holds != 0:
            found = cute.arch.popc((holds & -holds) - 1)  # the lowest lane that holds it
            batch = first_batch + found
            start = before + cute.arch.shuffle_sync(inclusive - work, found)
            tiles_found = cute.arch.shuffle_sync(tiles, found)
        last_lane = cutlass.min(counts.num_batches - 1 - first_batch, cute.arch.WARP_SIZE - 1)
        last_tiles = cute.arch.shuffle_sync(tiles, last_lane)
        before = before + cute.arch.shuffle_sync(inclusive, cute.arch.WARP_SIZE - 1)
        first_batch = first_batch + cute.arch.WARP_SIZE
    valid = batch >= 0
    local = tile_idx - start
    block = Int32(0)
    head = Int32(0)
    if cutlass.const_expr(heads_fastest):
        block = local // counts.num_heads
        head = local - block * counts.num_heads
    else:
        head = local // tiles_found
        block = local - head * tiles_found
    if cutlass.const_expr(longest_first):
        block = tiles_found - 1 - block
    if valid:
        resume_batch = batch
        resume_start = start
    else:
        batch = counts.num_batches - 1
        head = Int32(0)
        block = last_tiles
    work = WorkTile(m_block=block, head=head, batch=batch, is_valid=Boolean(valid))
    if cutlass.const_expr(scan_from is None):
        return work
    return work, (resume_batch, resume_start)


class VarlenTileScheduler(_StridedWalk):
    """The work tiles of a packed batch in ``varlen_tile_order``; the module docstring says
    why. ``tile``: the rows a work tile covers along the lengths (query rows in the forward,
    key rows in the backward). Single tile: one CTA per work tile of the grid's bound.
    Persistent: grid (min(max_ctas, bound), 1, 1), each CTA taking every grid_dim-th work tile
    (a warp-wide scan per tile, ``decode_varlen_tile``) until they run out."""

    def __init__(
        self, counts: VarlenTileCounts, cu_seqlens: cute.Tensor, *, tile: int,
        longest_first: bool, persistent: bool = False, heads_fastest: bool = False,
        tile_idx: Int32 | None = None, done: bool = False, scan_from: tuple | None = None,
        sequences_longest_first: bool = False,
    ):
        self.sequences_longest_first = sequences_longest_first
        self.counts = counts
        self.cu_seqlens = cu_seqlens
        self.tile = tile
        self.longest_first = longest_first
        self.persistent = persistent
        # Persistent: always (a stride over a sequence's tiles fastest can alias their count
        # and give one CTA every head's longest tile).
        self.heads_fastest = heads_fastest or persistent
        self._tile_idx = tile_idx  # persistent only: the CTA's current work index
        self._done = done  # single tile: plain Python, so a kernel loop over it folds
        # Persistent only: (sequence, its first work tile) of the last tile found, where the
        # next scan starts (the work index only grows).
        self._scan_from = scan_from

    @staticmethod
    def grid_shape(
        counts: VarlenTileCounts, *, persistent: bool = False, max_ctas: Int32 | None = None
    ) -> tuple:
        tiles = counts.num_tiles_bound * counts.num_heads
        return _launch_grid(tiles, persistent, max_ctas, "VarlenTileScheduler")

    @classmethod
    def create(
        cls, counts: VarlenTileCounts, cu_seqlens: cute.Tensor, *, tile: int,
        longest_first: bool, persistent: bool = False, heads_fastest: bool = False,
        sequences_longest_first: bool = False,
    ) -> "VarlenTileScheduler":
        """``heads_fastest``: each sequence's work tiles tile by tile, its heads fastest
        (``varlen_tile_order``; persistent: always). Where tiles differ in work (causal, a
        window), a launch in the other order ends on the last sequence's longest tiles, one
        head after another (simulated on the benchmark's 17 sequences, 132 SMs: d128 causal
        backward 4.4% past an even split against 0.4%, single-tile forward 4.3% against
        0.3%). ``sequences_longest_first``: the module docstring."""
        tile_idx = Int32(cute.arch.block_idx()[0]) if persistent else None
        scan_from = (Int32(0), Int32(0)) if persistent else None
        return cls(
            counts, cu_seqlens, tile=tile, longest_first=longest_first, persistent=persistent,
            heads_fastest=heads_fastest, tile_idx=tile_idx, scan_from=scan_from,
            sequences_longest_first=sequences_longest_first,
        )

    def get_current_work(self) -> WorkTile:
        if cutlass.const_expr(not self.persistent):
            work = decode_varlen_tile(
                Int32(cute.arch.block_idx()[0]), self.counts, self.cu_seqlens, self.tile,
                self.longest_first, heads_fastest=self.heads_fastest,
                sequences_longest_first=self.sequences_longest_first,
            )
            if cutlass.const_expr(self._done):
                work = work._replace(is_valid=Boolean(False))
            return work
        work, self._scan_from = decode_varlen_tile(
            self._tile_idx, self.counts, self.cu_seqlens, self.tile, self.longest_first,
            heads_fastest=True, scan_from=self._scan_from,
            sequences_longest_first=self.sequences_longest_first,
        )
        return work

    def _finish(self):
        self._done = True

    def _state(self):
        walk = (self._tile_idx, *self._scan_from) if self.persistent else ()
        return (self.counts, self.cu_seqlens) + walk

    def __extract_mlir_values__(self):
        return cutlass.extract_mlir_values(self._state())

    def __new_from_mlir_values__(self, values):
        state = cutlass.new_from_mlir_values(self._state(), values)
        persistent = self.persistent
        return VarlenTileScheduler(
            state[0], state[1], tile=self.tile, longest_first=self.longest_first,
            persistent=persistent, heads_fastest=self.heads_fastest,
            tile_idx=state[2] if persistent else None,
            done=self._done, scan_from=(state[3], state[4]) if persistent else None,
            sequences_longest_first=self.sequences_longest_first,
        )
