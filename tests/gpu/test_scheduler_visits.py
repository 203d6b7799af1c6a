"""Tile schedulers on the GPU: every work tile is handed out exactly once, whatever the grid and,
for the linear scheduler, whatever the section size (residual last sections included)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

# (scheduler, persistent, max_ctas, heads_per_section): a single-tile grid does not depend on
# max_ctas and SingleTileScheduler has no sections, so those take one value each.
SCHEDULES = [
    pytest.param("SingleTileScheduler", False, 132, 1, id="single"),
    *(
        pytest.param("LinearTileScheduler", False, 132, section, id=f"linear-section{section}")
        for section in (1, 2, 4, 64)
    ),
    *(
        pytest.param(
            "LinearTileScheduler", True, ctas, section,
            id=f"linear-persistent-ctas{ctas}-section{section}",
        )
        for ctas in (1, 7, 132, 100000)
        for section in (1, 2, 4, 64)
    ),
]


# (9, 5, 3): 15 pairs, so sections of 2 and 4 leave a residual one, and 64 is one short section;
# (33, 16, 2): 32 pairs, 2 and 4 divide them, 64 is one short section.
@pytest.mark.parametrize("scheduler_name,persistent,max_ctas,heads_per_section", SCHEDULES)
@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches", [(1, 1, 1), (9, 5, 3), (33, 16, 2)])
def test_every_tile_once(
    scheduler_name, persistent, longest_first, m_blocks, heads, batches, max_ctas,
    heads_per_section,
):
    from scheduler_probe import compile_visit_counter

    from cuteattn.kernels.common import tile_scheduler
    from cuteattn.runtime.arch import device_arch

    scheduler_cls = getattr(tile_scheduler, scheduler_name)
    arch = device_arch(torch.device("cuda")).name
    fn = _compiled(scheduler_cls, persistent, longest_first, arch, compile_visit_counter)
    visits = torch.zeros(m_blocks, heads, batches, dtype=torch.int32, device="cuda")
    fn(visits, max_ctas, heads_per_section)
    torch.cuda.synchronize()
    assert torch.all(visits == 1), f"visit counts {visits.unique(return_counts=True)}"


_cache = {}


def _compiled(scheduler_cls, persistent, longest_first, arch, compile_visit_counter):
    key = (scheduler_cls, persistent, longest_first, arch)
    if key not in _cache:
        _cache[key] = compile_visit_counter(
            scheduler_cls, persistent=persistent, longest_first=longest_first, arch=arch
        )
    return _cache[key]


@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize(
    "m_blocks,heads,batches", [(1, 1, 1), (9, 5, 3), (33, 16, 2), (7, 1, 3), (2, 3, 2), (64, 12, 5)]
)
@pytest.mark.parametrize("heads_per_section", (1, 2, 4, 8, 64))
def test_linear_scheduler_decodes_the_tile_order(
    longest_first, m_blocks, heads, batches, heads_per_section
):
    """The in-kernel decode (divisions by precomputed divisors) gives work index i the tile
    that ``decode_linear_tile`` (plain integer arithmetic, CPU-tested) gives it."""
    from scheduler_probe import compile_linear_decoder

    from cuteattn.kernels.common.tile_scheduler import LinearTileCounts, decode_linear_tile
    from cuteattn.runtime.arch import device_arch

    assert heads_per_section & (heads_per_section - 1) == 0  # the divisors assume it
    key = ("linear decoder", longest_first)
    if key not in _cache:
        arch = device_arch(torch.device("cuda")).name
        _cache[key] = compile_linear_decoder(longest_first=longest_first, arch=arch)
    counts = LinearTileCounts(
        num_m_blocks=m_blocks, num_heads=heads, num_batches=batches,
        heads_per_section=heads_per_section,
    )
    want = [
        decode_linear_tile(i, counts, longest_first=longest_first)
        for i in range(counts.num_tiles())
    ]
    tiles = torch.full((counts.num_tiles(), 3), -7, dtype=torch.int32, device="cuda")
    _cache[key](tiles, m_blocks, heads, batches, heads_per_section)
    torch.cuda.synchronize()
    assert [tuple(row) for row in tiles.tolist()] == [tuple(t) for t in want]


@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches", [(1, 1, 1), (9, 5, 3), (33, 16, 2)])
@pytest.mark.parametrize("max_ctas", (1, 7, 132))
@pytest.mark.parametrize("heads_per_section", (1, 4, 64))
def test_dynamic_scheduler_hands_out_every_tile_once(
    longest_first, m_blocks, heads, batches, max_ctas, heads_per_section
):
    """``DynamicTileScheduler``: the producer warp's walk and the consumer warp's (which gets
    each index through shared memory) both visit every work tile exactly once, the CTAs
    together, twice in a row on one counter: the counter is zero again after each launch (the
    CTA that draws the last ticket takes all of them back)."""
    from scheduler_probe import compile_dynamic_visit_counter

    from cuteattn.runtime.arch import device_arch

    key = ("dynamic", longest_first)
    if key not in _cache:
        arch = device_arch(torch.device("cuda")).name
        _cache[key] = compile_dynamic_visit_counter(longest_first=longest_first, arch=arch)
    visits = torch.zeros(2, m_blocks, heads, batches, dtype=torch.int32, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    for launch in (1, 2):
        _cache[key](visits, max_ctas, heads_per_section, counter)
        torch.cuda.synchronize()
        assert torch.all(visits == launch), f"visit counts {visits.unique(return_counts=True)}"
        assert counter.item() == 0


# Zero-length sequences, one tile, more sequences than a warp's 32 (the scan takes passes), and
# lengths summing to a multiple of the tile (the bound is then tight for one sequence).
VARLEN_LENGTHS = [
    [5, 0, 130, 64, 1],
    [0, 0, 7],
    [1] * 40 + [300] + [0] * 30 + [129],
    [256],
    # Ties, zero lengths, and exactly one warp's 32 sequences (the longest-first sort's limit).
    [300, 5, 300, 129, 0, 700, 64, 128, 1000, 17],
    [(i * 37) % 300 for i in range(32)],
    # Many passes of the warp's scan (persistent CTAs resume at their last tile's sequence).
    [3, 70, 0, 1, 129] * 40,
]


@pytest.mark.parametrize("sequences_longest_first", (False, True))
@pytest.mark.parametrize("heads_fastest", (False, True))
@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("tile", (64, 128))
@pytest.mark.parametrize("heads", (1, 3))
@pytest.mark.parametrize("lengths", VARLEN_LENGTHS, ids=lambda lengths: f"{len(lengths)}seqs")
def test_varlen_scheduler_decodes_the_tile_order(
    lengths, heads, tile, longest_first, heads_fastest, sequences_longest_first
):
    """CTA i decodes the i-th work tile of ``varlen_tile_order`` (either order, the sequences
    in the given order or longest first); the CTAs past
    the last one get the tile just past the last sequence's end, head 0, flagged invalid. The
    packed tensor may hold rows past the last sequence; the grid is the smaller of the two
    bounds (``make_varlen_tile_counts``), the longest sequence's passed as given or larger."""
    import itertools

    from scheduler_probe import compile_varlen_decoder

    from cuteattn.kernels.common.tile_scheduler import varlen_tile_order
    from cuteattn.runtime.arch import device_arch

    key = ("varlen", tile, longest_first, heads_fastest, sequences_longest_first)
    if key not in _cache:
        arch = device_arch(torch.device("cuda")).name
        _cache[key] = compile_varlen_decoder(
            tile=tile, longest_first=longest_first, heads_fastest=heads_fastest,
            sequences_longest_first=sequences_longest_first, arch=arch,
        )
    total_rows = sum(lengths) + 3
    order = varlen_tile_order(
        lengths, tile, heads, longest_first, heads_fastest=heads_fastest,
        sequences_longest_first=sequences_longest_first,
    )
    for max_length in (max(lengths), max(lengths) + 2 * tile):
        loose = (total_rows + len(lengths) * (tile - 1)) // tile
        bound = min(loose, len(lengths) * -(-max_length // tile))
        assert bound * heads >= len(order)
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
        tiles = torch.full((bound * heads, 4), -7, dtype=torch.int32, device="cuda")
        _cache[key](cu, total_rows, max_length, heads, 1, tiles)
        torch.cuda.synchronize()
        got = [tuple(row) for row in tiles.tolist()]
        assert got[: len(order)] == [(*work, 1) for work in order]
        past = (-(-lengths[-1] // tile), 0, len(lengths) - 1, 0)
        assert got[len(order):] == [past] * (len(got) - len(order))


@pytest.mark.parametrize("sequences_longest_first", (False, True))
@pytest.mark.parametrize("max_ctas", (1, 5, 132))
@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("lengths", VARLEN_LENGTHS, ids=lambda lengths: f"{len(lengths)}seqs")
def test_persistent_varlen_scheduler_visits_each_tile_once_heads_fastest(
    lengths, longest_first, max_ctas, sequences_longest_first
):
    """Persistent: the CTAs together visit each work tile of ``varlen_tile_order(...,
    heads_fastest=True)`` once (the sequences in the given order or longest first), CTA c the
    work indices c, c + grid, ..., and stop at the last."""
    import itertools

    from scheduler_probe import compile_varlen_decoder

    from cuteattn.kernels.common.tile_scheduler import varlen_tile_order
    from cuteattn.runtime.arch import device_arch

    tile, heads = 64, 3
    key = ("varlen persistent", longest_first, sequences_longest_first)
    if key not in _cache:
        arch = device_arch(torch.device("cuda")).name
        _cache[key] = compile_varlen_decoder(
            tile=tile, longest_first=longest_first, persistent=True,
            sequences_longest_first=sequences_longest_first, arch=arch,
        )
    total_rows = sum(lengths) + 3
    order = varlen_tile_order(
        lengths, tile, heads, longest_first, heads_fastest=True,
        sequences_longest_first=sequences_longest_first,
    )
    loose = (total_rows + len(lengths) * (tile - 1)) // tile
    bound = min(loose, len(lengths) * -(-max(lengths) // tile))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    tiles = torch.full((bound * heads, 4), -7, dtype=torch.int32, device="cuda")
    _cache[key](cu, total_rows, max(lengths), heads, max_ctas, tiles)
    torch.cuda.synchronize()
    got = [tuple(row) for row in tiles.tolist()]
    assert got[: len(order)] == [(*work, 1) for work in order]
    assert got[len(order):] == [(-7,) * 4] * (len(got) - len(order))
