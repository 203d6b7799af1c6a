"""Tile schedulers: the linear order is a bijection with the promised L2 sections and causal
order (checked on Python ints), and every scheduler compiles in a kernel loop for sm_90a."""

import itertools
import re

import pytest
from scheduler_probe import (
    compile_dynamic_visit_counter,
    compile_varlen_decoder,
    compile_visit_counter,
)

from cuteattn.kernels.common.tile_scheduler import (
    LinearTileCounts,
    LinearTileScheduler,
    SingleTileScheduler,
    TileCounts,
    VarlenTileCounts,
    VarlenTileScheduler,
    decode_linear_tile,
    varlen_tile_order,
)

# (m_blocks, heads, batches, heads_per_section); the comment says how the pairs split.
LINEAR_CASES = [
    (1, 1, 1, 1),  # one tile
    (5, 3, 2, 1),  # one pair per section
    (5, 3, 2, 2),  # 6 pairs: 2 + 2 + 2
    (5, 3, 2, 4),  # 6 pairs: 4 + residual 2
    (4, 8, 1, 8),  # one full section
    (7, 1, 3, 2),  # 3 pairs: 2 + residual 1, sections crossing batches
    (3, 5, 3, 4),  # 15 pairs: 4 + 4 + 4 + residual 3, sections crossing batches
    (2, 3, 2, 16),  # 6 pairs in one section larger than all of them
]


def _order(m_blocks, heads, batches, heads_per_section, longest_first):
    counts = LinearTileCounts(
        num_m_blocks=m_blocks, num_heads=heads, num_batches=batches,
        heads_per_section=heads_per_section,
    )
    assert counts.num_tiles() == m_blocks * heads * batches
    return [
        decode_linear_tile(i, counts, longest_first=longest_first)
        for i in range(counts.num_tiles())
    ]


@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches,heads_per_section", LINEAR_CASES)
def test_decode_linear_tile_is_a_bijection_on_ints(
    m_blocks, heads, batches, heads_per_section, longest_first
):
    order = _order(m_blocks, heads, batches, heads_per_section, longest_first)
    assert all(type(x) is int for tile in order for x in tile)
    everything = set(itertools.product(range(m_blocks), range(heads), range(batches)))
    assert set(order) == everything and len(order) == len(everything)


@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches,heads_per_section", LINEAR_CASES)
def test_decode_linear_tile_walks_sections_in_the_promised_order(
    m_blocks, heads, batches, heads_per_section, longest_first
):
    order = _order(m_blocks, heads, batches, heads_per_section, longest_first)
    num_pairs = heads * batches
    m_blocks_in_order = range(m_blocks - 1, -1, -1) if longest_first else range(m_blocks)
    for first_pair in range(0, num_pairs, heads_per_section):
        # A section is a run of consecutive batch-major (batch, head) pairs, the last one
        # possibly shorter.
        pairs = list(range(first_pair, min(first_pair + heads_per_section, num_pairs)))
        start = first_pair * m_blocks
        section = order[start : start + len(pairs) * m_blocks]
        assert len(section) == len(pairs) * m_blocks
        # Query tile by query tile (from the last one down if longest first), every pair of the
        # section at each, in pair order.
        ms = [m for m, _, _ in section]
        assert ms == sorted(ms, reverse=longest_first)
        expected = [
            (m, pair % heads, pair // heads) for m in m_blocks_in_order for pair in pairs
        ]
        assert section == expected


@pytest.mark.parametrize("descending", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches,heads_per_section", LINEAR_CASES)
def test_linear_order_dispatches_each_turn_holder_before_its_waiters(
    m_blocks, heads, batches, heads_per_section, descending
):
    """The deterministic backward's use (``turns.section_work_tile``: key tiles in the work
    tiles' m_block): every (batch, KV head) pair's key tiles come in turn order, ascending, or
    descending (causal / window), so no CTA waits on a turn of a CTA dispatched after it."""
    order = _order(m_blocks, heads, batches, heads_per_section, descending)
    for head, batch in itertools.product(range(heads), range(batches)):
        key_tiles = [n for n, h, b in order if (h, b) == (head, batch)]
        assert key_tiles == sorted(range(m_blocks), reverse=descending)


@pytest.mark.parametrize(
    "scheduler_cls,persistent",
    [(SingleTileScheduler, False), (LinearTileScheduler, False), (LinearTileScheduler, True)],
    ids=["single", "linear", "linear-persistent"],
)
@pytest.mark.parametrize("longest_first", (False, True))
def test_schedulers_compile_in_the_kernel_loop(scheduler_cls, persistent, longest_first, tmp_path):
    fn = compile_visit_counter(
        scheduler_cls, persistent=persistent, longest_first=longest_first, dump_dir=tmp_path
    )
    body = fn.__ptx__.split(".entry", 1)[1]
    if persistent:
        # The persistent loop stays: a branch back to its head.
        assert _has_backward_branch(body)
    else:
        # The single-tile loop folds away: its only branch skips the other threads' atomic.
        assert not _has_backward_branch(body)
        assert body.count("bra") <= 1


def test_single_tile_scheduler_refuses_a_persistent_launch():
    counts = TileCounts(num_m_blocks=2, num_heads=3, num_batches=4)
    assert SingleTileScheduler.grid_shape(counts) == (2, 3, 4)
    with pytest.raises(ValueError, match="LinearTileScheduler"):
        SingleTileScheduler.grid_shape(counts, persistent=True, max_ctas=132)
    with pytest.raises(ValueError, match="LinearTileScheduler"):
        SingleTileScheduler.create(counts, longest_first=False, persistent=True)


def test_linear_grid_shape():
    counts = LinearTileCounts(num_m_blocks=5, num_heads=3, num_batches=2, heads_per_section=4)
    assert LinearTileScheduler.grid_shape(counts) == (30, 1, 1)
    assert LinearTileScheduler.grid_shape(counts, persistent=False, max_ctas=7) == (30, 1, 1)
    assert LinearTileScheduler.grid_shape(counts, persistent=True, max_ctas=7) == (7, 1, 1)
    assert LinearTileScheduler.grid_shape(counts, persistent=True, max_ctas=132) == (30, 1, 1)
    with pytest.raises(ValueError, match="max_ctas"):
        LinearTileScheduler.grid_shape(counts, persistent=True)


def _has_backward_branch(ptx_body: str) -> bool:
    """Whether some branch jumps to a label defined above it: a loop."""
    seen = set()
    for line in ptx_body.splitlines():
        label = re.match(r"\s*(\$\w+):", line)
        if label:
            seen.add(label.group(1))
        target = re.search(r"\bbra(?:\.uni)?\s+(\$\w+)", line)
        if target and target.group(1) in seen:
            return True
    return False


# (lengths, tile, heads): zero-length sequences, one tile, more than a warp's 32 sequences.
VARLEN_CASES = [
    ([5, 0, 130, 64, 1], 64, 3),
    ([0, 0, 7], 128, 1),
    ([1] * 40 + [300] + [0] * 30, 64, 2),
]


@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("lengths,tile,heads", VARLEN_CASES)
def test_varlen_tile_order_covers_each_sequence_tile_once_within_the_bound(
    lengths, tile, heads, longest_first
):
    """Every (tile, head) of every sequence once, sequence by sequence, heads in turn, tiles
    fastest (from the last down if longest first); the grid's bound holds them all."""
    order = varlen_tile_order(lengths, tile, heads, longest_first)
    expected = {
        (block, head, batch)
        for batch, length in enumerate(lengths)
        for head in range(heads)
        for block in range(-(-length // tile))
    }
    assert set(order) == expected and len(order) == len(expected)
    assert [batch for _, _, batch in order] == sorted(batch for _, _, batch in order)
    for batch, length in enumerate(lengths):
        mine = [(block, head) for block, head, b in order if b == batch]
        tiles = -(-length // tile)
        blocks = list(range(tiles))[::-1] if longest_first else list(range(tiles))
        assert mine == [(block, head) for head in range(heads) for block in blocks]
    # Persistent: the same tiles, each sequence's tile by tile with its heads fastest.
    fastest = varlen_tile_order(lengths, tile, heads, longest_first, heads_fastest=True)
    assert sorted(fastest) == sorted(order)
    for batch, length in enumerate(lengths):
        mine = [(block, head) for block, head, b in fastest if b == batch]
        tiles = -(-length // tile)
        blocks = list(range(tiles))[::-1] if longest_first else list(range(tiles))
        assert mine == [(block, head) for block in blocks for head in range(heads)]
    loose = (sum(lengths) + len(lengths) * (tile - 1)) // tile
    bound = min(loose, len(lengths) * -(-max(lengths) // tile))
    assert len(order) <= bound * heads
    counts = VarlenTileCounts(num_tiles_bound=bound, num_heads=heads, num_batches=len(lengths))
    assert VarlenTileScheduler.grid_shape(counts) == (bound * heads, 1, 1)
    # Persistent: at most max_ctas CTAs, each taking every grid_dim-th work tile.
    assert VarlenTileScheduler.grid_shape(counts, persistent=True, max_ctas=3) == (
        min(3, bound * heads), 1, 1
    )
    with pytest.raises(ValueError, match="needs max_ctas"):
        VarlenTileScheduler.grid_shape(counts, persistent=True)


@pytest.mark.parametrize("heads_fastest", (False, True))
@pytest.mark.parametrize("lengths,tile,heads", VARLEN_CASES)
def test_varlen_tile_order_sequences_longest_first(lengths, tile, heads, heads_fastest):
    """``sequences_longest_first``: the same work tiles, each sequence's in the same order, the
    sequences by tile count, most first, ties in the given order; more than 32 sequences keep
    the given order (the device sorts one warp's lanes)."""
    given = varlen_tile_order(lengths, tile, heads, True, heads_fastest=heads_fastest)
    order = varlen_tile_order(
        lengths, tile, heads, True, heads_fastest=heads_fastest, sequences_longest_first=True
    )
    assert sorted(order) == sorted(given)
    for batch in range(len(lengths)):
        assert [w for w in order if w[2] == batch] == [w for w in given if w[2] == batch]
    sequences = list(dict.fromkeys(batch for _, _, batch in order))
    if len(lengths) > 32:
        assert order == given
    else:
        tiles = [-(-lengths[batch] // tile) for batch in sequences]
        assert tiles == sorted(tiles, reverse=True)
        for first, second in zip(sequences, sequences[1:]):
            if -(-lengths[first] // tile) == -(-lengths[second] // tile):
                assert first < second


def test_varlen_tile_order_sequences_longest_first_example():
    """Lengths 100, 300, 0, 300, 50 in 128-row tiles (1, 3, 0, 3, 1 tiles): sequences 1, 3, 0,
    4 (2 has none), one head."""
    order = varlen_tile_order([100, 300, 0, 300, 50], 128, 1, False, sequences_longest_first=True)
    assert order == [(0, 0, 1), (1, 0, 1), (2, 0, 1), (0, 0, 3), (1, 0, 3), (2, 0, 3),
                     (0, 0, 0), (0, 0, 4)]


@pytest.mark.parametrize("persistent", (False, True))
@pytest.mark.parametrize("longest_first", (False, True))
def test_varlen_decoder_compiles_to_one_warp_scan(longest_first, persistent, tmp_path):
    """The decode is a loop of warp scans (shfl.up, ballot), 32 sequences a pass; persistent,
    once before the CTA's loop over its tiles and once per advance."""
    fn = compile_varlen_decoder(
        tile=64, longest_first=longest_first, persistent=persistent, dump_dir=tmp_path
    )
    body = fn.__ptx__.split(".entry", 1)[1]
    assert body.count("shfl.sync.up") == (10 if persistent else 5)
    assert "vote.sync.ballot" in body
    assert _has_backward_branch(body)


@pytest.mark.parametrize("persistent", (False, True))
def test_varlen_decoder_sorting_sequences_compiles(persistent, tmp_path):
    """``sequences_longest_first``: one pass of 32 shuffles (no prefix sum) for up to 32
    sequences, the warp scan for more (persistent: both before the loop and per advance)."""
    fn = compile_varlen_decoder(
        tile=128, longest_first=False, persistent=persistent, sequences_longest_first=True,
        dump_dir=tmp_path,
    )
    body = fn.__ptx__.split(".entry", 1)[1]
    decodes = 2 if persistent else 1
    assert body.count("shfl.sync.up") == 5 * decodes
    assert body.count("shfl.sync.idx") >= (32 + 5) * decodes
    assert body.count("vote.sync.ballot") == 2 * decodes


def test_dynamic_scheduler_probe_compiles_with_its_barriers(tmp_path):
    """The producer draws with one atomic per tile (and one more, the last drawer's, taking the
    tickets back) and passes the index through named barriers 8 (full) and 9 (empty)."""
    fn = compile_dynamic_visit_counter(longest_first=True, dump_dir=tmp_path)
    body = fn.__ptx__.split(".entry", 1)[1]
    assert "atom.global.add" in body
    assert "bar.arrive 8" in body and "bar.arrive 9" in body
