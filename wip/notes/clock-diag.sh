#!/usr/bin/env bash
# Is the bench's order effect (docs/PERF.md, twenty-ninth / thirtieth sessions: our d128 causal
# 1k window runs 4-6% slower right after another backend's than after its own) the GPU's
# clocks? A trace of SM clock, power and temperature every 10 ms (nvidia-smi) while
# short_row_diag.py times its schedules, each window's wall time logged (WINDOW_LOG), then per
# (schedule, backend) the median SM clock and power inside its windows. From the repository
# root on the device:
#   source .devdeps/prelude.sh && bash wip/notes/clock-diag.sh
set -u
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms 10 > "$out/clock_trace.csv" 2>&1 &
trace=$!
WINDOW_LOG="$out/windows.csv" timeout 300 python wip/notes/short_row_diag.py --mode bwd \
  --backends cuteattn,fa4,sdpa-cudnn --dims 128 --seqlens 1024 --causal true \
  > "$out/short_row_diag.log" 2>&1
kill "$trace"
cat "$out/short_row_diag.log" | grep -v -i warn | tail -14
python - "$out/clock_trace.csv" "$out/windows.csv" <<'PY'
import csv, statistics, sys
from datetime import datetime
trace = []
for row in csv.reader(open(sys.argv[1])):
    try:
        stamp = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        trace.append((stamp, float(row[1]), float(row[3]), row[5].strip()))
    except (ValueError, IndexError):
        continue
groups = {}
for schedule, backend, start, end, ms in list(csv.reader(open(sys.argv[2])))[1:]:
    inside = [t for t in trace if float(start) <= t[0] <= float(end)]
    groups.setdefault((schedule, backend), []).append((float(ms), inside))
print(f"{'schedule':<44}{'backend':>12}{'us/call':>9}{'sm MHz':>8}{'W':>7}  throttle reasons")
for (schedule, backend), windows in groups.items():
    samples = [t for _, inside in windows for t in inside]
    if not samples:
        continue
    reasons = sorted({t[3] for t in samples})
    print(f"{schedule:<44}{backend:>12}{statistics.median(m for m, _ in windows) * 1e3:9.1f}"
          f"{statistics.median(t[1] for t in samples):8.0f}"
          f"{statistics.median(t[2] for t in samples):7.0f}  {' '.join(reasons)[:40]}")
PY
