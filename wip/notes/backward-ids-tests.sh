#!/usr/bin/env bash
# Every other non-sm80 backward-side GPU id (~500 of ~1000: every test with backward, grad or
# training in its name, both modes), in 12 shards; for a change to every non-deterministic
# d96 / d128 backward kernel (wip/nondet-two-slots.diff). Run from the repository root:
#   source .devdeps/prelude.sh && bash wip/notes/backward-ids-tests.sh
# Summary and logs under $OUT (bwd_tests.txt, bwd_tests_full.log).
set -u
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  | grep -v sm80 | grep -iE "backward|grad|training" | awk 'NR % 2 == 0' > /tmp/bwd_ids.txt
bash "$(dirname "$0")/run-gpu-ids.sh" /tmp/bwd_ids.txt bwd_tests
