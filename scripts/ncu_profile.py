"""Hardware counters of each backend's kernels for benchmark rows, by Nsight Compute (GPU only;
ncu reads counters on the Firecracker machines, not on gVisor: the device tool's KINDS.md).

This script makes one call per (row, backend) after warm-up calls, between cudaProfilerStart and
cudaProfilerStop, so that ``ncu --profile-from-start off`` captures that call's kernels only
(preprocess, memsets, main kernel, postprocess). Takes the benchmark's arguments
(``python -m cuteattn.bench --help``; --rounds, --iters and --csv are ignored). Run it through
``scripts/ncu_compare.sh``, which profiles, exports and summarises (``--summary REPORT.csv``:
the main metrics and stall reasons per kernel; ``--source-summary SOURCE.csv``: the SASS lines
with the most stall samples).
"""

import csv
import sys

import torch

from cuteattn.bench.__main__ import DTYPES, mode_binders, parse_rows_on_gpu
from cuteattn.bench.runner import WARMUP_CALLS, make_inputs, one_line

# Raw metrics worth a line each (ncu's names; a missing one is skipped).
METRICS = (
    ("gpu__time_duration.sum", "duration"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput %"),
    ("sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active", "GMMA inst %"),
    ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active", "GMMA pipe %"),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed", "smem LSU %"),
    ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "smem bank conflicts"),
    ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 throughput %"),
    ("lts__t_sectors_op_red.sum", "L2 red sectors"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput %"),
    ("dram__bytes.sum", "DRAM bytes"),
    ("smsp__cycles_active.avg", "SMSP active cycles"),
    ("smsp__inst_executed.sum", "instructions"),
    ("smsp__average_warps_issue_stalled_per_issue_active.ratio", "stall cycles / issue"),
    ("launch__registers_per_thread", "registers"),
)
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def profile(argv) -> int:
    args, shapes = parse_rows_on_gpu("scripts/ncu_profile.py", argv)
    binders = mode_binders(args)
    torch.manual_seed(0)
    cudart = torch.cuda.cudart()
    for shape in shapes:
        q, k, v, extra = make_inputs(shape, DTYPES[args.dtype])
        for name, bind in binders.items():
            print(f"{shape.label()} {args.mode} {name}", flush=True)
            try:
                call = bind(q, k, v, shape.causal, **extra)
                for _ in range(WARMUP_CALLS):
                    call()
                torch.cuda.synchronize()
                cudart.cudaProfilerStart()
                call()
                torch.cuda.synchronize()
                cudart.cudaProfilerStop()
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run a row is skipped
                print(f"  unavailable: {one_line(exc)}", flush=True)
        del q, k, v, extra
    return 0


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarize(path: str) -> int:
    """One block per profiled kernel of ``ncu --page raw --csv`` output: the metrics above and
    the five largest stall reasons (cycles per issued instruction)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, units, kernels = rows[0], rows[1], rows[2:]
    column = {name: i for i, name in enumerate(header)}
    print(f"== {path}")
    for row in kernels:
        name = row[column["Kernel Name"]] if "Kernel Name" in column else "?"
        print(f"-- {name[:110]}")
        for metric, label in METRICS:
            if metric in column:
                print(f"   {label:24s} {row[column[metric]]:>16s} {units[column[metric]]}")
        stalls = []
        for metric, i in column.items():
            if metric.startswith(STALL_PREFIX) and metric.endswith(STALL_SUFFIX):
                value = _number(row[i])
                if value:
                    stalls.append((value, metric[len(STALL_PREFIX):-len(STALL_SUFFIX)]))
        stalls.sort(reverse=True)
        print("   stalls: " + ", ".join(f"{reason} {value:.2f}" for value, reason in stalls[:6]))
    return 0


def summarize_source(path: str, top: int = 25) -> int:
    """The SASS lines with the most warp-stall samples, per table of ``ncu --page source --csv
    --print-source sass`` output (one table per kernel; a row naming "Source" starts one). The
    page's exact columns vary by ncu version: without a stall-sampling column the first lines
    print as they are."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    tables, header, body = [], None, []
    for row in rows:
        if any(cell.strip() == "Source" for cell in row):
            if header is not None:
                tables.append((header, body))
            header, body = row, []
        elif header is not None and row:
            body.append(row)
    if header is not None:
        tables.append((header, body))
    print(f"== {path}: {len(tables)} source tables")
    for header, body in tables:
        samples = [i for i, name in enumerate(header) if "Sampling" in name and "All" in name]
        if not samples:
            samples = [i for i, name in enumerate(header) if "Sampl" in name]
        source = header.index(next(name for name in header if name.strip() == "Source"))
        if not samples:
            print("   no stall-sampling column; header: " + ", ".join(header)[:300])
            continue
        column = samples[0]
        counted = [(_number(row[column]) or 0.0, row) for row in body if len(row) > column]
        total = sum(value for value, _ in counted) or 1.0
        print(f"-- {len(body)} SASS lines, {total:.0f} samples ({header[column]})")
        for value, row in sorted(counted, key=lambda item: -item[0])[:top]:
            print(f"   {100 * value / total:5.1f}%  {row[source].strip()[:100]}")
    if not tables:
        for row in rows[:40]:
            print("   " + ",".join(row)[:160])
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--summary":
        sys.exit(max(summarize(path) for path in sys.argv[2:]))
    if len(sys.argv) > 2 and sys.argv[1] == "--source-summary":
        sys.exit(max(summarize_source(path) for path in sys.argv[2:]))
    sys.exit(profile(sys.argv[1:]))
