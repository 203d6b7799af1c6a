#!/usr/bin/env bash
# The GPU tests of wip/bwd-preprocess-loads-first.diff (the backward preprocess, shared by both
# families, loads every pass's rows before using any) together with those ops.eager_call owes
# (thirtieth session: eager calls run the functional ops' functions without their dispatch;
# autograd, torch.compile, CUDA graphs, forward calls): the preprocess test (every dim), every
# 8th fixed-length backward-vs-reference id of both families, every varlen backward id (rows
# without keys, sequences of their own lengths), recycled memory, the custom-op file, training
# steps, sink / softcap through autograd, empty inputs, every 20th forward-vs-reference id,
# every 12th varlen forward id, the forwards without lse and the robustness file (~800 ids, 12
# shards). From the repository root on the device, main:
#   source .devdeps/prelude.sh && git apply wip/bwd-preprocess-loads-first.diff \
#     && bash wip/notes/preprocess-tests.sh; git apply -R wip/bwd-preprocess-loads-first.diff
# Summary and logs under $OUT (preprocess_tests.txt, preprocess_tests_full.log).
set -u
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  > /tmp/all_gpu_ids.txt
{
  grep -E "test_backward_preprocess" /tmp/all_gpu_ids.txt
  grep -E "test_backward_matches_reference\[" /tmp/all_gpu_ids.txt | awk 'NR % 8 == 0'
  grep -E "test_forward_matches_reference\[" /tmp/all_gpu_ids.txt | awk 'NR % 20 == 0'
  grep -E "test_varlen_forward\[" /tmp/all_gpu_ids.txt | awk 'NR % 12 == 0'
  grep -E "test_forward_without_lse|test_forward_robustness|empty_inputs" /tmp/all_gpu_ids.txt
  grep -E "test_varlen_backward|test_varlen_deterministic_backward|recycled" /tmp/all_gpu_ids.txt
  grep -E "^tests/gpu/test_custom_op_gpu.py" /tmp/all_gpu_ids.txt
  grep -E "autograd|compiled|cuda_graph|gradients_of_empty" /tmp/all_gpu_ids.txt
} | sort -u > /tmp/preprocess_ids.txt
TL="${TL:-420}" bash "$(dirname "$0")/run-gpu-ids.sh" /tmp/preprocess_ids.txt preprocess_tests
