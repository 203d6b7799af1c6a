"""Where each backend's time goes: the GPU kernels of one call, by name, from torch.profiler
(GPU only). Takes the benchmark's arguments (``python -m cuteattn.bench --help``; --rounds and
--csv are ignored) and, per row and backend, prints each kernel's time per call next to the call's
time by CUDA events, so that preprocess, memsets, copies and postprocess show beside the main
kernel:

    python scripts/kernel_times.py --backends cuteattn,fa4 --dims 128 --varlen --mode bwd
"""

import sys
from collections import defaultdict

import torch

from cuteattn.bench.__main__ import DTYPES, mode_binders, parse_rows_on_gpu
from cuteattn.bench.runner import WARMUP_CALLS, make_inputs, one_line, time_call_ms

NAME_WIDTH = 90


def kernel_times(events, calls: int) -> list[tuple[str, float, float]]:
    """(kernel name, launches per call, microseconds per call) of the profiler's GPU events,
    longest first."""
    launches, micros = defaultdict(int), defaultdict(float)
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        launches[event.name] += 1
        micros[event.name] += event.time_range.elapsed_us()
    rows = [(name, launches[name] / calls, micros[name] / calls) for name in launches]
    return sorted(rows, key=lambda row: -row[2])


def format_kernel_times(rows, call_ms: float) -> str:
    total = sum(us for _, _, us in rows)
    lines = [f"  call {call_ms * 1e3:9.1f} us (CUDA events); kernels {total:9.1f} us"]
    for name, launches, us in rows:
        short = name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 3] + "..."
        lines.append(f"  {us:9.1f} us  {launches:4.1f}x  {short}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args, shapes = parse_rows_on_gpu("scripts/kernel_times.py", argv)
    binders = mode_binders(args)
    torch.manual_seed(0)
    for shape in shapes:
        q, k, v, extra = make_inputs(shape, DTYPES[args.dtype])
        for name, bind in binders.items():
            print(f"{shape.label()} {args.mode} {name}:", flush=True)
            try:
                call = bind(q, k, v, shape.causal, **extra)
                for _ in range(WARMUP_CALLS):
                    call()
                call_ms = time_call_ms(call, args.iters)
                torch.cuda.synchronize()
                with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]
                ) as profiler:
                    for _ in range(args.iters):
                        call()
                    torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run a row is skipped
                print(f"  unavailable: {one_line(exc)}", flush=True)
                continue
            rows = kernel_times(profiler.events(), args.iters)
            print(format_kernel_times(rows, call_ms), flush=True)
        del q, k, v, extra
    return 0


if __name__ == "__main__":
    sys.exit(main())
