#!/usr/bin/env bash
# The fixed-length sm90 backward ids with a causal mask (what a change to the causal
# non-deterministic kernels' tile order, e.g. make_tail_section_counts, must pass), in 12 shards.
# From the repository root:
#   source .devdeps/prelude.sh && bash wip/notes/gqa-tail-tests.sh
# Summary and logs under $OUT (gqa_tail_tests.txt, gqa_tail_tests_full.log).
set -u
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  | grep -v sm80 | grep -v varlen | grep True | grep -E "test_backward_matches_reference\[sm90|\
test_gradients_from_recycled_memory|test_claims_under_contention|test_sink_backward|\
test_softcap_backward|test_padded_head_dim_backward|test_dim_v_backward" > /tmp/gqa_tail_ids.txt
bash "$(dirname "$0")/run-gpu-ids.sh" /tmp/gqa_tail_ids.txt gqa_tail_tests
