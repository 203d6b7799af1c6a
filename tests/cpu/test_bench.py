"""CPU tests of the benchmark's pure parts: grid (GQA, extra rows), FLOPs, ratios against the
best peer and sdpa-flash, summaries, table, CSV and CLI errors."""

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    BEST_PEER_COLUMN,
    PEER_NAME_COLUMN,
    SDPA_FLASH_COLUMN,
    ExtraShape,
    RowRatio,
    Shape,
    ShapeResult,
    attention_flops,
    best_peer_ratio,
    build_grid,
    format_summaries,
    format_summary,
    format_table,
    parse_extra_shape,
    ratio_columns,
    rotated,
    sdpa_flash_ratio,
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
    assert args.settle_calls == 0
    assert build_parser().parse_args(["--settle-calls", "1"]).settle_calls == 1
    assert args.csv is None
    assert (args.heads_kv, args.extra_shape) == (None, [])
    assert all(s.heads_kv == s.heads for s in grid())


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


def test_heads_kv_applies_to_every_grid_row():
    shapes = grid("--heads-kv", "4")
    assert len(shapes) == 18
    assert {(s.heads, s.heads_kv) for s in shapes} == {(32, 4), (16, 4), (8, 4)}
    assert {s.heads_kv for s in grid("--heads-kv", "1", "--dims", "128")} == {1}  # MQA


def test_heads_kv_must_divide_heads(capsys):
    with pytest.raises(ValueError, match="heads_kv 3 must divide heads 32"):
        grid("--heads-kv", "3")
    with pytest.raises(ValueError, match="heads_kv 16 must divide heads 8"):
        grid("--heads-kv", "16")  # d256 has 8 heads at hidden 2048
    # The CLI says so (exit 2) before looking for a GPU.
    with pytest.raises(SystemExit) as excinfo:
        main(["--heads-kv", "3"])
    assert excinfo.value.code == 2
    assert "heads_kv 3 must divide heads 32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--heads-kv", "0"])


def test_rows_whose_inputs_exceed_the_gpu_are_refused(capsys):
    """A decode row with the grid's batch (32768 // 1 with 8192 keys: terabytes of k and v)
    exits 2 naming the row, before looking for a GPU; the default grid fits."""
    with pytest.raises(ValueError, match="seqlen_k=8192.*smaller count"):
        grid("--dims", "128", "--extra-shape", "dim=128,seqlen=1,seqlen_k=8192,causal=false")
    grid("--dims", "128", "--extra-shape", "dim=128,seqlen=1,seqlen_k=8192,causal=false,batch=64")
    grid()
    with pytest.raises(SystemExit) as excinfo:
        main(["--dims", "128", "--extra-shape", "dim=128,seqlen=1,seqlen_k=8192"])
    assert excinfo.value.code == 2
    assert "smaller count" in capsys.readouterr().err


def test_shape_heads_kv_defaults_to_heads_and_is_checked():
    mha = Shape(dim=128, seqlen=1024, causal=False, batch=1, heads=16)
    assert mha.heads_kv == 16
    assert mha.label() == "dim=128 seqlen=1024 causal=False heads=16"
    gqa = Shape(dim=128, seqlen=8192, causal=True, batch=4, heads=32, heads_kv=4)
    assert gqa.label() == "dim=128 seqlen=8192 causal=True heads=32 heads_kv=4"
    for bad in (5, 0, 64):
        with pytest.raises(ValueError):
            Shape(dim=128, seqlen=1024, causal=False, batch=1, heads=32, heads_kv=bad)


def test_parse_extra_shape():
    assert parse_extra_shape("dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both") == ExtraShape(
        dim=128, seqlen=8192, causal=(False, True), heads=32, heads_kv=4
    )
    assert parse_extra_shape(" seqlen=512 , dim=64, causal=TRUE, batch=3 ,") == ExtraShape(
        dim=64, seqlen=512, causal=(True,), batch=3
    )
    assert parse_extra_shape("dim=64,seqlen=512") == ExtraShape(dim=64, seqlen=512)


@pytest.mark.parametrize(
    "text, message",
    [
        ("seqlen=512", "lacks dim"),
        ("heads=4", "lacks dim and seqlen"),
        ("dim=64,seqlen=512,window=3", "bad item 'window=3'"),
        ("dim=64,seqlen", "bad item 'seqlen'"),
        ("dim=64,seqlen=512,causal=maybe", "causal must be one of both, true, false"),
        ("dim=64,seqlen=512,heads=0", "heads must be a positive integer"),
        ("dim=64,seqlen=x", "seqlen must be a positive integer"),
        ("dim=64,seqlen=512,dim=128", "dim given twice"),
    ],
)
def test_parse_extra_shape_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_extra_shape(text)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--extra-shape", text])


def test_acceptance_table_in_one_invocation():
    # Default grid plus the GQA 32/4 d128 row at seqlen 8192, causal and not.
    shapes = grid("--extra-shape", "dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both")
    assert len(shapes) == 18 + 2
    assert all(s.heads_kv == s.heads for s in shapes[:18])
    assert shapes[18:] == [
        Shape(dim=128, seqlen=8192, causal=False, batch=4, heads=32, heads_kv=4),
        Shape(dim=128, seqlen=8192, causal=True, batch=4, heads=32, heads_kv=4),
    ]


def test_extra_shape_takes_grid_values_for_missing_keys():
    shapes = grid(
        "--dims", "64", "--seqlens", "1024", "--causal", "true", "--heads-kv", "2", "--tokens", "8192",
        "--extra-shape", "dim=256,seqlen=2048",
        "--extra-shape", "dim=128,seqlen=4096,heads_kv=16,batch=1,causal=false",
    )
    assert shapes == [
        Shape(dim=64, seqlen=1024, causal=True, batch=8, heads=32, heads_kv=2),
        Shape(dim=256, seqlen=2048, causal=True, batch=4, heads=8, heads_kv=2),
        Shape(dim=128, seqlen=4096, causal=False, batch=1, heads=16, heads_kv=16),
    ]


def test_extra_shape_repeating_a_grid_row_is_kept_once():
    shapes = grid("--dims", "64", "--seqlens", "1024", "--extra-shape", "dim=64,seqlen=1024,causal=true")
    assert [(s.dim, s.seqlen, s.causal) for s in shapes] == [(64, 1024, False), (64, 1024, True)]
    # Extra rows are checked like grid rows.
    with pytest.raises(ValueError, match="heads_kv 3 must divide heads 16"):
        build_grid([], [], (False,), 32768, 2048, extra=[ExtraShape(dim=128, seqlen=1024, heads_kv=3)])


@pytest.mark.parametrize(
    "bad",
    [["--dims", "0"], ["--seqlens", "a,b"], ["--rounds", "0"], ["--dtype", "fp8"], ["--settle-calls", "-1"]],
)
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


def result(dim, seqlen, causal, heads=1, heads_kv=None, **ms):
    shape = Shape(dim=dim, seqlen=seqlen, causal=causal, batch=1, heads=heads, heads_kv=heads_kv)
    return ShapeResult(shape, {name.replace("_", "-"): value for name, value in ms.items()})


def test_best_peer_is_the_faster_peer_measured_on_the_row():
    # Ratios are cuteattn TFLOP/s over the peer's: peer time / cuteattn time.
    assert best_peer_ratio(result(64, 1024, False, cuteattn=1.0, fa4=2.0, sdpa_cudnn=1.5)) == RowRatio(1.5, "sdpa-cudnn")
    assert best_peer_ratio(result(64, 1024, False, cuteattn=2.0, fa4=1.0, sdpa_cudnn=1.5)) == RowRatio(0.5, "fa4")
    assert best_peer_ratio(result(64, 1024, False, cuteattn=1.0, fa4=3.0)) == RowRatio(3.0, "fa4")
    # sdpa-flash is not a peer for best-peer; it has its own ratio.
    flash_only = result(64, 1024, False, cuteattn=1.0, sdpa_flash=0.5)
    assert best_peer_ratio(flash_only) is None
    assert sdpa_flash_ratio(flash_only) == RowRatio(0.5, "sdpa-flash")
    assert best_peer_ratio(result(64, 1024, False, fa4=1.0, sdpa_cudnn=1.0)) is None  # no cuteattn
    assert sdpa_flash_ratio(result(64, 1024, False, cuteattn=1.0, fa4=1.0)) is None


def test_ratio_columns_follow_the_backends_that_ran():
    assert [c for c, _ in ratio_columns(["cuteattn", "sdpa-flash", "sdpa-cudnn", "fa4"])] == [
        BEST_PEER_COLUMN, SDPA_FLASH_COLUMN,
    ]
    assert [c for c, _ in ratio_columns(["cuteattn", "sdpa-cudnn"])] == [BEST_PEER_COLUMN]
    assert [c for c, _ in ratio_columns(["sdpa-flash", "cuteattn"])] == [SDPA_FLASH_COLUMN]
    assert ratio_columns(["fa4", "sdpa-flash", "cuteattn-sm80"]) == []


def test_deterministic_variants_report_their_cost_per_row():
    backends = ["cuteattn", "fa4", "cuteattn-deterministic", "fa4-deterministic"]
    columns = dict(ratio_columns(backends))
    assert list(columns) == [
        BEST_PEER_COLUMN, "cuteattn-deterministic/cuteattn", "fa4-deterministic/fa4",
    ]
    row = result(128, 4096, True, cuteattn=1.0, fa4=0.9, cuteattn_deterministic=1.25,
                 fa4_deterministic=1.0)
    assert columns["cuteattn-deterministic/cuteattn"](row) == RowRatio(0.8, "cuteattn")
    assert columns["fa4-deterministic/fa4"](row).value == pytest.approx(0.9)
    # Without the plain run there is nothing to compare with.
    assert ratio_columns(["cuteattn-deterministic", "fa4"]) == []
    summary = format_summaries([row], backends)
    assert "cuteattn-deterministic/cuteattn overall: geomean 0.80x over 1 rows" in summary


def summary_results():
    return [
        result(64, 1024, False, cuteattn=1.0, fa4=2.0, sdpa_cudnn=3.0, sdpa_flash=2.0),  # 2 (fa4)
        result(64, 4096, False, cuteattn=1.0, fa4=9.0, sdpa_cudnn=8.0, sdpa_flash=0.5),  # 8 (sdpa-cudnn)
        result(128, 1024, True, cuteattn=2.0, fa4=1.0, sdpa_flash=1.0),  # 0.5 (fa4)
        result(128, 8192, True, heads=32, heads_kv=4, cuteattn=1.0, fa4=0.25, sdpa_flash=4.0),  # 0.25
        result(256, 1024, False, cuteattn=1.0, sdpa_flash=4.0),  # no peer: no best-peer ratio
        result(256, 4096, False, fa4=1.0, sdpa_flash=1.0),  # no cuteattn: no ratio at all
    ]


def test_best_peer_summary_overall_groups_and_minimum():
    summary = summarize_ratio(summary_results())
    assert summary.rows == 4
    assert summary.geomean == pytest.approx((2 * 8 * 0.5 * 0.25) ** 0.25)
    assert (summary.minimum, summary.min_peer) == (pytest.approx(0.25), "fa4")
    assert (summary.min_shape.dim, summary.min_shape.seqlen, summary.min_shape.heads_kv) == (128, 8192, 4)
    assert [(g.dim, g.causal, g.rows) for g in summary.groups] == [(64, False, 2), (128, True, 2)]
    assert [g.geomean for g in summary.groups] == [pytest.approx(4.0), pytest.approx(math.sqrt(0.125))]
    lines = format_summary(summary, BEST_PEER_COLUMN).splitlines()
    assert lines == [
        f"{BEST_PEER_COLUMN} overall: geomean 1.19x over 4 rows; "
        "min 0.25x at dim=128 seqlen=8192 causal=True heads=32 heads_kv=4 (vs fa4)",
        "  dim=64 causal=False: geomean 4.00x over 2 rows",
        "  dim=128 causal=True: geomean 0.35x over 2 rows",
    ]


def test_sdpa_flash_summary():
    summary = summarize_ratio(summary_results(), sdpa_flash_ratio)
    assert summary.rows == 5
    assert summary.geomean == pytest.approx(math.exp((math.log(2) + math.log(0.5) * 2 + math.log(4) * 2) / 5))
    assert (summary.minimum, summary.min_shape.seqlen) == (pytest.approx(0.5), 4096)  # first of the ties
    line = format_summary(summary, SDPA_FLASH_COLUMN).splitlines()[0]
    assert line == f"{SDPA_FLASH_COLUMN} overall: geomean 1.52x over 5 rows; min 0.50x at dim=64 seqlen=4096 causal=False heads=1"
    assert [(g.dim, g.causal, g.rows) for g in summary.groups] == [(64, False, 2), (128, True, 2), (256, False, 1)]


def test_summary_is_na_without_a_measured_pair():
    assert summarize_ratio([result(64, 1024, False, cuteattn=1.0, sdpa_flash=1.0)]) is None
    assert format_summary(None, BEST_PEER_COLUMN) == f"{BEST_PEER_COLUMN}: n/a (no row was measured by both sides)"


def test_summaries_follow_the_backends_that_ran():
    results = summary_results()
    text = format_summaries(results, ["cuteattn", "sdpa-flash", "sdpa-cudnn", "fa4"])
    headers = [line for line in text.splitlines() if not line.startswith("  ")]
    assert headers[0].startswith("# ratio = A TFLOP/s / B TFLOP/s for a column A/B")
    assert "best-peer = the faster of fa4, sdpa-cudnn per row" in headers[0]
    assert headers[1].startswith(f"{BEST_PEER_COLUMN} overall: geomean 1.19x")
    assert headers[2].startswith(f"{SDPA_FLASH_COLUMN} overall: geomean 1.52x")
    only_flash = format_summaries(results, ["cuteattn", "sdpa-flash"])
    assert BEST_PEER_COLUMN not in only_flash and SDPA_FLASH_COLUMN in only_flash
    # A peer that ran but measured nothing where cuteattn did: the line says n/a.
    assert f"{BEST_PEER_COLUMN}: n/a" in format_summaries([results[4]], ["cuteattn", "fa4"])
    assert format_summaries(results, ["fa4", "sdpa-flash"]) == ""


def test_table_has_one_row_per_shape_and_ratio_columns():
    results = [
        result(64, 1024, False, cuteattn=1.0, sdpa_flash=2.0, sdpa_cudnn=1.5, fa4=3.0),
        result(128, 8192, True, heads=32, heads_kv=4, sdpa_flash=1.0, fa4=1.0),
        result(64, 4096, True, cuteattn=1.0, sdpa_flash=1.0),
    ]
    backends = ["cuteattn", "sdpa-flash", "sdpa-cudnn", "fa4"]
    lines = format_table(results, backends).splitlines()
    assert "4 * batch * heads * seqlen_q * seqlen_k * dim" in lines[0]
    assert lines[1].split() == [
        "dim", "seqlen", "seqlen_k", "causal", "batch", "heads", "heads_kv", *backends,
        PEER_NAME_COLUMN, BEST_PEER_COLUMN, SDPA_FLASH_COLUMN,
    ]
    shape = results[0].shape
    assert lines[2].split() == [
        "64", "1024", "1024", "False", "1", "1", "1",
        *(f"{tflops(shape, ms):.1f}" for ms in (1.0, 2.0, 1.5, 3.0)),
        "sdpa-cudnn", "1.50", "2.00",
    ]
    gqa = lines[3].split()
    assert gqa[:8] == ["128", "8192", "8192", "True", "1", "32", "4", "-"]
    assert gqa[-3:] == ["-", "-", "-"]
    assert lines[4].split()[-3:] == ["-", "-", "1.00"]  # no peer measured: no best-peer ratio
    assert len(lines) == 5


def test_table_omits_ratios_that_cannot_exist():
    table = format_table([result(64, 1024, False, fa4=1.0, sdpa_flash=1.0)], ["fa4", "sdpa-flash"])
    assert "cuteattn/" not in table and PEER_NAME_COLUMN not in table
    header = format_table([result(64, 1024, False, cuteattn=1.0, fa4=1.0)], ["cuteattn", "fa4"]).splitlines()[1]
    assert header.split()[-2:] == [PEER_NAME_COLUMN, BEST_PEER_COLUMN]
    assert SDPA_FLASH_COLUMN not in header


def test_csv_round_trip(tmp_path):
    results = [
        result(64, 1024, False, cuteattn=0.25, sdpa_flash=0.5),
        result(128, 4096, True, heads=32, heads_kv=4, fa4=1.5),
    ]
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
        assert (int(row["batch"]), int(row["heads"]), int(row["heads_kv"])) == (
            res.shape.batch, res.shape.heads, res.shape.heads_kv
        )
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
        assert f"cuteattn-{name}-deterministic" in BACKEND_NAMES
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
    assert calls == [
        {"causal": True, "window_size": (-1, -1), "softcap": 0.0, "family": "sm80",
         "return_lse": False, "deterministic": False}
    ]
    load_backend("cuteattn-sm80", softcap=50.0, window=(4096, 0))("q", "k", "v", False)()
    assert calls[-1] == {
        "causal": False, "window_size": (4096, 0), "softcap": 50.0, "family": "sm80",
        "return_lse": False, "deterministic": False,
    }
    # A family's deterministic variant (its cost per row: ``--mode bwd``).
    load_backend("cuteattn-sm80-deterministic")("q", "k", "v", True)()
    assert calls[-1]["family"] == "sm80" and calls[-1]["deterministic"] is True


def test_sdpa_backends_have_no_softcap():
    bind = load_backend("sdpa-flash", softcap=30.0)
    with pytest.raises(ValueError, match=r"SDPA has no softcap"):
        bind("q", "k", "v", False)


@pytest.mark.parametrize("backend", ["sdpa-flash", "sdpa-cudnn"])
def test_sdpa_backends_pass_enable_gqa_only_for_gqa(monkeypatch, backend):
    import torch
    import torch.nn.functional

    calls = []

    def fake_sdpa(q, k, v, **kwargs):
        calls.append(((q.shape, k.shape, v.shape), kwargs))
        return q

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", fake_sdpa)
    bind = load_backend(backend)
    q = torch.zeros(2, 8, 32, 16)  # (batch, seqlen, heads, dim)
    kv = torch.zeros(2, 8, 4, 16)
    bind(q, kv, kv, True)()
    bind(q, q, q, False)()
    assert calls == [
        (((2, 32, 8, 16), (2, 4, 8, 16), (2, 4, 8, 16)), {"is_causal": True, "enable_gqa": True}),
        (((2, 32, 8, 16),) * 3, {"is_causal": False}),
    ]


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


def test_seqlen_k_rows():
    (decode,) = grid("--dims", "128", "--seqlens", "1024", "--causal", "false", "--heads-kv", "2",
                     "--extra-shape", "dim=128,seqlen=1,seqlen_k=8192,batch=4,causal=false")[1:]
    assert (decode.seqlen, decode.seqlen_k, decode.batch) == (1, 8192, 4)
    assert decode.label() == "dim=128 seqlen=1 seqlen_k=8192 causal=False heads=16 heads_kv=2"
    assert attention_flops(decode) == 4 * 4 * 16 * 1 * 8192 * 128
    square = Shape(dim=64, seqlen=512, causal=True, batch=1, heads=2)
    assert square.seqlen_k == 512 and "seqlen_k" not in square.label()


def test_backward_binder_times_the_gradient_of_a_recorded_forward():
    from cuteattn.bench.backends import backward_binder

    forward_calls = []

    def bind(q, k, v, causal):
        def call():
            forward_calls.append(causal)
            return q * k.sum() + v

        return call

    q, k, v = (torch.randn(2, 3) for _ in range(3))
    call = backward_binder(bind)(q, k, v, True)
    dq, dk, dv = call()
    dq_again, _, _ = call()  # the graph is retained: the call repeats
    assert forward_calls == [True]  # the forward ran once, at bind time
    assert torch.equal(dq, dq_again) and dv.shape == v.shape and not q.requires_grad


def test_backward_rows_count_two_and_a_half_forwards():
    from cuteattn.bench.runner import BACKWARD_FLOPS_FACTOR

    shape = Shape(dim=64, seqlen=1024, causal=False, batch=1, heads=8)
    forward = ShapeResult(shape, {"cuteattn": 2.0})
    backward = ShapeResult(shape, {"cuteattn": 2.0}, BACKWARD_FLOPS_FACTOR)
    assert backward.tflops("cuteattn") == pytest.approx(2.5 * forward.tflops("cuteattn"))
    assert "TFLOP/s, backward" in format_table([backward], ["cuteattn"], "bwd")


def test_softcap_option():
    assert build_parser().parse_args([]).softcap == 0.0
    assert build_parser().parse_args(["--softcap", "50"]).softcap == 50.0
    for bad in ("-1", "inf", "x"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--softcap", bad])


def test_window_option():
    assert build_parser().parse_args([]).window == (-1, -1)
    assert build_parser().parse_args(["--window", "4096,0"]).window == (4096, 0)
    for bad in ("-2,0", "4096", "a,b"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--window", bad])
    with pytest.raises(ValueError, match=r"local window"):
        load_backend("sdpa-cudnn", window=(128, 0))("q", "k", "v", False)


def test_varlen_rows():
    """--varlen: one packed row per (dim, causal), lengths 128..8192 summing to --tokens, the
    same every run; FLOPs sum the sequences' own squares."""
    from cuteattn.bench.runner import attention_flops, varlen_lengths

    shapes = grid_from_args(build_parser().parse_args(["--varlen", "--dims", "64,128"]))
    assert [(s.dim, s.causal) for s in shapes] == [
        (64, False), (64, True), (128, False), (128, True)
    ]
    lengths = shapes[0].lengths
    assert sum(lengths) == 32768 and all(128 <= n <= 8192 for n in lengths)
    assert lengths == varlen_lengths(32768) and len(set(lengths)) > 3
    assert shapes[0].batch == len(lengths) and shapes[0].seqlen == max(lengths)
    assert attention_flops(shapes[0]) == 4 * shapes[0].heads * 64 * sum(n * n for n in lengths)
    assert attention_flops(shapes[1]) == attention_flops(shapes[0]) // 2
    assert "varlen" in shapes[0].label()
    # Many short sequences (a packed batch of thousands: the varlen schedulers' scans).
    short = grid_from_args(build_parser().parse_args(
        ["--varlen", "--dims", "64", "--varlen-lengths", "32,512", "--tokens", "131072"]
    ))[0].lengths
    assert sum(short) == 131072 and all(32 <= n <= 512 for n in short) and len(short) > 500
    for bad in ("512,32", "0,8", "8"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--varlen-lengths", bad])


def test_varlen_binders(monkeypatch):
    import cuteattn

    calls = []

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        calls.append((cu_q, max_q, kwargs))
        return "out"

    monkeypatch.setattr(cuteattn, "flash_attn_varlen_func", fake_varlen)
    assert load_backend("cuteattn")("q", "k", "v", True, varlen=("cu", 700))() == "out"
    assert calls[-1][:2] == ("cu", 700) and calls[-1][2]["causal"] is True
    with pytest.raises(ValueError, match=r"varlen"):
        load_backend("sdpa-flash")("q", "k", "v", True, varlen=("cu", 700))
