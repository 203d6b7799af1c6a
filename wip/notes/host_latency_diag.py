"""Host latency of each backend's call (thirtieth session): the bench's window starts its
event before the first call is made, so the host time up to a call's first kernel is timed
once per window (a 10-call window: a tenth of it per call). Per backend, in one process, us:

  host per call      host time of a call while the GPU is busy (torch.cuda._sleep first)
  single call        one synchronized call's event time (first kernel's host latency + GPU)
  window 10 / 50     the bench's per-call time over 10 / 50 back-to-back calls
  single after X     a single call right after a 10-call window of backend X

then cProfile's top functions of the first backend's calls (GPU busy) and torch.profiler's
CPU ops of one call.

    python wip/notes/host_latency_diag.py --mode bwd --backends cuteattn,fa4,sdpa-cudnn \\
        --dims 128 --seqlens 1024 --causal true
"""

import cProfile
import io
import pstats
import statistics
import time

import torch

from cuteattn.bench.__main__ import DTYPES, mode_binders, parse_rows_on_gpu
from cuteattn.bench.runner import WARMUP_CALLS, make_inputs, time_call_ms

ROUNDS = 9


def host_per_call_us(call, calls: int = 20) -> float:
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU work: the calls below never wait
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> None:
    args, shapes = parse_rows_on_gpu("host_latency_diag.py", None)
    binders = mode_binders(args)
    torch.manual_seed(0)
    for shape in shapes:
        q, k, v, extra = make_inputs(shape, DTYPES[args.dtype])
        calls = {}
        for name, bind in binders.items():
            calls[name] = bind(q, k, v, shape.causal, **extra)
            for _ in range(WARMUP_CALLS):
                calls[name]()
        torch.cuda.synchronize()
        names = list(calls)
        rows: dict[str, dict[str, float]] = {}
        rows["host per call"] = {
            n: statistics.median(host_per_call_us(calls[n]) for _ in range(ROUNDS)) for n in names
        }
        rows["single call"] = {
            n: statistics.median(time_call_ms(calls[n], 1) * 1e3 for _ in range(ROUNDS))
            for n in names
        }
        for iters in (10, 50):
            rows[f"window {iters}"] = {
                n: statistics.median(time_call_ms(calls[n], iters) * 1e3 for _ in range(ROUNDS))
                for n in names
            }
        for before in names:
            samples = {n: [] for n in names}
            for _ in range(ROUNDS):
                for name in names:
                    time_call_ms(calls[before], 10)
                    samples[name].append(time_call_ms(calls[name], 1) * 1e3)
            rows[f"single after {before}"] = {n: statistics.median(s) for n, s in samples.items()}
        print(f"{shape.label()} batch={shape.batch} {args.mode} (us, medians of {ROUNDS})")
        print(f"  {'':<24}" + "".join(f"{n:>14}" for n in names))
        for label, row in rows.items():
            print(f"  {label:<24}" + "".join(f"{row[n]:14.1f}" for n in names))

        for name in names[:2]:
            profiler = cProfile.Profile()
            torch.cuda._sleep(400_000_000)
            profiler.enable()
            for _ in range(20):
                calls[name]()
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
            print(f"--- cProfile {name}, 20 calls, by own time")
            print("\n".join(text.getvalue().splitlines()[:50]))

        for name in names[:2]:
            torch.cuda.synchronize()
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            ) as prof:
                for _ in range(3):
                    calls[name]()
                torch.cuda.synchronize()
            print(f"--- torch.profiler {name}, 3 calls")
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
        del q, k, v, calls


if __name__ == "__main__":
    main()
