"""Shape grid (GQA, extra rows), FLOP accounting, interleaved timing rounds and reporting
(TFLOP/s table; cuteattn against the faster peer and against sdpa-flash, per row and summarised).

Only ``collect_environment``, ``time_call_ms`` and ``run_benchmark`` touch the GPU; everything else
is a pure function so it can be tested on a CPU-only machine.
"""

from __future__ import annotations

import csv
import datetime
import functools
import importlib.metadata
import math
import statistics
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence

import torch

from .backends import DETERMINISTIC_SUFFIX, Binder, one_line

FLOPS_NOTE = (
    "FLOPs = 4 * batch * heads * seqlen_q * seqlen_k * dim, halved when causal "
    "(flash-attn benchmark convention); TFLOP/s = FLOPs / time / 1e12"
)
# The peers cuteattn is held against: per row, the faster of those that measured it.
PEERS = ("fa4", "sdpa-cudnn")
BEST_PEER_COLUMN = "cuteattn/best-peer"
PEER_NAME_COLUMN = "best-peer"
SDPA_FLASH_COLUMN = "cuteattn/sdpa-flash"
RATIO_NOTE = "ratio = A TFLOP/s / B TFLOP/s for a column A/B (same inputs; >1: A faster)"
CAUSAL_MODES = {"both": (False, True), "true": (True,), "false": (False,)}
# Timed pass: the forward, or the backward (dq, dk, dv from a recorded forward), whose FLOPs
# are counted as 2.5x the forward's (flash-attn's convention: five GEMMs of the forward's two
# sizes' worth, recomputing S).
MODE_NAMES = {"fwd": "forward", "bwd": "backward"}
BACKWARD_FLOPS_FACTOR = 2.5
# Enough calls to trigger compilation and autotuning caches before anything is timed.
WARMUP_CALLS = 3
CSV_FIELDS = (
    "dtype", "dim", "seqlen", "seqlen_k", "causal", "batch", "heads", "heads_kv", "backend",
    "median_ms", "tflops",
)
EXTRA_SHAPE_KEYS = ("dim", "seqlen", "seqlen_k", "causal", "heads", "heads_kv", "batch")


@dataclass(frozen=True)
class Shape:
    """One benchmark row. q has ``heads`` heads and ``seqlen`` positions; k and v have
    ``heads_kv`` heads (None: ``heads``, i.e. MHA), which must divide ``heads`` (GQA / MQA),
    and ``seqlen_k`` positions (None: ``seqlen``; fewer queries than keys: prefill chunks,
    decode)."""

    dim: int
    seqlen: int
    causal: bool
    batch: int
    heads: int
    heads_kv: int | None = None
    seqlen_k: int | None = None
    # A packed varlen batch: each sequence's length (queries = keys); then batch is the number
    # of sequences and seqlen the longest.
    lengths: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.heads_kv is None:
            object.__setattr__(self, "heads_kv", self.heads)
        if self.seqlen_k is None:
            object.__setattr__(self, "seqlen_k", self.seqlen)
        if self.heads_kv <= 0 or self.heads % self.heads_kv != 0:
            raise ValueError(
                f"heads_kv {self.heads_kv} must divide heads {self.heads} "
                f"(dim={self.dim} seqlen={self.seqlen})"
            )

    def label(self) -> str:
        heads = f"heads={self.heads}"
        if self.heads_kv != self.heads:
            heads += f" heads_kv={self.heads_kv}"
        seqlen = f"seqlen={self.seqlen}"
        if self.seqlen_k != self.seqlen:
            seqlen += f" seqlen_k={self.seqlen_k}"
        if self.lengths is not None:
            seqlen = f"varlen {len(self.lengths)} sequences (max {self.seqlen})"
        return f"dim={self.dim} {seqlen} causal={self.causal} {heads}"


@dataclass(frozen=True)
class ExtraShape:
    """One ``--extra-shape``: a grid row with these fields given; None takes the grid's value
    (batch from tokens, heads from hidden, heads_kv from --heads-kv, causal from --causal)."""

    dim: int
    seqlen: int
    causal: tuple[bool, ...] | None = None
    heads: int | None = None
    heads_kv: int | None = None
    batch: int | None = None
    seqlen_k: int | None = None


@dataclass
class ShapeResult:
    shape: Shape
    # Median milliseconds per call; a backend that failed on this shape is absent.
    ms_by_backend: dict[str, float]
    # FLOPs of the timed pass over the forward's: 1 forward, BACKWARD_FLOPS_FACTOR backward.
    flops_factor: float = 1.0

    def tflops(self, backend: str) -> float | None:
        ms = self.ms_by_backend.get(backend)
        return None if ms is None else tflops(self.shape, ms) * self.flops_factor


class RowRatio(NamedTuple):
    value: float  # cuteattn's (the subject's) TFLOP/s / the peer's
    peer: str


RatioFn = Callable[[ShapeResult], "RowRatio | None"]


@dataclass(frozen=True)
class GroupMean:
    dim: int
    causal: bool
    geomean: float
    rows: int


@dataclass(frozen=True)
class RatioSummary:
    geomean: float
    rows: int
    minimum: float
    min_shape: Shape
    min_peer: str
    groups: tuple[GroupMean, ...]  # one per (dim, causal), sorted


def parse_extra_shape(text: str) -> ExtraShape:
    """``dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both`` -> ExtraShape; ValueError if
    malformed. dim and seqlen are required; causal is one of both / true / false."""
    fields: dict[str, object] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = (piece.strip() for piece in item.partition("="))
        if not sep or key not in EXTRA_SHAPE_KEYS:
            raise ValueError(
                f"bad item {item!r} in {text!r}: expected key=value with key in {', '.join(EXTRA_SHAPE_KEYS)}"
            )
        if key in fields:
            raise ValueError(f"{key} given twice in {text!r}")
        if key == "causal":
            if value.lower() not in CAUSAL_MODES:
                raise ValueError(f"causal must be one of {', '.join(CAUSAL_MODES)}, got {value!r}")
            fields[key] = CAUSAL_MODES[value.lower()]
            continue
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number <= 0:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
        fields[key] = number
    missing = [key for key in ("dim", "seqlen") if key not in fields]
    if missing:
        raise ValueError(f"{text!r} lacks {' and '.join(missing)}")
    return ExtraShape(**fields)


# The inputs of one row (q, k, v; 16-bit) must fit this: a row with few queries and many keys
# keeps the batch of tokens // seqlen, which at seqlen 1 asks for terabytes of keys.
MAX_INPUT_BYTES = 24 * 2**30


def input_bytes(shape: Shape) -> int:
    """Bytes of one row's q, k and v in a 16-bit dtype."""
    queries = shape.batch * shape.seqlen * shape.heads * shape.dim
    keys = 2 * shape.batch * shape.seqlen_k * shape.heads_kv * shape.dim
    return 2 * (queries + keys)


def check_input_sizes(shapes: Sequence[Shape]) -> None:
    """A ValueError naming the first row whose inputs exceed MAX_INPUT_BYTES."""
    for shape in shapes:
        if input_bytes(shape) > MAX_INPUT_BYTES:
            raise ValueError(
                f"{shape.label()}: q, k, v take {input_bytes(shape) / 2**30:.0f} GiB (batch "
                f"{shape.batch}, {shape.seqlen_k} keys), over {MAX_INPUT_BYTES // 2**30} GiB: "
                "give --tokens (or the row's batch) a smaller count"
            )


def build_grid(
    dims: Sequence[int],
    seqlens: Sequence[int],
    causal: Sequence[bool],
    tokens: int,
    hidden: int,
    *,
    heads_kv: int | None = None,
    extra: Sequence[ExtraShape] = (),
) -> list[Shape]:
    """Every (dim, seqlen, causal) combination at a fixed token count and model width, then the
    extra rows; a row listed twice is kept once. ``heads_kv`` None means MHA. ValueError where
    heads_kv does not divide a row's heads."""

    def row(dim, seqlen, is_causal, *, batch=None, heads=None, kv=None, seqlen_k=None):
        # A field not given takes the grid's value; heads_kv None in Shape means MHA.
        return Shape(
            dim=dim, seqlen=seqlen, causal=is_causal,
            batch=max(1, tokens // seqlen) if batch is None else batch,
            heads=max(1, hidden // dim) if heads is None else heads,
            heads_kv=heads_kv if kv is None else kv,
            seqlen_k=seqlen_k,
        )

    shapes = [row(dim, seqlen, is_causal) for dim in dims for seqlen in seqlens for is_causal in causal]
    for spec in extra:
        for is_causal in causal if spec.causal is None else spec.causal:
            shapes.append(
                row(
                    spec.dim, spec.seqlen, is_causal, batch=spec.batch, heads=spec.heads,
                    kv=spec.heads_kv, seqlen_k=spec.seqlen_k,
                )
            )
    return list(dict.fromkeys(shapes))


def attention_flops(shape: Shape) -> int:
    # Two matmuls (QK^T and PV) of 2 * s_q * s_k * d FLOPs each; causal does half the work.
    if shape.lengths is not None:
        flops = 4 * shape.heads * shape.dim * sum(length * length for length in shape.lengths)
    else:
        flops = 4 * shape.batch * shape.heads * shape.seqlen * shape.seqlen_k * shape.dim
    return flops // 2 if shape.causal else flops


VARLEN_MIN, VARLEN_MAX = 128, 8192


def varlen_lengths(
    tokens: int, seed: int = 0, shortest: int = VARLEN_MIN, longest: int = VARLEN_MAX
) -> tuple[int, ...]:
    """Mixed sequence lengths from ``shortest`` to ``longest`` (log-uniform, seeded: every run
    and backend gets the same batch) summing to ``tokens``; the last one takes the remainder
    (at least ``shortest`` where tokens allow)."""
    import math
    import random

    rng = random.Random(seed)
    lengths = []
    left = tokens
    while left > 0:
        length = int(round(2 ** rng.uniform(math.log2(shortest), math.log2(longest))))
        length = max(shortest, min(longest, length))
        if left - length < shortest:
            length = left
        lengths.append(length)
        left -= length
    return tuple(lengths)


def varlen_grid(
    dims: Sequence[int], causal: Sequence[bool], tokens: int, hidden: int, *,
    heads_kv: int | None = None, length_range: tuple[int, int] = (VARLEN_MIN, VARLEN_MAX),
) -> list[Shape]:
    """One packed varlen row per (dim, causal): ``varlen_lengths(tokens)``, lengths in
    ``length_range``."""
    lengths = varlen_lengths(tokens, shortest=length_range[0], longest=length_range[1])
    return [
        Shape(
            dim=dim, seqlen=max(lengths), causal=is_causal, batch=len(lengths),
            heads=max(1, hidden // dim), heads_kv=heads_kv, lengths=lengths,
        )
        for dim in dims for is_causal in causal
    ]


def tflops(shape: Shape, ms: float) -> float:
    return attention_flops(shape) / (ms * 1e-3) / 1e12


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """Backend order for one round: each round starts one backend later, spreading order effects."""
    if not names:
        return []
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def best_peer_ratio(
    result: ShapeResult, peers: Sequence[str] = PEERS, subject: str = "cuteattn"
) -> RowRatio | None:
    """``subject`` against the fastest of ``peers`` that measured this row; None if the subject
    or every peer is missing."""
    subject_ms = result.ms_by_backend.get(subject)
    measured = [(result.ms_by_backend[peer], peer) for peer in peers if peer in result.ms_by_backend]
    if subject_ms is None or not measured:
        return None
    peer_ms, peer = min(measured)
    return RowRatio(peer_ms / subject_ms, peer)  # same FLOPs on both sides: time ratio = TFLOP/s ratio


def sdpa_flash_ratio(result: ShapeResult) -> RowRatio | None:
    return best_peer_ratio(result, peers=("sdpa-flash",))


def deterministic_ratio(backend: str) -> RatioFn:
    """``backend``'s deterministic variant against itself: 1 - the value is the cost."""
    return functools.partial(
        best_peer_ratio, peers=(backend,), subject=backend + DETERMINISTIC_SUFFIX
    )


def ratio_columns(backends: Sequence[str]) -> list[tuple[str, RatioFn]]:
    """The ratios a run with ``backends`` can report: cuteattn/best-peer when cuteattn and a
    peer ran, cuteattn/sdpa-flash when both ran, and X-deterministic/X for each backend X that
    ran with its deterministic variant."""
    columns: list[tuple[str, RatioFn]] = []
    if "cuteattn" in backends:
        if any(peer in backends for peer in PEERS):
            columns.append((BEST_PEER_COLUMN, best_peer_ratio))
        if "sdpa-flash" in backends:
            columns.append((SDPA_FLASH_COLUMN, sdpa_flash_ratio))
    for backend in backends:
        if backend + DETERMINISTIC_SUFFIX in backends:
            column = f"{backend}{DETERMINISTIC_SUFFIX}/{backend}"
            columns.append((column, deterministic_ratio(backend)))
    return columns


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(value) for value in values) / len(values))


def summarize_ratio(results: Iterable[ShapeResult], ratio: RatioFn = best_peer_ratio) -> RatioSummary | None:
    """Geometric mean of ``ratio`` overall and per (dim, causal), and its minimum, over the rows
    where it exists; None if no row has it."""
    rows = [(r.shape, row_ratio) for r in results if (row_ratio := ratio(r)) is not None]
    if not rows:
        return None
    by_group: dict[tuple[int, bool], list[float]] = {}
    for shape, row_ratio in rows:
        by_group.setdefault((shape.dim, shape.causal), []).append(row_ratio.value)
    groups = tuple(
        GroupMean(dim=dim, causal=causal, geomean=geomean(values), rows=len(values))
        for (dim, causal), values in sorted(by_group.items())
    )
    min_shape, min_ratio = min(rows, key=lambda row: row[1].value)
    return RatioSummary(
        geomean=geomean([row_ratio.value for _, row_ratio in rows]), rows=len(rows),
        minimum=min_ratio.value, min_shape=min_shape, min_peer=min_ratio.peer, groups=groups,
    )


def format_summary(summary: RatioSummary | None, column: str = BEST_PEER_COLUMN) -> str:
    if summary is None:
        return f"{column}: n/a (no row was measured by both sides)"
    # Name the peer of the minimum where the column does not (best-peer varies by row).
    peer = "" if column.endswith(f"/{summary.min_peer}") else f" (vs {summary.min_peer})"
    lines = [
        f"{column} overall: geomean {summary.geomean:.2f}x over {summary.rows} rows; "
        f"min {summary.minimum:.2f}x at {summary.min_shape.label()}{peer}"
    ]
    lines += [
        f"  dim={group.dim} causal={group.causal}: geomean {group.geomean:.2f}x over {group.rows} rows"
        for group in summary.groups
    ]
    return "\n".join(lines)


def format_summaries(results: Sequence[ShapeResult], backends: Sequence[str]) -> str:
    """One summary per ratio the run can report (``ratio_columns``); empty if none."""
    blocks = [
        format_summary(summarize_ratio(results, ratio), column) for column, ratio in ratio_columns(backends)
    ]
    if blocks:
        blocks.insert(0, f"# {RATIO_NOTE}; best-peer = the faster of {', '.join(PEERS)} per row")
    return "\n".join(blocks)


def format_table(
    results: Sequence[ShapeResult], backends: Sequence[str], mode: str = "fwd"
) -> str:
    """TFLOP/s per backend, one row per shape, then the ratios the run can report; '-' where a
    backend did not run or a ratio lacks a side."""
    columns = ratio_columns(backends)
    header = ["dim", "seqlen", "seqlen_k", "causal", "batch", "heads", "heads_kv", *backends]
    for column, _ in columns:
        if column == BEST_PEER_COLUMN:
            header.append(PEER_NAME_COLUMN)
        header.append(column)
    rows = []
    for result in results:
        s = result.shape
        row = [
            str(s.dim), seqlen_cell(s), str(s.seqlen_k), str(s.causal), str(s.batch),
            str(s.heads), str(s.heads_kv),
        ]
        for backend in backends:
            value = result.tflops(backend)
            row.append("-" if value is None else f"{value:.1f}")
        for column, ratio in columns:
            row_ratio = ratio(result)
            if column == BEST_PEER_COLUMN:
                row.append("-" if row_ratio is None else row_ratio.peer)
            row.append("-" if row_ratio is None else f"{row_ratio.value:.2f}")
        rows.append(row)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = [f"# TFLOP/s, {MODE_NAMES[mode]}. {FLOPS_NOTE}"]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in [header, *rows]]
    return "\n".join(lines)


def seqlen_cell(shape: Shape) -> str:
    """A row's seqlen: the length, or for a packed varlen batch 'var<=' its longest sequence
    (batch then counts the sequences)."""
    return str(shape.seqlen) if shape.lengths is None else f"var<={shape.seqlen}"


def csv_rows(results: Iterable[ShapeResult], dtype_name: str) -> list[dict[str, str]]:
    rows = []
    for result in results:
        s = result.shape
        for backend, ms in result.ms_by_backend.items():
            rows.append({
                "dtype": dtype_name, "dim": str(s.dim), "seqlen": seqlen_cell(s),
                "seqlen_k": str(s.seqlen_k),
                "causal": str(s.causal), "batch": str(s.batch), "heads": str(s.heads),
                "heads_kv": str(s.heads_kv), "backend": backend, "median_ms": f"{ms:.6f}", "tflops": f"{result.tflops(backend):.3f}",
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


def time_call_ms(call: Callable[[], object], iters: int, settle_calls: int = 0) -> float:
    """Milliseconds per call over a window of ``iters`` back-to-back calls, after
    ``settle_calls`` untimed ones (a backend's first call after another backend's window can
    run slower: docs/PERF.md, twenty-ninth session, not the allocator)."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(settle_calls):
        call()
    torch.cuda.synchronize()  # nothing queued earlier may leak into this window
    start.record()
    for _ in range(iters):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def make_inputs(shape: Shape, dtype: torch.dtype, device: str = "cuda") -> tuple:
    """(q, k, v, extra) for a row: random tensors every backend gets the same of (k and v
    carry heads_kv heads: GQA / MQA); a varlen row's are packed (total, heads, dim) and
    ``extra`` holds its ``varlen`` binding argument (cumulative lengths, int32, and the longest)."""
    if shape.lengths is None:
        q, k, v = (
            torch.randn(shape.batch, seqlen, heads, shape.dim, device=device, dtype=dtype)
            for seqlen, heads in (
                (shape.seqlen, shape.heads),
                (shape.seqlen_k, shape.heads_kv),
                (shape.seqlen_k, shape.heads_kv),
            )
        )
        return q, k, v, {}
    total = sum(shape.lengths)
    q, k, v = (
        torch.randn(total, heads, shape.dim, device=device, dtype=dtype)
        for heads in (shape.heads, shape.heads_kv, shape.heads_kv)
    )
    cumulative = [0]
    for length in shape.lengths:
        cumulative.append(cumulative[-1] + length)
    cu_seqlens = torch.tensor(cumulative, dtype=torch.int32, device=device)
    return q, k, v, {"varlen": (cu_seqlens, shape.seqlen)}


def run_benchmark(
    shapes: Sequence[Shape],
    binders: dict[str, Binder],
    *,
    dtype: torch.dtype,
    rounds: int,
    iters: int,
    settle_calls: int = 0,
    log: Callable[[str], None] = log_to_stderr,
    flops_factor: float = 1.0,
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
        q, k, v, extra = make_inputs(shape, dtype)
        calls = {}
        for backend, bind in binders.items():
            try:
                call = bind(q, k, v, shape.causal, **extra)
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
                    samples[backend].append(time_call_ms(calls[backend], iters, settle_calls))
                except Exception as exc:  # noqa: BLE001
                    skip(backend, shape, exc)
                    del samples[backend]

        result = ShapeResult(
            shape, {b: statistics.median(ms) for b, ms in samples.items()}, flops_factor
        )
        results.append(result)
        measured = ", ".join(f"{b} {result.tflops(b):.1f}" for b in result.ms_by_backend) or "nothing ran"
        log(f"[{index}/{len(shapes)}] {shape.label()} batch={shape.batch}: {measured} TFLOP/s")
        del q, k, v, calls
    return results
