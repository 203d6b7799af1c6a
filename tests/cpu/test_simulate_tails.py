"""CPU tests of scripts/simulate_tails.py: the tile orders cover every work tile once, the
durations follow the causal diagonal, and handing tiles out as SMs free up never ends later
than a static stride's ideal by more than one tile."""

import pytest

from conftest import load_script


@pytest.fixture(scope="module")
def sim():
    return load_script("simulate_tails")


def test_section_order_visits_every_rank_of_every_pair_once(sim):
    for pairs, section, ranks in ((5, 2, 3), (8, 8, 1), (3, 16, 4)):
        order = list(sim.section_order(pairs, section, ranks))
        assert sorted(order) == [(r, p) for r in range(ranks) for p in range(pairs)]


def test_causal_durations_follow_the_diagonal(sim):
    # Forward: query tile m of a 512-row sequence sees m + 1 key tiles of 128 (+ 1 overhead),
    # longest first; backward: key tile n sees the query tiles from its diagonal on.
    assert sim.forward_tiles([512], 1, 128, 128, True) == [5.0, 4.0, 3.0, 2.0]
    assert sim.backward_tiles([512], 1, 128, 128, True) == [5.0, 4.0, 3.0, 2.0]
    # Heads fastest: each tile of the sequence for every head before the next tile.
    assert sim.forward_tiles([256], 2, 128, 128, True) == [3.0, 3.0, 2.0, 2.0]
    assert sim.forward_tiles([256], 2, 128, 128, True, heads_fastest=False) == [3.0, 2.0] * 2
    fixed = sim.forward_tiles([512, 512], 3, 128, 128, True, section=4)
    assert sorted(fixed) == sorted([5.0, 4.0, 3.0, 2.0] * 6)


def test_dynamic_hand_out_is_within_one_tile_of_ideal(sim):
    durations = sim.forward_tiles([4096] * 8, 16, 128, 128, True, section=16)
    ideal = sum(durations) / 132
    assert sim.dynamic_makespan(durations, 132) <= ideal + max(durations)
    assert sim.dynamic_makespan(durations, 132) <= sim.static_makespan(durations, 132)


def test_main_prints_a_row_per_order(sim, capsys):
    rows = sim.main(["--mode", "bwd", "--dims", "128", "--seqlens", "4096"])
    assert [row.split(":")[0] for row in rows] == [
        "bwd d128 4096 causal pair by pair", "bwd d128 4096 causal sections of 4"
    ]
    assert "dynamic" in capsys.readouterr().out


def test_longest_first_sorts_by_tile_count_keeping_ties_in_order(sim):
    assert sim.longest_first([100, 300, 0, 257, 50], 128) == [300, 257, 100, 50, 0]
    assert sim.longest_first([129, 200, 256], 128) == [129, 200, 256]


def test_main_varlen_rows_per_causal_mode_and_order(sim):
    rows = sim.main(["--mode", "fwd", "--dims", "128", "--varlen", "--causal", "both"])
    names = [row.split(":")[0] for row in rows]
    assert len(names) == 8 and names[0] == "fwd d128 varlen causal heads-last"
    assert "fwd d128 varlen dense longest first, heads-fastest" in names


def test_tail_section_is_the_fewest_pairs_reaching_128_key_tiles(sim):
    """``make_tail_section_counts``' rule: GQA, the smallest power of two of pairs whose key
    tiles reach 128 (at most the pairs there are); MHA one pair (the grid order)."""
    assert sim.tail_section(ranks=64, group=8, pairs=16) == 2
    assert sim.tail_section(ranks=8, group=8, pairs=128) == 16
    assert sim.tail_section(ranks=200, group=4, pairs=8) == 1
    assert sim.tail_section(ranks=8, group=32, pairs=4) == 4  # fewer pairs than the rule's 16
    assert sim.tail_section(ranks=8, group=1, pairs=512) == 1


def test_gqa_causal_tail_sections_shorten_the_launch(sim):
    """d128 causal 32 / 4 heads at 8k: in the grid order the last pairs' heaviest key tiles
    start near the end; tail sections leave about 1% idle."""
    rows = sim.main(["--mode", "bwd", "--dims", "128", "--seqlens", "8192", "--hidden", "4096",
                     "--heads-kv", "4", "--causal", "true"])
    idle = {row.split(": ")[0].split("causal ")[1]: float(row.rsplit(" ", 1)[1]) for row in rows}
    assert idle["pair by pair"] > 1.1 and idle["tail sections of 2"] < 1.02
