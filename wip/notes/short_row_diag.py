"""Why a short row's benchmark ratio and its isolated call time disagree (tenth session: d128
causal 1k, kernels 900.6 vs FA4's 903.1 us and isolated calls 944.5 vs 955.9, yet the bench's
interleaved rows 0.97x). Takes the benchmark's arguments; per row, every backend's median
time per call (us) under several schedules, in one process on the same inputs:

  interleaved   the bench's rotated rounds (10-call windows)
  alone         the backend's windows back to back
  after <b>     each window right after a window of backend <b>
  settled <b>   the same, with one untimed call of the backend between (synchronized)
  window 50     50-call windows, interleaved (the first call's host latency amortised 5x more)

    python wip/notes/short_row_diag.py --mode bwd --backends cuteattn,fa4,sdpa-cudnn \\
        --dims 128 --seqlens 1024 --causal true
"""

import csv
import os
import statistics
import time

import torch

from cuteattn.bench.__main__ import DTYPES, mode_binders, parse_rows_on_gpu
from cuteattn.bench.runner import WARMUP_CALLS, make_inputs, rotated
from cuteattn.bench.runner import time_call_ms as _time_call_ms

ROUNDS = 15

# WINDOW_LOG=path: every timed window as (schedule, backend, wall start, wall end, ms per call)
# in a CSV, to line up with a clock / power trace (wip/notes/clock-diag.sh).
WINDOW_LOG = os.environ.get("WINDOW_LOG")
_windows: list[tuple] = []


def time_call_ms(call, iters):
    start = time.time()
    ms = _time_call_ms(call, iters)
    _windows.append(("?", getattr(call, "backend", "?"), start, time.time(), ms))
    return ms


def main() -> None:
    args, shapes = parse_rows_on_gpu("short_row_diag.py", None)
    binders = mode_binders(args)
    torch.manual_seed(0)
    for shape in shapes:
        q, k, v, extra = make_inputs(shape, DTYPES[args.dtype])
        calls = {}
        for name, bind in binders.items():
            calls[name] = bind(q, k, v, shape.causal, **extra)
            try:
                calls[name].backend = name
            except AttributeError:  # not a function: windows logged as "?"
                pass
            for _ in range(WARMUP_CALLS):
                calls[name]()
        torch.cuda.synchronize()
        names = list(calls)
        table: dict[str, dict[str, float]] = {}
        device_allocs: dict[str, int] = {}

        def record(schedule: str, samples: dict[str, list[float]]) -> None:
            table[schedule] = {n: statistics.median(ms) * 1e3 for n, ms in samples.items() if ms}
            count = torch.cuda.memory_stats().get("num_device_alloc", -1)
            device_allocs[schedule] = count - device_allocs.get("_last", 0)
            device_allocs["_last"] = count
            for index, window in enumerate(_windows):  # label this schedule's windows
                if window[0] == "?":
                    _windows[index] = (f"{shape.label()} {schedule}",) + window[1:]

        record("_start", {})

        samples = {n: [] for n in names}
        for round_index in range(ROUNDS):
            for name in rotated(names, round_index):
                samples[name].append(time_call_ms(calls[name], args.iters))
        record("interleaved", samples)

        samples = {n: [time_call_ms(calls[n], args.iters) for _ in range(ROUNDS)] for n in names}
        record("alone", samples)

        for before in names:
            samples = {n: [] for n in names}
            for _ in range(ROUNDS):
                for name in names:
                    time_call_ms(calls[before], args.iters)
                    samples[name].append(time_call_ms(calls[name], args.iters))
            record(f"after {before}", samples)

        for before in names:
            samples = {n: [] for n in names}
            for _ in range(ROUNDS):
                for name in names:
                    time_call_ms(calls[before], args.iters)
                    calls[name]()
                    samples[name].append(time_call_ms(calls[name], args.iters))
            record(f"settled {before}", samples)

        samples = {n: [] for n in names}
        for round_index in range(5):
            for name in rotated(names, round_index):
                samples[name].append(time_call_ms(calls[name], 50))
        record("window 50", samples)

        print(f"{shape.label()} batch={shape.batch} {args.mode} (us per call, medians)")
        print(f"  {'schedule':<22}" + "".join(f"{n:>14}" for n in names) + "  cudaMallocs")
        for schedule, row in table.items():
            if schedule.startswith("_"):
                continue
            print(f"  {schedule:<22}" + "".join(f"{row.get(n, float('nan')):14.1f}" for n in names)
                  + f"  {device_allocs[schedule]:11d}")
        del q, k, v, calls


if __name__ == "__main__":
    main()
    if WINDOW_LOG:
        with open(WINDOW_LOG, "w", newline="") as log:
            csv.writer(log).writerows(
                [("schedule", "backend", "wall_start", "wall_end", "ms_per_call")] + _windows
            )
