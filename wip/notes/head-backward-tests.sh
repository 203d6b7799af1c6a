#!/usr/bin/env bash
# The GPU tests the landed tree owes (33bf840: claims at d96 / d192 up to 4k keys; kernels
# PTX-identical to those the twenty-eighth session ran, but the landed tree itself did not run
# pytest -m gpu): every recycled-memory and claims-under-contention id (both families), every
# sm90 d96 / d192 backward-vs-reference id, and every 3rd sm80 backward-vs-reference id
# (kernels/common changed since 17a77b7; sm80 PTX identical to 17a77b7's), in 12 shards
# (~390 ids, ~4 min). From the repository root:
#   source .devdeps/prelude.sh && bash wip/notes/head-backward-tests.sh
# Summary and logs under $OUT (head_backward_tests.txt, head_backward_tests_full.log).
set -u
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  > /tmp/head_all_ids.txt
{
  grep "test_backward.py" /tmp/head_all_ids.txt | grep -E "recycled_memory|claims_under_contention"
  grep -E "test_backward_matches_reference\[sm90-(96|192)-" /tmp/head_all_ids.txt
  grep -E "test_backward_matches_reference\[sm80-" /tmp/head_all_ids.txt | awk 'NR % 3 == 1'
} > /tmp/head_backward_ids.txt
bash "$(dirname "$0")/run-gpu-ids.sh" /tmp/head_backward_ids.txt head_backward_tests
