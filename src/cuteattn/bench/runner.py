"""Shape grid, FLOP accounting, interleaved timing rounds and reporting.

Only ``collect_environment``, ``time_call_ms`` and ``run_benchmark`` touch the GPU; everything else
is a pure function so it can be tested on a CPU-only machine.
"""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import math
import statistics
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from .backends import Binder, one_line

FLOPS_NOTE = (
    "FLOPs = 4 * batch * heads * seqlen_q * seqlen_k * dim, halved when causal "
    "(flash-attn benchmark convention); TFLOP/s = FLOPs / time / 1e12"
)
RATIO_COLUMN = "cuteattn/sdpa-flash"
CAUSAL_MODES = {"both": (False, True), "true": (True,), "false": (False,)}
# Enough calls to trigger compilation and autotuning caches before anything is timed.
WARMUP_CALLS = 3
CSV_FIELDS = ("dtype", "dim", "seqlen", "causal", "batch", "heads", "backend", "median_ms", "tflops")


@dataclass(frozen=True)
class Shape:
    dim: int
    seqlen: int
    causal: bool
    batch: int
    heads: int

    def label(self) -> str:
        return f"dim={self.dim} seqlen={self.seqlen} causal={self.causal}"


@dataclass
class ShapeResult:
    shape: Shape
    # Median milliseconds per call; a backend that failed on this shape is absent.
    ms_by_backend: dict[str, float]

    def tflops(self, backend: str) -> float | None:
        ms = self.ms_by_backend.get(backend)
        return None if ms is None else tflops(self.shape, ms)


@dataclass(frozen=True)
class RatioSummary:
    geomean: float
    minimum: float
    min_shape: Shape
    rows: int


def build_grid(
    dims: Sequence[int], seqlens: Sequence[int], causal: Sequence[bool], tokens: int, hidden: int
) -> list[Shape]:
    """Every (dim, seqlen, causal) combination at a fixed token count and model width."""
    return [
        Shape(dim, seqlen, is_causal, batch=max(1, tokens // seqlen), heads=max(1, hidden // dim))
        for dim in dims
        for seqlen in seqlens
        for is_causal in causal
    ]


def attention_flops(shape: Shape) -> int:
    # Two matmuls (QK^T and PV) of 2 * s_q * s_k * d FLOPs each; causal does half the work.
    flops = 4 * shape.batch * shape.heads * shape.seqlen * shape.seqlen * shape.dim
    return flops // 2 if shape.causal else flops


def tflops(shape: Shape, ms: float) -> float:
    return attention_flops(shape) / (ms * 1e-3) / 1e12


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """Backend order for one round: each round starts one backend later, spreading order effects."""
    if not names:
        return []
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def cuteattn_ratio(result: ShapeResult) -> float | None:
    cute_ms = result.ms_by_backend.get("cuteattn")
    sdpa_ms = result.ms_by_backend.get("sdpa-flash")
    if cute_ms is None or sdpa_ms is None:
        return None
    return sdpa_ms / cute_ms  # same FLOPs on both sides, so the time ratio is the TFLOP/s ratio


def summarize_ratio(results: Iterable[ShapeResult]) -> RatioSummary | None:
    """Geometric mean and minimum of cuteattn/sdpa-flash over rows that have both."""
    pairs = [(ratio, r.shape) for r in results if (ratio := cuteattn_ratio(r)) is not None]
    if not pairs:
        return None
    geomean = math.exp(sum(math.log(ratio) for ratio, _ in pairs) / len(pairs))
    minimum, min_shape = min(pairs, key=lambda pair: pair[0])
    return RatioSummary(geomean, minimum, min_shape, len(pairs))


def format_summary(summary: RatioSummary | None) -> str:
    if summary is None:
        return f"{RATIO_COLUMN}: n/a (needs both backends on at least one row)"
    return (
        f"{RATIO_COLUMN}: geomean {summary.geomean:.2f}x over {summary.rows} rows; "
        f"min {summary.minimum:.2f}x at {summary.min_shape.label()}"
    )


def format_table(results: Sequence[ShapeResult], backends: Sequence[str]) -> str:
    """TFLOP/s per backend, one row per shape; '-' where a backend did not run."""
    show_ratio = "cuteattn" in backends and "sdpa-flash" in backends
    header = ["dim", "seqlen", "causal", "batch", "heads", *backends]
    if show_ratio:
        header.append(RATIO_COLUMN)
    rows = []
    for result in results:
        s = result.shape
        row = [str(s.dim), str(s.seqlen), str(s.causal), str(s.batch), str(s.heads)]
        for backend in backends:
            value = result.tflops(backend)
            row.append("-" if value is None else f"{value:.1f}")
        if show_ratio:
            ratio = cuteattn_ratio(result)
            row.append("-" if ratio is None else f"{ratio:.2f}")
        rows.append(row)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = [f"# TFLOP/s, forward. {FLOPS_NOTE}"]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in [header, *rows]]
    return "\n".join(lines)


def csv_rows(results: Iterable[ShapeResult], dtype_name: str) -> list[dict[str, str]]:
    rows = []
    for result in results:
        s = result.shape
        for backend, ms in result.ms_by_backend.items():
            rows.append({
                "dtype": dtype_name, "dim": str(s.dim), "seqlen": str(s.seqlen),
                "causal": str(s.causal), "batch": str(s.batch), "heads": str(s.heads),
                "backend": backend, "median_ms": f"{ms:.6f}", "tflops": f"{tflops(s, ms):.3f}",
            })
    return rows


def write_csv(path: str, results: Iterable[ShapeResult], dtype_name: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(csv_rows(results, dtype_name))


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "n/a"


def collect_environment() -> dict[str, str]:
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "n/a",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "n/a",
        "nvidia-cutlass-dsl": _installed_version("nvidia-cutlass-dsl"),
        "flash-attn-4": _installed_version("flash-attn-4"),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def format_environment(env: dict[str, str]) -> str:
    return "\n".join(f"# {key}: {value}" for key, value in env.items())


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def time_call_ms(call: Callable[[], object], iters: int) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()  # nothing queued earlier may leak into this window
    start.record()
    for _ in range(iters):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def run_benchmark(
    shapes: Sequence[Shape],
    binders: dict[str, Binder],
    *,
    dtype: torch.dtype,
    rounds: int,
    iters: int,
    log: Callable[[str], None] = log_to_stderr,
) -> list[ShapeResult]:
    """Time every backend on every shape in interleaved rounds; report medians over rounds.

    A backend that raises on a shape is skipped for that shape only (SDPA kernels, for one,
    reject some head dims); each distinct failure is logged once.
    """
    reported: set[tuple[str, str]] = set()

    def skip(backend: str, shape: Shape, exc: Exception) -> None:
        message = one_line(exc)
        if (backend, message) not in reported:
            reported.add((backend, message))
            log(f"{backend}: unavailable at {shape.label()} (and wherever it fails the same way): {message}")

    torch.manual_seed(0)
    results = []
    for index, shape in enumerate(shapes, 1):
        q, k, v = (
            torch.randn(shape.batch, shape.seqlen, shape.heads, shape.dim, device="cuda", dtype=dtype)
            for _ in range(3)
        )
        calls = {}
        for backend, bind in binders.items():
            try:
                call = bind(q, k, v, shape.causal)
                for _ in range(WARMUP_CALLS):
                    call()
                torch.cuda.synchronize()  # surface asynchronous launch errors here, not mid-round
                calls[backend] = call
            except Exception as exc:  # noqa: BLE001 - any failure just removes this backend
                skip(backend, shape, exc)

        samples: dict[str, list[float]] = {backend: [] for backend in calls}
        for round_index in range(rounds):
            for backend in rotated(list(calls), round_index):
                if backend not in samples:
                    continue
                try:
                    samples[backend].append(time_call_ms(calls[backend], iters))
                except Exception as exc:  # noqa: BLE001
                    skip(backend, shape, exc)
                    del samples[backend]

        result = ShapeResult(shape, {b: statistics.median(ms) for b, ms in samples.items()})
        results.append(result)
        measured = ", ".join(f"{b} {result.tflops(b):.1f}" for b in result.ms_by_backend) or "nothing ran"
        log(f"[{index}/{len(shapes)}] {shape.label()} batch={shape.batch} heads={shape.heads}: {measured} TFLOP/s")
        del q, k, v, calls
    return results
