#!/usr/bin/env bash
# Every other non-sm80 backward-side GPU id (~500 of ~1000: every test with backward, grad or
# training in its name, both modes), in 12 shards; for a change to every non-deterministic
# d96 / d128 backward kernel (wip/nondet-two-slots.diff). Run from the repository root:
#   source .devdeps/prelude.sh && bash wip/notes/backward-ids-tests.sh
# Summary and logs under $OUT.
set -u
out="${OUT:-/tmp}"
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  | grep -v sm80 | grep -iE "backward|grad|training" | awk 'NR % 2 == 0' > /tmp/bwd_ids.txt
echo "$(wc -l < /tmp/bwd_ids.txt) ids"
shuf --random-source=<(yes) /tmp/bwd_ids.txt > /tmp/bwd_shuf.txt
split -n l/12 -d /tmp/bwd_shuf.txt /tmp/bwd_shard
for f in /tmp/bwd_shard[0-9]*; do
  mapfile -t ids < "$f"
  timeout -s INT "${TL:-480}" python -m pytest -m gpu -q -p no:cacheprovider --tb=short \
    "${ids[@]}" > "$f.log" 2>&1 &
done
wait
for f in /tmp/bwd_shard[0-9]*.log; do
  grep -E "passed|failed|error" "$f" | tail -1; grep -E "^FAILED|^ERROR" "$f" | head
done | tee "$out/bwd_tests.txt"
cat /tmp/bwd_shard[0-9]*.log > "$out/bwd_tests_full.log"
