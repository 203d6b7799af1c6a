"""Tile schedulers: the persistent order is a bijection with the promised locality and causal
order (checked on Python ints), and both schedulers compile in a kernel loop for sm_90a."""

import itertools

import pytest
from scheduler_probe import compile_visit_counter

from cuteattn.kernels.common.tile_scheduler import (
    PersistentTileScheduler,
    SingleTileScheduler,
    TileCounts,
    decode_tile_index,
)


@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches", [(1, 1, 1), (5, 3, 2), (4, 8, 1), (7, 1, 3)])
def test_decode_is_a_bijection_in_the_promised_order(m_blocks, heads, batches, longest_first):
    counts = TileCounts(num_m_blocks=m_blocks, num_heads=heads, num_batches=batches)
    order = [
        decode_tile_index(i, counts, longest_first=longest_first)
        for i in range(m_blocks * heads * batches)
    ]
    everything = set(itertools.product(range(m_blocks), range(heads), range(batches)))
    assert set(order) == everything and len(order) == len(everything)
    if longest_first:
        # Query tiles from the last (longest under causal) down; within one, heads of a batch
        # adjacent.
        assert [m for m, _, _ in order] == sorted((m for m, _, _ in order), reverse=True)
        first_row = order[: heads * batches]
        assert first_row == [(m_blocks - 1, h, b) for b in range(batches) for h in range(heads)]
    else:
        # All query tiles of one (batch, head) run back to back: they share its K and V.
        assert order[:m_blocks] == [(m, 0, 0) for m in range(m_blocks)]
        assert [(h, b) for _, h, b in order] == sorted(
            ((h, b) for _, h, b in order), key=lambda hb: (hb[1], hb[0])
        )


@pytest.mark.parametrize("longest_first", (False, True))
def test_schedulers_compile_in_the_kernel_loop(longest_first, tmp_path):
    single = compile_visit_counter(
        SingleTileScheduler, longest_first=longest_first, dump_dir=tmp_path
    )
    persistent = compile_visit_counter(
        PersistentTileScheduler, longest_first=longest_first, dump_dir=tmp_path
    )
    # The single-tile loop folds away: its only branch skips the other threads' atomic. The
    # persistent one keeps its loop (a branch back).
    assert single.__ptx__.split(".entry", 1)[1].count("bra") <= 1
    assert persistent.__ptx__.split(".entry", 1)[1].count("bra") >= 2
