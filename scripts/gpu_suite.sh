#!/usr/bin/env bash
# One device call's worth of GPU tests, logged under $OUT (or /tmp), a summary line per group.
#
#   source .devdeps/prelude.sh && scripts/gpu_suite.sh features   # softcap, sink, window, varlen, empty inputs, head dims
#   scripts/gpu_suite.sh forward | backward | all
#
# Each group runs under its own time limit (GROUP_TIMEOUT seconds, default 540) so that one
# slow or hung group cannot take the whole call; the full log of each is $OUT/<group>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
limit="${GROUP_TIMEOUT:-540}"

declare -A SUITES=(
  [softcap]="tests/gpu/test_softcap.py"
  [sink]="tests/gpu/test_sink.py"
  [window]="tests/gpu/test_window.py"
  [varlen]="tests/gpu/test_varlen_gpu.py"
  [empty]="tests/gpu/test_empty_inputs_gpu.py"
  [headdim]="tests/gpu/test_head_dims.py"
  [forward]="tests/gpu/test_forward.py tests/gpu/test_forward_robustness.py tests/gpu/test_long_context.py tests/gpu/test_pack_gqa.py"
  [backward]="tests/gpu/test_backward.py"
)
case "${1:-features}" in
  features) names="softcap sink window varlen empty headdim" ;;
  all) names="forward backward softcap sink window varlen empty headdim" ;;
  *) names="$*" ;;
esac

status=0
for name in $names; do
  files="${SUITES[$name]:-}"
  if [ -z "$files" ]; then echo "unknown group: $name" >&2; exit 2; fi
  existing=""
  for f in $files; do [ -e "$f" ] && existing="$existing $f"; done
  if [ -z "$existing" ]; then echo "$name: no test file here"; continue; fi
  timeout "$limit" python -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf $existing \
    > "$out/$name.log" 2>&1
  rc=$?
  summary=$(grep -E "[0-9]+ (passed|failed|skipped|error)" "$out/$name.log" | tail -1)
  echo "$name (rc=$rc): ${summary:-no summary (timed out?)}"
  grep -E "^FAILED" "$out/$name.log" | head -5
  [ $rc -eq 0 ] || status=1
done
exit $status
