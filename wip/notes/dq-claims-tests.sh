#!/usr/bin/env bash
# The fixed-length sm90 backward ids (run from the repository root; device call 1 of the
# twenty-seventh session, for the dq claims):
#   source .devdeps/prelude.sh && bash wip/notes/dq-claims-tests.sh
# The fixed-length sm90 backward ids the claims touch (~715), in 12 shards; summary and logs
# under $OUT.
set -u
out="${OUT:-/tmp}"
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  | grep -v sm80 | grep -v varlen | grep -E "test_backward_matches_reference\[sm90|\
test_gradients_from_recycled_memory|test_claims_under_contention|test_sink_backward|\
test_softcap_backward|test_padded_head_dim_backward|test_dim_v_backward|\
test_compiled_training_step_equals_eager|test_cuda_graph_training_step_equals_eager|\
test_autograd_gradients_with_a_planted_dominant_key" > /tmp/claims_ids.txt
echo "$(wc -l < /tmp/claims_ids.txt) ids"
shuf --random-source=<(yes) /tmp/claims_ids.txt > /tmp/claims_shuf.txt
split -n l/12 -d /tmp/claims_shuf.txt /tmp/claims_shard
for f in /tmp/claims_shard[0-9]*; do
  mapfile -t ids < "$f"
  timeout -s INT "${TL:-480}" python -m pytest -m gpu -q -p no:cacheprovider --tb=short \
    "${ids[@]}" > "$f.log" 2>&1 &
done
wait
for f in /tmp/claims_shard[0-9]*.log; do
  grep -E "passed|failed|error" "$f" | tail -1; grep -E "^FAILED|^ERROR" "$f" | head
done | tee "$out/claims_tests.txt"
cat /tmp/claims_shard[0-9]*.log > "$out/claims_tests_full.log"
