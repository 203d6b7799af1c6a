#!/usr/bin/env bash
# One device call's worth of GPU tests, logged under $OUT (or /tmp), a summary line per shard.
#
#   source .devdeps/prelude.sh && scripts/gpu_suite.sh features   # softcap, sink, window, varlen, empty inputs, head dims, dim_v
#   scripts/gpu_suite.sh forward | backward | all | <group> ...
#
# Kernel compiles dominate a GPU test run and use one CPU core each, so each group runs as
# several pytest processes at once, its shards: one per family and "rest" for the tests no
# other shard selects (those that name no family). SHARDS=2 also splits by dtype, SHARDS=4 by
# dtype and then by whether the test id holds "True" (the long groups then fit one call: 9
# processes); SHARDS=0 runs each group as one process, one group after another. K (or
# K_<group>) adds a -k expression. Each process runs under GROUP_TIMEOUT seconds (default 540) and is then
# interrupted with SIGINT, so that pytest still prints which tests failed and why. The log of
# each shard is <group>-<shard>.log in $OUT/gpu-logs.tgz; the summary prints the failures' first lines.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)  # the logs, packed at the end into $OUT/gpu-logs.tgz (one file to carry back)
limit="${GROUP_TIMEOUT:-540}"
K="${K:-}"

declare -A SUITES=(
  [softcap]="tests/gpu/test_softcap.py"
  [sink]="tests/gpu/test_sink.py"
  [window]="tests/gpu/test_window.py"
  [varlen]="tests/gpu/test_varlen_gpu.py"
  [empty]="tests/gpu/test_empty_inputs_gpu.py"
  [headdim]="tests/gpu/test_head_dims.py"
  [dimv]="tests/gpu/test_dim_v.py"
  [forward]="tests/gpu/test_forward.py tests/gpu/test_every_tiling.py tests/gpu/test_persistent_shared_o.py tests/gpu/test_forward_robustness.py tests/gpu/test_long_context.py tests/gpu/test_pack_gqa.py tests/gpu/test_scheduler_visits.py"
  [backward]="tests/gpu/test_backward.py tests/gpu/test_dq_postprocess.py"
)
case "${1:-features}" in
  features) names="softcap sink window varlen empty headdim dimv" ;;
  all) names="forward backward softcap sink window varlen empty headdim dimv" ;;
  *) names="$*" ;;
esac

shards_of() {  # group (the same shards for every group)
  case "${SHARDS:-1}" in
    0) echo "all" ;;
    2) echo "sm90.bfloat16 sm90.float16 sm80.bfloat16 sm80.float16 rest" ;;
    4) local f d
       for f in sm90 sm80; do for d in bfloat16 float16; do echo "$f.$d.T $f.$d.F"; done; done
       echo "rest" ;;
    *) echo "sm90 sm80 rest" ;;
  esac
}

expression_of() {  # shard: its -k expression (family[.dtype[.T|.F]], "." for " and ")
  case $1 in all|rest) echo ""; return ;; esac
  local part expr=""
  for part in ${1//./ }; do
    case $part in
      float16) part="not bfloat16" ;;  # "float16" is in "bfloat16"
      T) part="True" ;;
      F) part="not True" ;;
    esac
    expr="${expr:+$expr and }$part"
  done
  echo "$expr"
}

run_one() {  # group shard files...
  local name=$1 shard=$2 select="" others="" other
  shift 2
  select=$(expression_of "$shard")
  if [ "$shard" = rest ]; then
    for other in $(shards_of "$name"); do
      [ "$other" = rest ] || others="${others:+$others or }($(expression_of "$other"))"
    done
    select="not ($others)"
  fi
  local kvar="K_$name"
  local extra="${!kvar:-$K}"
  [ -n "$extra" ] && select="${select:+($select) and }($extra)"
  timeout -s INT -k 30 "$limit" python -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf \
    ${select:+-k "$select"} "$@" > "$out/$name-$shard.log" 2>&1
  echo "rc=$?" >> "$out/$name-$shard.log"
}

for name in $names; do
  files="${SUITES[$name]:-}"
  if [ -z "$files" ]; then echo "unknown group: $name" >&2; exit 2; fi
  existing=""
  for f in $files; do [ -e "$f" ] && existing="$existing $f"; done
  if [ -z "$existing" ]; then echo "$name: no test file here"; continue; fi
  for shard in $(shards_of "$name"); do
    if [ "${SHARDS:-1}" = 0 ]; then run_one "$name" "$shard" $existing
    else run_one "$name" "$shard" $existing & fi
  done
done
wait

status=0
for name in $names; do
  for shard in $(shards_of "$name"); do
    log="$out/$name-$shard.log"
    [ -e "$log" ] || continue
    rc=$(tail -1 "$log" | sed -n 's/^rc=//p')
    summary=$(grep -E "[0-9]+ (passed|failed|skipped|deselected|error)" "$log" | tail -1)
    echo "$name/$shard (rc=$rc): ${summary:-no summary}"
    grep -E "^FAILED" "$log" | head -8 | cut -c1-300
    grep -E "^E +[A-Za-z.]*(Error|Exception)" "$log" | sort | uniq -c | sort -rn | head -6 | cut -c1-300
    # rc 5: the shard selected no test (a file with one family's tests).
    case $rc in 0|5) ;; *) status=1 ;; esac
  done
done
tar -czf "${OUT:-/tmp}/gpu-logs.tgz" -C "$out" .
exit $status
