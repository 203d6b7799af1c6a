#!/usr/bin/env bash
# The fixed-length sm90 backward ids the claims touch (~640; device call 1 of the
# twenty-seventh session), in 12 shards. Run from the repository root:
#   source .devdeps/prelude.sh && bash wip/notes/dq-claims-tests.sh
# Summary and logs under $OUT (claims_tests.txt, claims_tests_full.log).
set -u
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  | grep -v sm80 | grep -v varlen | grep -E "test_backward_matches_reference\[sm90|\
test_gradients_from_recycled_memory|test_claims_under_contention|test_sink_backward|\
test_softcap_backward|test_padded_head_dim_backward|test_dim_v_backward|\
test_compiled_training_step_equals_eager|test_cuda_graph_training_step_equals_eager|\
test_autograd_gradients_with_a_planted_dominant_key" > /tmp/claims_ids.txt
bash "$(dirname "$0")/run-gpu-ids.sh" /tmp/claims_ids.txt claims_tests
