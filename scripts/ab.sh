#!/usr/bin/env bash
# An A/B comparison in one device call: a command on this tree (A), then the same command with
# a wip diff applied (B); the diff is reverted at the end, whatever happened. Each run's output
# goes to $OUT/ab-A.log and $OUT/ab-B.log (or /tmp), and its last lines print.
#
#   source .devdeps/prelude.sh && scripts/ab.sh wip/tile-order.diff -- \
#       python -m cuteattn.bench --backends cuteattn,fa4 --mode bwd --dims 128 --causal true
#
# Both runs compile their kernels afresh (separate processes). Compare ratios against a peer
# measured in the same run (cuteattn/fa4), not absolute TFLOP/s across the two runs.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ] || [ "$2" != "--" ]; then
  echo "usage: scripts/ab.sh DIFF -- COMMAND..." >&2
  exit 2
fi
diff_file=$1
shift 2
out="${OUT:-/tmp}"
lines="${AB_TAIL:-30}"

patch_tree() {  # forward | reverse
  local reverse=()
  [ "$1" = reverse ] && reverse=(-R)
  if command -v git > /dev/null && git apply "${reverse[@]}" --check "$diff_file" 2> /dev/null; then
    git apply "${reverse[@]}" "$diff_file"
  else
    patch -s -p1 "${reverse[@]}" < "$diff_file"
  fi
}

echo "== A: this tree"
"$@" > "$out/ab-A.log" 2>&1
echo "rc=$?"
tail -n "$lines" "$out/ab-A.log"

if ! patch_tree forward; then
  echo "== B: $diff_file does not apply" >&2
  exit 1
fi
trap 'patch_tree reverse' EXIT
echo "== B: with $diff_file"
"$@" > "$out/ab-B.log" 2>&1
echo "rc=$?"
tail -n "$lines" "$out/ab-B.log"
