"""Turn counters for the deterministic backward: the key tiles that add to one query tile's
dq do so in a fixed order.

One int32 counter per (batch, query head, query tile), zeroed before the launch. The key tiles
that visit query tile m are always 0 .. n_block_max(m) - 1 (a query tile seen by key tile n is
seen by every key tile before it). A key tile waits until the counter holds its turn, adds, and
stores turn + 1.

- Not causal: the turn of key tile n is n (every key tile visits every query tile, from the
  first one).
- Causal, or a local window (its key tiles of query tile m are n_block_min(m) .. n_block_max(m)
  - 1): the turns descend, n_block_max(m) - 1 - n. Key tile n visits query tiles from the
  diagonal's down; ascending turns would hold it back n steps at its first query tile (key tile
  0 reaches it only at its own step n), so every CTA would take as long as key tile 0's. In
  descending order a key tile's first query tile is its own first turn and each later one waits
  on key tile n + 1, which is a step ahead.

Waiting never deadlocks as long as the key tile that goes first at a query tile was dispatched
first: ``key_tile_of_block`` maps the grid's fastest dimension to key tiles in turn order (the
CTAs of one head and batch are dispatched in that order); ``section_work_tile`` (the sm90
fixed-length backward) keeps each (batch, KV head) pair's key tiles in turn order within its
L2 section; a packed (varlen) batch's
``VarlenTileScheduler`` numbers each (sequence, KV head)'s key tiles in the same order
(consecutively, or, heads fastest, with the sequence's other heads' tiles between them, which
changes nothing).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from cuteattn.kernels.common.block_info import BlockInfo
from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.tile_scheduler import (
    LinearTileCounts,
    LinearTileScheduler,
    make_linear_tile_counts,
)


@cute.jit
def key_tile_of_block(block: Int32, num_blocks: Int32, descending: cutlass.Constexpr[bool]):
    """The key tile of CTA ``block`` (grid dimension x): the last key tiles first when the turns
    descend, so that a turn's holder is always dispatched before its waiters."""
    key_tile = block
    if cutlass.const_expr(descending):
        key_tile = num_blocks - 1 - block
    return key_tile


@cute.jit
def make_section_counts(
    *, seqlen_q: Int32, seqlen_k: Int32, tile_n: cutlass.Constexpr[int], num_heads_kv: Int32,
    num_batches: Int32, query_row_bytes: cutlass.Constexpr[int],
) -> LinearTileCounts:
    """Host side: the work tiles (key tile, KV head, batch) in ``LinearTileScheduler``'s L2
    sections, key tiles in the role of its query tiles; a section holds the pairs whose
    query-side rows (Q, dO and dq_accum: ``query_row_bytes`` per query and head; ``seqlen_q``
    rows a pair: its group's heads' under GQA) fit L2 together.

    In grid order (key tiles fastest) the CTAs resident at once are all the key tiles of a few
    pairs, and each query tile's additions pass down all of a pair's key tiles one after
    another: on the H200 deterministic=True cost d64 s4k dense 19%, d128 13% in that order
    (docs/PERF.md, sixteenth session). Pairs taking turns at each key tile put fewer key tiles
    of each pair in flight together (d64 s4k: 16 pairs of 32 key tiles, 132 CTAs: about 8 key
    tiles a pair), so fewer additions queue for each query tile, as FlashAttention-4's
    deterministic head swizzle."""
    return make_linear_tile_counts(
        seqlen_q=seqlen_k, seqlen_k=seqlen_q, tile_m=tile_n, num_heads=num_heads_kv,
        num_batches=num_batches, kv_bytes_per_key=query_row_bytes,
    )


@cute.jit
def section_work_tile(counts: LinearTileCounts, descending: cutlass.Constexpr[bool]):
    """Device side: this CTA's (key tile, KV head, batch) of ``make_section_counts``' order (a
    1-D grid). Within a section each pair's key tiles come in turn order (descending: the last
    first), so a turn's holder is dispatched before its waiters."""
    work = LinearTileScheduler.create(counts, longest_first=descending).initial_work_tile()
    return work.m_block, work.head, work.batch


def descending(block_info: BlockInfo) -> bool:
    """Whether the turns descend: causal, or a local window (whose key tiles of a query tile
    are [n_block_min, n_block_max), not starting at 0)."""
    return block_info.causal or block_info.window is not None


@cute.jit
def turn_of(block_info: BlockInfo, seqlen: SeqlenInfo, m_block: Int32, n_block: Int32):
    """Key tile ``n_block``'s turn at query tile ``m_block`` (see the module docstring)."""
    turn = n_block
    if cutlass.const_expr(descending(block_info)):
        _, n_block_max = block_info.n_block_min_max(seqlen, m_block)
        turn = n_block_max - 1 - n_block
    return turn


@cute.jit
def wait_for_turn(counter: cute.Pointer, turn: Int32):
    """Poll ``counter`` until it holds ``turn`` (acquire: the previous holder's additions are
    visible after it). Called by one thread; the caller holds the others back."""
    seen = cute.arch.load(counter, Int32, sem="acquire", scope="gpu")
    while seen != turn:
        seen = cute.arch.load(counter, Int32, sem="acquire", scope="gpu")


@cute.jit
def pass_turn(counter: cute.Pointer, turn: Int32):
    """Hand the query tile to the next turn (release: this thread's additions, and those it has
    synchronised with, are visible first). Called by one thread."""
    cute.arch.store(counter, turn + 1, sem="release", scope="gpu")


# The non-deterministic sm90 backward's claims (``claim``): a query tile's counter is FREE until
# a key tile claims the query tile's first addition (a store, over whatever dq_accum held), and
# STORED once that store is performed; the other key tiles add after it.
CLAIM_FREE, CLAIMED, CLAIM_STORED = 0, 1, 2


@cute.jit
def claim(counter: cute.Pointer):
    """Claim the first addition to a query tile: FREE -> CLAIMED (the caller stores, then
    passes the counter on to CLAIM_STORED: ``pass_turn(counter, CLAIMED)``), or, claimed by
    another key tile, wait until its store is performed (acquire). Returns the counter's value
    before: FREE when this caller claimed it. Called by one thread; the caller holds the others
    back. Never deadlocks: a claimer waits for nothing outside its CTA until it passes."""
    seen = cute.arch.atomic_cas(
        counter, cmp=Int32(CLAIM_FREE), val=Int32(CLAIMED), sem="acquire", scope="gpu"
    )
    if seen == CLAIMED:
        wait_for_turn(counter, Int32(CLAIM_STORED))
    return seen
