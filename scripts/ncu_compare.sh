#!/usr/bin/env bash
# Nsight Compute on each backend's kernels for benchmark rows, one report per backend, in one
# device call (Firecracker machines only: the device tool's KINDS.md):
#
#   source .devdeps/prelude.sh && scripts/ncu_compare.sh cuteattn,fa4 --mode bwd --dims 64 \
#       --seqlens 4096 --causal true
#
# Reports go to $OUT/ncu-<backend>.ncu-rep (open with ncu-ui), the raw metrics to
# $OUT/ncu-<backend>.csv, ncu's own reading (its rules' hints) to $OUT/ncu-<backend>.txt, the
# SASS with stall samples to $OUT/ncu-<backend>.source.csv; the summaries
# (scripts/ncu_profile.py --summary / --source-summary) print. NCU_SET (default "full") picks
# the sections (the source page's stall samples need "full").
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: scripts/ncu_compare.sh BACKEND[,BACKEND...] [bench arguments]" >&2
  exit 2
fi
backends=$1
shift
out="${OUT:-/tmp}"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
if [ -z "$ncu_bin" ]; then
  echo "ncu_compare: no ncu on this machine" >&2
  exit 2
fi
for backend in ${backends//,/ }; do
  report="$out/ncu-$backend"
  "$ncu_bin" --profile-from-start off --clock-control none --set "${NCU_SET:-full}" \
    --target-processes all -f -o "$report" \
    python scripts/ncu_profile.py --backends "$backend" "$@" > "$report.log" 2>&1
  echo "== $backend: ncu rc=$? ($(grep -c '==PROF==' "$report.log") profiler lines)"
  grep -v '^==PROF==' "$report.log" | tail -n 3
  "$ncu_bin" -i "$report.ncu-rep" --page raw --csv > "$report.csv" 2> /dev/null
  "$ncu_bin" -i "$report.ncu-rep" --page details > "$report.txt" 2> /dev/null
  "$ncu_bin" -i "$report.ncu-rep" --page source --csv --print-source sass \
    > "$report.source.csv" 2> /dev/null
  python scripts/ncu_profile.py --summary "$report.csv"
  python scripts/ncu_profile.py --source-summary "$report.source.csv" | head -n "${NCU_SOURCE_LINES:-60}"
done
