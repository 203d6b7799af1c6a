"""CPU tests of scripts/tune_sm90.py's plain-Python parts: tile parsing, candidate plans (and
the ones the sm90 family cannot implement), the planner's choice, the per-shape line."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuteattn.arch import arch_from_name
from cuteattn.bench.runner import Shape, ShapeResult, check_input_sizes, tflops

from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tune_sm90.py"
HOPPER = arch_from_name("sm_90a")


@pytest.fixture(scope="module")
def tune():
    return load_script("tune_sm90")


def test_tile_list(tune):
    assert tune.tile_list("128x128x2, 192X128x2") == [(128, 128, 2), (192, 128, 2)]
    for bad in ("128x128", "128x0x2", "axbxc", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            tune.tile_list(bad)


def test_candidates_skip_what_the_family_cannot_implement(tune):
    shape = Shape(dim=128, seqlen=1024, causal=True, batch=32, heads=16)
    plans, skipped = tune.candidates(HOPPER, shape, "bf16", [(128, 128, 2), (96, 128, 2)], (True, False))
    # Causal and persistent: the static stride and the dynamic hand-out.
    assert list(plans) == ["128x128x2-persistent", "128x128x2-dynamic", "128x128x2-single"]
    assert skipped == [  # tile_m is 64 rows per warpgroup
        "96x128x2-persistent", "96x128x2-dynamic", "96x128x2-single"
    ]
    assert plans["128x128x2-dynamic"].option("dynamic") is True
    plan = plans["128x128x2-persistent"]
    assert (plan.family, plan.head_dim, plan.causal, plan.num_stages) == ("sm90", 128, True, 2)
    assert plan.option("persistent") and plan.option("pingpong")  # ping-pong as the family defaults it


def test_candidates_default_to_the_family_tiles(tune):
    from cuteattn.kernels.sm90.family import SM90_TILES

    shape = Shape(dim=256, seqlen=4096, causal=False, batch=8, heads=8)
    plans, skipped = tune.candidates(HOPPER, shape, "bf16", None, (False,))
    assert [(p.tile_m, p.tile_n, p.num_stages) for p in plans.values()] == [
        tuple(entry[:3]) for entry in SM90_TILES[(256, False)]
    ]
    assert skipped == []


def test_planner_choice_is_named_like_a_candidate(tune):
    gqa = Shape(dim=128, seqlen=8192, causal=True, batch=4, heads=32, heads_kv=4)
    plans, _ = tune.candidates(HOPPER, gqa, "bf16", None, (True, False))
    assert tune.planner_choice(HOPPER, gqa, "bf16") in plans
    assert tune.planner_choice(arch_from_name("sm_80"), gqa, "bf16") == "n/a"


def test_backward_candidates_are_the_family_offers(tune):
    """--mode bwd: every backward plan the family offers for the head dim (sm90 d256: 64 x 64
    and 64 x 48; sm80 d64: 128 x 128 and 64 x 128), or those --bwd-tile-m names; the planner's
    is one of them."""
    wide = Shape(dim=256, seqlen=4096, causal=True, batch=8, heads=8)
    plans = tune.backward_candidates(HOPPER, wide, "bf16")
    assert list(plans) == ["bwd-64x64", "bwd-64x48"]
    assert all(plan.kind == "backward" and plan.causal for plan in plans.values())
    assert tune.planner_choice(HOPPER, wide, "bf16", "bwd") == "bwd-64x64"
    shape = Shape(dim=64, seqlen=4096, causal=True, batch=8, heads=32)
    assert list(tune.backward_candidates(HOPPER, shape, "bf16")) == ["bwd-128x128", "bwd-64x128"]
    sm80 = tune.backward_candidates(HOPPER, shape, "bf16", family="sm80")
    assert list(sm80) == ["bwd-128x128-sm80", "bwd-64x128-sm80"]
    assert list(tune.backward_candidates(HOPPER, shape, "bf16", [128], "sm80")) == ["bwd-128x128-sm80"]
    assert tune.planner_choice(HOPPER, shape, "bf16", "bwd", "sm80") == "bwd-128x128-sm80"


def test_deterministic_backward_candidates_sit_next_to_the_plain_ones(tune):
    """--deterministic both: each tile twice, the deterministic plan named -det (its plan
    carries the option, so its binder asks api.backward for deterministic=True)."""
    shape = Shape(dim=128, seqlen=4096, causal=False, batch=8, heads=16)
    plans = tune.backward_candidates(HOPPER, shape, "bf16", deterministic=(False, True))
    assert list(plans) == ["bwd-64x128", "bwd-80x128", "bwd-64x128-det", "bwd-80x128-det"]
    assert [plan.option("deterministic", False) for plan in plans.values()] == [
        False, False, True, True,
    ]
    only = tune.backward_candidates(HOPPER, shape, "bf16", [80], deterministic=(True,))
    assert list(only) == ["bwd-80x128-det"]


def test_shape_line_names_the_best_candidate_against_the_faster_peer(tune):
    shape = Shape(dim=256, seqlen=1024, causal=False, batch=32, heads=8)
    names = ["128x80x2-single", "128x64x2-single", "fa4", "sdpa-cudnn"]
    result = ShapeResult(shape, {"128x80x2-single": 1.0, "128x64x2-single": 0.8, "fa4": 1.2, "sdpa-cudnn": 1.0})
    t = {name: f"{tflops(shape, ms):.1f}" for name, ms in result.ms_by_backend.items()}
    assert tune.shape_line(shape, result, names, "128x80x2-single") == (
        f"d256 s1024 causal=False heads=8/8: 128x80x2-single {t['128x80x2-single']}, "
        f"128x64x2-single {t['128x64x2-single']}, fa4 {t['fa4']}, sdpa-cudnn {t['sdpa-cudnn']}"
        " | best 128x64x2-single: 1.25x sdpa-cudnn | planner 128x80x2-single"
    )
    sm80 = ShapeResult(shape, {"bwd-64x128-sm80": 1.0, "fa4": 0.5, "sdpa-flash": 1.1})
    sm80_names = ["bwd-64x128-sm80", "fa4", "sdpa-flash"]
    peers = ("fa4", "sdpa-cudnn", "sdpa-flash")
    line = tune.shape_line(shape, sm80, sm80_names, "bwd-64x128-sm80", peers)
    assert line.endswith("| best bwd-64x128-sm80: 0.50x fa4, 1.10x sdpa-flash | planner bwd-64x128-sm80")
    no_peer = ShapeResult(shape, {"128x80x2-single": 1.0})
    assert tune.shape_line(shape, no_peer, names, "n/a").endswith("| best 128x80x2-single: no peer | planner n/a")


def test_help_runs_without_a_gpu():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr
    assert "--tiles" in proc.stdout and "--persistent" in proc.stdout


def test_one_q_stage_candidates(tune):
    """Persistent plans that fit two Q stages: as the planner chooses by default (d128 dense:
    one), or each way ("-q1": one); plans with one stage anyway get no "-q1" twin."""
    dense = Shape(dim=128, seqlen=4096, causal=False, batch=8, heads=16)
    plans, _ = tune.candidates(HOPPER, dense, "bf16", None, (True,))
    assert list(plans) == ["128x128x2-persistent-q1"]
    assert tune.planner_choice(HOPPER, dense, "bf16") in plans
    plans, _ = tune.candidates(HOPPER, dense, "bf16", None, (True, False), one_q_stage_modes=(False, True))
    assert list(plans) == ["128x128x2-persistent", "128x128x2-persistent-q1", "128x128x2-single"]
    wide = Shape(dim=256, seqlen=4096, causal=False, batch=8, heads=8)
    plans, _ = tune.candidates(HOPPER, wide, "bf16", [(128, 80, 2)], (True,), one_q_stage_modes=(False, True))
    assert list(plans) == ["128x80x2-persistent"]


def test_rows_too_large_for_the_gpu_are_refused_before_any_run(tune, capsys):
    """A decode row at the default 32k tokens (batch 32768 with 8192 keys: 2 TiB of k and v)
    is refused with a message that names the row; the bench grid's rows fit."""
    huge = Shape(dim=128, seqlen=1, causal=False, batch=32768, heads=16, heads_kv=2, seqlen_k=8192)
    with pytest.raises(ValueError, match="seqlen_k=8192.*--tokens"):
        check_input_sizes([huge])
    check_input_sizes([Shape(dim=256, seqlen=16384, causal=True, batch=2, heads=8)])
    with pytest.raises(SystemExit):
        tune.main(["--dims", "128", "--seqlens", "1", "--seqlen-k", "8192", "--heads-kv", "2"])
    assert "give --tokens (or the row's batch) a smaller count" in capsys.readouterr().err


def test_eager_rescale_and_exp2_poly_candidates(tune):
    """--eager-rescale both / --rescale-before-pv both / --hold-descriptors both / --exp2-poly:
    each tile's plan with the switch on and off, and with a share of exponentials on the FMA
    pipe; a suffix names only a departure from the family's default, so the planner's plan is
    named like its candidate (d64: eager, O rescaled after the softmax, descriptors held)."""
    shape = Shape(dim=64, seqlen=4096, causal=False, batch=8, heads=32)
    plans, skipped = tune.candidates(
        HOPPER, shape, "bf16", [(192, 128, 2)], (True,), exp2_poly=(0, 8), eager_modes=(True, False)
    )
    assert skipped == []
    assert list(plans) == [
        "192x128x2-persistent", "192x128x2-persistent-lazy",
        "192x128x2-persistent-poly8", "192x128x2-persistent-poly8-lazy",
    ]
    assert plans["192x128x2-persistent-lazy"].option("eager_rescale") is False
    assert plans["192x128x2-persistent-poly8"].option("exp2_poly") == 8
    timed, _ = tune.candidates(
        HOPPER, shape, "bf16", [(192, 128, 2)], (True,), early_modes=(True, False)
    )
    assert list(timed) == ["192x128x2-persistent-early", "192x128x2-persistent"]
    assert timed["192x128x2-persistent"].option("rescale_before_pv") is False
    held, _ = tune.candidates(
        HOPPER, shape, "bf16", [(192, 128, 2)], (True,), held_modes=(True, False)
    )
    held_name, unheld_name = "192x128x2-persistent", "192x128x2-persistent-unheld"
    assert list(held) == [held_name, unheld_name]
    assert held[held_name].option("hold_descriptors") is True
    default, _ = tune.candidates(HOPPER, shape, "bf16", [(192, 128, 2)], (True,))
    assert list(default) == ["192x128x2-persistent"]
    assert tune.planner_choice(HOPPER, shape, "bf16") in default
    wide = Shape(dim=128, seqlen=4096, causal=False, batch=8, heads=16)
    lazy_default, _ = tune.candidates(
        HOPPER, wide, "bf16", [(128, 128, 2)], (True,), eager_modes=(True, False)
    )
    assert list(lazy_default) == ["128x128x2-persistent-q1-eager", "128x128x2-persistent-q1"]
    assert tune.planner_choice(HOPPER, wide, "bf16") in lazy_default


def test_held_backward_candidates(tune):
    """--mode bwd --hold-descriptors both: each backward tile with its descriptors held and
    not; the suffix names the departure from the family's default (held up to d128)."""
    shape = Shape(dim=128, seqlen=4096, causal=False, batch=8, heads=16)
    plans = tune.backward_candidates(HOPPER, shape, "bf16", held_modes=(True, False))
    assert list(plans) == ["bwd-64x128", "bwd-64x128-unheld", "bwd-80x128", "bwd-80x128-unheld"]
    assert plans["bwd-64x128"].option("hold_descriptors") is True
    wide = Shape(dim=256, seqlen=4096, causal=False, batch=8, heads=8)
    assert list(tune.backward_candidates(HOPPER, wide, "bf16", held_modes=(True,))) == [
        "bwd-64x64-held", "bwd-64x48-held"
    ]
    # d192: the tile with two Q stages and one dO stage is named apart from its one-stage twin.
    d192 = Shape(dim=192, seqlen=4096, causal=False, batch=8, heads=10)
    assert list(tune.backward_candidates(HOPPER, d192, "bf16")) == [
        "bwd-64x96-q2do1", "bwd-64x96", "bwd-64x64"
    ]
