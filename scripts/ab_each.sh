#!/usr/bin/env bash
# Several A/B comparisons in one device call: the bench on this tree (A), then once per diff
# with that diff alone applied (reverted after each, whatever happened). To weigh each of a
# stack of changes, apply them all and pass each one's reverse diff. Logs: $OUT/LABEL-*.log.
#
#   source .devdeps/prelude.sh && scripts/ab_each.sh fwd \
#       "--backends cuteattn,sdpa-cudnn --dims 64,128 --seqlens 1024,4096 --causal both" a.diff b.diff
#
# AB_REVERSE=1 takes each diff out instead (patch -R): with a stack of wips applied, each run
# is then the stack less one of them. Each run is its own process; the peers' numbers move by
# several % between processes, so compare cuteattn's own numbers across runs only where the
# move is large or consistent.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/ab_each.sh LABEL \"BENCH ARGS\" [DIFF...]" >&2
  exit 2
fi
label=$1
args=$2
shift 2
out="${OUT:-/tmp}"

bench() {  # name
  # shellcheck disable=SC2086  # the bench arguments are one word list
  python -m cuteattn.bench $args > "$out/$label-$1.log" 2>&1
  echo "== $label $1 (rc=$?)"
  grep -E "^ *[0-9]+ +[0-9]+ |geomean" "$out/$label-$1.log" | tr -s " " | cut -c1-100
}

bench A
forward=() backward=(-R)
if [ "${AB_REVERSE:-0}" = 1 ]; then
  forward=(-R) backward=()
fi
# Stopped (a timeout's TERM) while a diff is applied: take it out, so that what runs next in
# this tree runs on the tree as it was.
applied=""
trap 'if [ -n "$applied" ]; then patch -s -p1 -F0 "${backward[@]}" < "$applied"; fi; exit 143' TERM INT
for diff_file in "$@"; do
  name=$(basename "$diff_file" .diff)
  [ "${AB_REVERSE:-0}" = 1 ] && name="no-$name"
  if ! patch -s -p1 -F0 "${forward[@]}" --dry-run < "$diff_file" > /dev/null 2>&1; then
    echo "== $label $name: does not apply" >&2
    continue
  fi
  patch -s -p1 -F0 "${forward[@]}" < "$diff_file"
  applied=$diff_file
  bench "$name"
  patch -s -p1 -F0 "${backward[@]}" < "$diff_file"
  applied=""
done
