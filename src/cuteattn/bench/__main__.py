"""Command line entry: ``python -m cuteattn.bench [options]``."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch

from .backends import (
    BACKEND_NAMES,
    DEFAULT_BACKENDS,
    Binder,
    UnknownBackendError,
    backward_binder,
    load_backend,
    one_line,
    parse_backend_names,
)
from .runner import (
    BACKWARD_FLOPS_FACTOR,
    CAUSAL_MODES,
    FLOPS_NOTE,
    MODE_NAMES,
    ExtraShape,
    Shape,
    build_grid,
    check_input_sizes,
    collect_environment,
    format_environment,
    format_summaries,
    format_table,
    log_to_stderr,
    parse_extra_shape,
    run_benchmark,
    varlen_grid,
    write_csv,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
NO_CUDA_MESSAGE = "cuteattn.bench: the benchmark needs a CUDA GPU (torch.cuda.is_available() is False)"


def _positive_int_list(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _length_range(text: str) -> tuple[int, int]:
    try:
        shortest, longest = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX integers, got {text!r}") from None
    if not 1 <= shortest <= longest:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return shortest, longest


def _window(text: str) -> tuple[int, int]:
    try:
        left, right = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT integers, got {text!r}") from None
    if left < -1 or right < -1:
        raise argparse.ArgumentTypeError(f"window bounds must be >= -1, got {text!r}")
    return left, right


def _extra_shape(text: str) -> ExtraShape:
    try:
        return parse_extra_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _backend_list(text: str) -> list[str]:
    try:
        return parse_backend_names(text)
    except UnknownBackendError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cuteattn.bench",
        description=(
            "Attention TFLOP/s (the forward, or with --mode bwd the backward) of several "
            "backends on the same inputs, timed in "
            f"interleaved rounds (median over rounds). {FLOPS_NOTE}. The table and summary "
            "hold cuteattn against the faster of fa4 and sdpa-cudnn per row (cuteattn/best-peer) "
            "and against sdpa-flash, as TFLOP/s ratios."
        ),
    )
    parser.add_argument(
        "--backends", type=_backend_list, default=list(DEFAULT_BACKENDS),
        help=(
            f"comma-separated subset of {','.join(BACKEND_NAMES)}; cuteattn-<family> forces "
            f"one kernel family (default: {','.join(DEFAULT_BACKENDS)}, those that load)"
        ),
    )
    parser.add_argument("--dims", type=_positive_int_list, default=[64, 128, 256],
                        help="head dims (default: 64,128,256)")
    parser.add_argument("--seqlens", type=_positive_int_list, default=[1024, 4096, 16384],
                        help="sequence lengths, seqlen_q = seqlen_k (default: 1024,4096,16384)")
    parser.add_argument("--causal", choices=tuple(CAUSAL_MODES), default="both",
                        help="causal masking (default: both)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="default: bf16")
    parser.add_argument("--tokens", type=_positive_int, default=32768,
                        help="total tokens per call; batch = tokens // seqlen, at least 1 (default: 32768)")
    parser.add_argument("--hidden", type=_positive_int, default=2048,
                        help="model width; heads = hidden // dim, at least 1 (default: 2048)")
    parser.add_argument("--heads-kv", type=_positive_int, default=None, metavar="N",
                        help="k and v heads (GQA / MQA); must divide every row's heads "
                             "(default: as many as q, i.e. MHA)")
    parser.add_argument(
        "--extra-shape", type=_extra_shape, action="append", default=[], metavar="KEY=VALUE,...",
        help=(
            "one more row after the grid, e.g. dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both; "
            "keys dim, seqlen (required), seqlen_k (default: seqlen), causal (both/true/false), "
            "heads, heads_kv, batch; a key "
            "left out takes the grid's value (from --causal, --hidden, --heads-kv, --tokens); repeatable"
        ),
    )
    parser.add_argument("--mode", choices=tuple(MODE_NAMES), default="fwd",
                        help="time the forward, or the backward of a recorded forward (FLOPs "
                             f"counted as {BACKWARD_FLOPS_FACTOR}x the forward's) (default: fwd)")
    parser.add_argument("--softcap", type=_non_negative_float, default=0.0,
                        help="soft-cap the scores at this value in every row (0: off, the "
                             "default); backends without it (SDPA) are left out")
    parser.add_argument("--window", type=_window, default=(-1, -1), metavar="LEFT,RIGHT",
                        help="a local window in every row (flash-attn's window_size, -1 "
                             "unbounded; default -1,-1: none); TFLOP/s still count the rows' "
                             "dense (or causal) FLOPs, so a windowed row's ratio to the same "
                             "row without the window is its speed-up")
    parser.add_argument("--varlen", action="store_true",
                        help="time packed varlen batches instead of the seqlen grid: one row per "
                             "(dim, causal), sequences of mixed lengths 128..8192 summing to "
                             "--tokens (flash_attn_varlen_func; backends without it are left out)")
    parser.add_argument("--varlen-lengths", type=_length_range, default=(128, 8192),
                        metavar="MIN,MAX",
                        help="--varlen's sequence lengths, log-uniform in MIN..MAX (default "
                             "128,8192; e.g. 32,512 with --tokens 131072: ~1000 short sequences)")
    parser.add_argument("--rounds", type=_positive_int, default=5,
                        help="interleaved rounds per shape; the median is reported (default: 5)")
    parser.add_argument("--iters", type=_positive_int, default=10,
                        help="calls per timed window; time per call = window / iters (default: 10)")
    parser.add_argument("--settle-calls", type=_non_negative_int, default=0,
                        help="untimed calls of a backend before each of its windows (default: 0)")
    parser.add_argument("--csv", metavar="PATH", help="also write every (shape, backend) result as CSV")
    return parser


def grid_from_args(args: argparse.Namespace) -> list[Shape]:
    """The rows to time; ValueError where --heads-kv (or a row's heads_kv) does not divide heads."""
    if args.varlen:
        return varlen_grid(
            args.dims, CAUSAL_MODES[args.causal], args.tokens, args.hidden, heads_kv=args.heads_kv,
            length_range=args.varlen_lengths,
        )
    shapes = build_grid(
        args.dims, args.seqlens, CAUSAL_MODES[args.causal], args.tokens, args.hidden,
        heads_kv=args.heads_kv, extra=args.extra_shape,
    )
    check_input_sizes(shapes)
    return shapes


def load_available(
    names: Sequence[str], *, softcap: float = 0.0, window: tuple[int, int] = (-1, -1)
) -> dict[str, Binder]:
    """Load each named backend; one that fails to import is reported once and left out."""
    binders = {}
    for name in names:
        try:
            binders[name] = load_backend(name, softcap=softcap, window=window)
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available here"
            log_to_stderr(f"{name}: unavailable: {one_line(exc)}")
    return binders


def parse_rows(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, list[Shape]]:
    """The parsed arguments and their rows; a bad row exits through ``parser.error``."""
    args = parser.parse_args(argv)
    try:
        return args, grid_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))


def parse_rows_on_gpu(
    prog: str, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, list[Shape]]:
    """The scripts that take the benchmark's arguments (scripts/kernel_times.py, ...): their
    parsed arguments and rows; exits with status 2 without a CUDA GPU."""
    parser = build_parser()
    parser.prog = prog
    args, shapes = parse_rows(parser, argv)
    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    return args, shapes


def mode_binders(args: argparse.Namespace) -> dict:
    """The backends of ``args`` that load, as binders of its mode (bwd: the backward through
    autograd, ``backward_binder``)."""
    binders = load_available(args.backends, softcap=args.softcap, window=args.window)
    if args.mode == "bwd":
        binders = {name: backward_binder(bind) for name, bind in binders.items()}
    return binders


def main(argv: Sequence[str] | None = None) -> int:
    args, shapes = parse_rows(build_parser(), argv)
    if not torch.cuda.is_available():
        print(NO_CUDA_MESSAGE, file=sys.stderr)
        return 2

    print(format_environment(collect_environment()))
    print(f"# mode: {MODE_NAMES[args.mode]}, dtype: {args.dtype}, tokens: {args.tokens}, hidden: {args.hidden}, "
          f"heads_kv: {args.heads_kv or 'heads (MHA)'}, rounds: {args.rounds}, iters: {args.iters}"
          + (f", settle calls: {args.settle_calls}" if args.settle_calls else "")
          + (f", softcap: {args.softcap}" if args.softcap else "")
          + (f", window: {args.window}" if args.window != (-1, -1) else ""))

    binders = mode_binders(args)
    if not binders:
        print("cuteattn.bench: no backend could be loaded", file=sys.stderr)
        return 1
    flops_factor = BACKWARD_FLOPS_FACTOR if args.mode == "bwd" else 1.0
    results = run_benchmark(
        shapes, binders, dtype=DTYPES[args.dtype], rounds=args.rounds, iters=args.iters,
        settle_calls=args.settle_calls,
        flops_factor=flops_factor,
    )
    print()
    print(format_table(results, list(binders), args.mode))
    summaries = format_summaries(results, list(binders))
    if summaries:
        print()
        print(summaries)
    if args.csv:
        write_csv(args.csv, results, args.dtype)
        log_to_stderr(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
