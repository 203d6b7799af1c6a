#!/usr/bin/env bash
# The GPU tests owed by ops.eager_backward (thirtieth session, c8198f8: an eager autograd
# backward runs the backward ops' functions, not the ops): every GPU test that reaches the
# backward through autograd, torch.compile or CUDA graphs (the custom-op file, the training
# steps, sink / softcap through autograd, empty inputs' gradients, varlen backward ids, recycled
# memory), in 12 shards. From the repository root on the device:
#   source .devdeps/prelude.sh && bash wip/notes/eager-backward-tests.sh
# Summary and logs under $OUT (eager_backward_tests.txt, eager_backward_tests_full.log).
set -u
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  > /tmp/all_gpu_ids.txt
{
  grep -E "^tests/gpu/test_custom_op_gpu.py" /tmp/all_gpu_ids.txt
  grep -E "autograd|compiled|cuda_graph|gradients_of_empty|test_varlen_backward|recycled" \
    /tmp/all_gpu_ids.txt | grep -v "^tests/gpu/test_custom_op_gpu.py"
} | sort -u > /tmp/eager_backward_ids.txt
TL="${TL:-420}" bash "$(dirname "$0")/run-gpu-ids.sh" /tmp/eager_backward_ids.txt eager_backward_tests
