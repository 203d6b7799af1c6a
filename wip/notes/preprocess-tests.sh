#!/usr/bin/env bash
# The GPU tests of wip/bwd-preprocess-loads-first.diff (the backward preprocess, shared by both
# families, loads every pass's rows before using any) together with those ops.eager_backward
# owes (wip/notes/eager-backward-tests.sh's ids: autograd, torch.compile, CUDA graphs): the
# preprocess test (every dim), every 6th fixed-length backward-vs-reference id of both
# families, every varlen backward id (rows without keys, sequences of their own lengths),
# recycled memory, the custom-op file, training steps, sink / softcap through autograd, empty
# inputs' gradients (~750 ids, 12 shards). From the repository root on the device, main:
#   source .devdeps/prelude.sh && git apply wip/bwd-preprocess-loads-first.diff \
#     && bash wip/notes/preprocess-tests.sh; git apply -R wip/bwd-preprocess-loads-first.diff
# Summary and logs under $OUT (preprocess_tests.txt, preprocess_tests_full.log).
set -u
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  > /tmp/all_gpu_ids.txt
{
  grep -E "test_backward_preprocess" /tmp/all_gpu_ids.txt
  grep -E "test_backward_matches_reference\[" /tmp/all_gpu_ids.txt | awk 'NR % 6 == 0'
  grep -E "test_varlen_backward|test_varlen_deterministic_backward|recycled" /tmp/all_gpu_ids.txt
  grep -E "^tests/gpu/test_custom_op_gpu.py" /tmp/all_gpu_ids.txt
  grep -E "autograd|compiled|cuda_graph|gradients_of_empty" /tmp/all_gpu_ids.txt
} | sort -u > /tmp/preprocess_ids.txt
TL="${TL:-420}" bash "$(dirname "$0")/run-gpu-ids.sh" /tmp/preprocess_ids.txt preprocess_tests
