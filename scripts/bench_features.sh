#!/usr/bin/env bash
# Issue 7's benchmark rows in one device call: softcap 50, window (4096, 0) at 32k and packed
# varlen batches, forward and backward, cuteattn against FA4 (and cuDNN where it takes the
# option), each next to the same rows without the option. CSVs and logs packed into
# $OUT/bench-logs.tgz (one file to carry back); the summary lines print.
#
#   source .devdeps/prelude.sh && scripts/bench_features.sh [softcap|window|varlen ...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
limit="${BENCH_TIMEOUT:-120}"

bench() {  # name, then the bench's arguments
  local name=$1
  shift
  timeout "$limit" python -m cuteattn.bench "$@" --csv "$out/$name.csv" > "$out/$name.log" 2>&1
  echo "== $name (rc=$?): $*"
  sed -n '/^# mode/,$p' "$out/$name.log" | grep -v "^# mode" | grep -v "^$" | head -12
  grep -E "Error|error:" "$out/$name.log" | tail -2
}

for feature in ${*:-softcap window varlen}; do
  for mode in fwd bwd; do
    case $feature in
      softcap)
        common=(--backends cuteattn,fa4,sdpa-cudnn --dims 128 --seqlens 8192 --causal true --mode $mode)
        bench "softcap0-$mode" "${common[@]}"
        bench "softcap50-$mode" "${common[@]}" --softcap 50
        if [ "$mode" = fwd ]; then
          # The sm90 forward's share of exponentials on the FMA pipe (wip: issue7-next.diff):
          # none (MUFU only) and every one, next to the planner's default above.
          for every in 0 1; do
            CUTEATTN_SOFTCAP_EXP2_POLY_EVERY=$every bench "softcap50-poly$every-$mode" \
              --backends cuteattn --dims 128 --seqlens 8192 --causal true --softcap 50
          done
        fi ;;
      window)
        common=(--backends cuteattn,fa4 --dims 128 --seqlens 32768 --tokens 32768 --causal true --mode $mode)
        bench "causal32k-$mode" "${common[@]}"
        bench "window4096-$mode" "${common[@]}" --window 4096,0 ;;
      varlen)
        bench "varlen-$mode" --backends cuteattn,fa4 --dims 64,128,256 --varlen --mode $mode ;;
      *) echo "unknown feature: $feature" >&2; exit 2 ;;
    esac
  done
done
tar -czf "${OUT:-/tmp}/bench-logs.tgz" -C "$out" .
