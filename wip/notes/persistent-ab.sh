#!/usr/bin/env bash
# The persistent backward's A/B (after wip/notes/persistent-bwd-tests.sh passed for the diff(s)
# measured): issue 6's backward rows at d64 / d96 / d128 with issue 5's GQA row, on main, then
# main + wip/persistent-bwd.diff, then main + wip/persistent-bwd-early-k.diff (one process
# each, ~130 s each). From the repository root on the device (main, no diff applied):
#   source .devdeps/prelude.sh && bash wip/notes/persistent-ab.sh [DIFF...]
# (default: both diffs). Logs: $OUT/pers-*.log; the per-(dim, causal) geomeans at the end.
set -u
diffs=("$@")
[ ${#diffs[@]} -gt 0 ] || diffs=(wip/persistent-bwd.diff wip/persistent-bwd-early-k.diff)
timeout 540 scripts/ab_each.sh pers "--mode bwd --backends cuteattn,fa4,sdpa-cudnn \
--seqlens 1024,4096,16384 --causal both --dims 64,96,128 \
--extra-shape dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both" "${diffs[@]}"
for diff in "${diffs[@]}"; do  # a timeout may leave one applied
  patch -s -p1 -R -F0 --dry-run < "$diff" > /dev/null 2>&1 && patch -s -p1 -R -F0 < "$diff"
done
grep -H "dim=.*causal=.*geomean" "${OUT:-/tmp}"/pers-*.log
