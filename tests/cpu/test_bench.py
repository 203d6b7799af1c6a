"""CPU tests of the benchmark's pure parts: grid, FLOPs, summary, table, CSV and CLI errors."""

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuteattn.bench.__main__ import build_parser, grid_from_args, main
from cuteattn.bench.backends import (
    BACKEND_NAMES,
    DEFAULT_BACKENDS,
    UnknownBackendError,
    load_backend,
    one_line,
    parse_backend_names,
)
from cuteattn.plan import family_names
from cuteattn.bench.runner import (
    RATIO_COLUMN,
    Shape,
    ShapeResult,
    attention_flops,
    format_summary,
    format_table,
    rotated,
    summarize_ratio,
    tflops,
    write_csv,
)

SRC = Path(__file__).resolve().parents[2] / "src"


def grid(*argv):
    return grid_from_args(build_parser().parse_args(list(argv)))


def test_default_grid_covers_spec():
    shapes = grid()
    assert len(shapes) == 3 * 3 * 2
    assert {s.dim for s in shapes} == {64, 128, 256}
    assert {s.seqlen for s in shapes} == {1024, 4096, 16384}
    assert {s.causal for s in shapes} == {False, True}


def test_default_args():
    args = build_parser().parse_args([])
    assert args.backends == list(DEFAULT_BACKENDS)
    assert (args.dtype, args.tokens, args.hidden, args.rounds, args.iters) == ("bf16", 32768, 2048, 5, 10)
    assert args.csv is None


def test_custom_dims_and_seqlens():
    shapes = grid("--dims", "96", "--seqlens", "512,2048", "--causal", "true")
    assert [(s.dim, s.seqlen, s.causal) for s in shapes] == [(96, 512, True), (96, 2048, True)]
    assert {s.causal for s in grid("--causal", "false")} == {False}


def test_batch_and_heads_follow_tokens_and_hidden():
    by_key = {(s.dim, s.seqlen): s for s in grid("--causal", "false")}
    assert (by_key[64, 1024].batch, by_key[64, 1024].heads) == (32, 32)
    assert (by_key[128, 4096].batch, by_key[128, 4096].heads) == (8, 16)
    assert (by_key[256, 16384].batch, by_key[256, 16384].heads) == (2, 8)


def test_batch_and_heads_are_at_least_one():
    (shape,) = grid("--dims", "128", "--seqlens", "8192", "--causal", "false", "--tokens", "100", "--hidden", "64")
    assert (shape.batch, shape.heads) == (1, 1)


@pytest.mark.parametrize("bad", [["--dims", "0"], ["--seqlens", "a,b"], ["--rounds", "0"], ["--dtype", "fp8"]])
def test_bad_values_are_rejected(bad):
    with pytest.raises(SystemExit):
        build_parser().parse_args(bad)


def test_flops_and_causal_halving():
    full = Shape(dim=128, seqlen=4096, causal=False, batch=8, heads=16)
    causal = Shape(dim=128, seqlen=4096, causal=True, batch=8, heads=16)
    assert attention_flops(full) == 4 * 8 * 16 * 4096 * 4096 * 128
    assert attention_flops(causal) * 2 == attention_flops(full)
    assert tflops(full, 1.0) == pytest.approx(attention_flops(full) / 1e-3 / 1e12)


def test_rotation_gives_every_backend_each_slot():
    names = ["a", "b", "c"]
    orders = [rotated(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert rotated(names, 3) == names
    assert rotated([], 1) == []


def result(dim, seqlen, causal, **ms):
    shape = Shape(dim=dim, seqlen=seqlen, causal=causal, batch=1, heads=1)
    return ShapeResult(shape, {name.replace("_", "-"): value for name, value in ms.items()})


def test_geomean_and_minimum_of_ratio():
    results = [
        result(64, 1024, False, cuteattn=1.0, sdpa_flash=2.0),  # ratio 2
        result(128, 1024, True, cuteattn=2.0, sdpa_flash=1.0),  # ratio 0.5
        result(256, 1024, False, cuteattn=1.0, sdpa_flash=4.0),  # ratio 4
        result(256, 4096, False, sdpa_flash=1.0),  # cuteattn missing: not counted
    ]
    summary = summarize_ratio(results)
    assert summary.rows == 3
    assert summary.geomean == pytest.approx(math.exp((math.log(2) + math.log(0.5) + math.log(4)) / 3))
    assert summary.minimum == pytest.approx(0.5)
    assert (summary.min_shape.dim, summary.min_shape.causal) == (128, True)
    line = format_summary(summary)
    assert "geomean 1.59x" in line and "min 0.50x" in line and "dim=128" in line
    assert summarize_ratio([results[-1]]) is None
    assert "n/a" in format_summary(None)


def test_table_has_one_row_per_shape_and_ratio_column():
    results = [result(64, 1024, False, cuteattn=1.0, sdpa_flash=2.0), result(64, 1024, True, sdpa_flash=1.0)]
    lines = format_table(results, ["cuteattn", "sdpa-flash"]).splitlines()
    assert "4 * batch * heads * seqlen_q * seqlen_k * dim" in lines[0]
    assert lines[1].split() == ["dim", "seqlen", "causal", "batch", "heads", "cuteattn", "sdpa-flash", RATIO_COLUMN]
    expected = f"{tflops(results[0].shape, 1.0):.1f}"
    assert lines[2].split() == ["64", "1024", "False", "1", "1", expected, f"{tflops(results[0].shape, 2.0):.1f}", "2.00"]
    assert lines[3].split()[5] == "-" and lines[3].split()[-1] == "-"
    assert len(lines) == 4


def test_table_omits_ratio_without_both_backends():
    table = format_table([result(64, 1024, False, fa4=1.0)], ["fa4"])
    assert RATIO_COLUMN not in table


def test_csv_round_trip(tmp_path):
    results = [result(64, 1024, False, cuteattn=0.25, sdpa_flash=0.5), result(128, 4096, True, fa4=1.5)]
    path = tmp_path / "bench.csv"
    write_csv(str(path), results, "bf16")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["dim"], r["seqlen"], r["causal"], r["backend"]) for r in rows] == [
        ("64", "1024", "False", "cuteattn"),
        ("64", "1024", "False", "sdpa-flash"),
        ("128", "4096", "True", "fa4"),
    ]
    for row, (res, backend) in zip(rows, [(results[0], "cuteattn"), (results[0], "sdpa-flash"), (results[1], "fa4")]):
        assert row["dtype"] == "bf16"
        assert (int(row["batch"]), int(row["heads"])) == (res.shape.batch, res.shape.heads)
        assert float(row["median_ms"]) == pytest.approx(res.ms_by_backend[backend])
        assert float(row["tflops"]) == pytest.approx(res.tflops(backend), rel=1e-3)


def test_backend_names_parse_in_order_without_repeats():
    assert parse_backend_names("fa4, cuteattn,fa4") == ["fa4", "cuteattn"]


def test_unknown_backend_lists_valid_names(capsys):
    with pytest.raises(UnknownBackendError, match="nope.*valid names: cuteattn, sdpa-flash, sdpa-cudnn, fa4"):
        parse_backend_names("cuteattn,nope")
    with pytest.raises(SystemExit) as excinfo:
        main(["--backends", "sdpa-flash,nope"])
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert "unknown backend(s): nope" in err and "sdpa-cudnn" in err


def test_every_family_is_a_backend():
    assert set(DEFAULT_BACKENDS) <= set(BACKEND_NAMES)
    for name in family_names():
        assert f"cuteattn-{name}" in BACKEND_NAMES
        assert f"cuteattn-{name}" not in DEFAULT_BACKENDS
    assert parse_backend_names("cuteattn-sm80,cuteattn") == ["cuteattn-sm80", "cuteattn"]
    args = build_parser().parse_args(["--backends", "cuteattn,cuteattn-sm80"])
    assert args.backends == ["cuteattn", "cuteattn-sm80"]


def test_family_backend_forces_its_family(monkeypatch):
    from cuteattn import api

    calls = []

    def fake_forward(q, k, v, **kwargs):
        calls.append(kwargs)
        return "out", "lse"

    monkeypatch.setattr(api, "forward", fake_forward)
    call = load_backend("cuteattn-sm80")("q", "k", "v", True)
    assert call() == "out"
    assert calls == [{"causal": True, "family": "sm80"}]


def test_one_line_keeps_type_and_first_line():
    assert one_line(ImportError("no module\nmore detail")) == "ImportError: no module"
    assert one_line(RuntimeError()) == "RuntimeError"


def run_cli(*argv):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["CUDA_VISIBLE_DEVICES"] = ""  # behave as a CPU-only machine even where a GPU exists
    return subprocess.run(
        [sys.executable, "-m", "cuteattn.bench", *argv], env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_without_cuda_exits_2_with_message():
    proc = run_cli("--rounds", "1")
    assert proc.returncode == 2, proc.stderr
    # Earlier stderr lines may be torch import warnings (e.g. NumPy missing); ours is one line, last.
    assert "needs a CUDA GPU" in proc.stderr.strip().splitlines()[-1]
    assert proc.stdout == ""


def test_cli_help_states_flops_convention():
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert "halved when causal" in " ".join(proc.stdout.split())
