#!/usr/bin/env bash
# The GPU tests of wip/persistent-bwd.diff (the sm90 backward persistent up to d128, not
# deterministic, fixed length): every sm90 d64 / d96 / d128 backward-vs-reference id, the
# recycled-memory ids of sm90, claims under contention, every backward tiling, the diff's own
# persistent test (15: tiles above / below the SM count, the counter left zero), the sm90
# fixed-length sink / softcap / padded-dim / dim_v backward ids, the custom-op GPU tests (CUDA
# graphs, torch.compile) and empty inputs' gradients (~555 ids, 12 shards). From the repository
# root on the device, with the diff applied:
#   source .devdeps/prelude.sh && git apply wip/persistent-bwd.diff && bash wip/notes/persistent-bwd-tests.sh
# (or wip/persistent-bwd-early-k.diff, which contains it)
# Summary and logs under $OUT (persistent_bwd_tests.txt, persistent_bwd_tests_full.log).
set -u
python -m pytest -p no:cacheprovider tests/gpu -m gpu --collect-only -q 2>/dev/null | grep "::" \
  > /tmp/all_gpu_ids.txt
{
  grep -E "test_backward_matches_reference\[sm90-(64|96|128)-" /tmp/all_gpu_ids.txt
  grep -E "test_gradients_from_recycled_memory\[sm90" /tmp/all_gpu_ids.txt
  grep -E "test_claims_under_contention|test_every_backward_tiling_runs" /tmp/all_gpu_ids.txt
  grep -E "test_persistent_backward_leaves_the_tile_counter_zero" /tmp/all_gpu_ids.txt
  grep -E "test_(sink|softcap|padded_head_dim|dim_v)_backward" /tmp/all_gpu_ids.txt \
    | grep -v sm80 | grep -v varlen
  grep -E "test_custom_op_gpu|test_gradients_of_empty_inputs" /tmp/all_gpu_ids.txt
} > /tmp/persistent_bwd_ids.txt
# A smoke run first (a hang in the tile hand-over would otherwise hold 12 shards for TL s).
if ! timeout -s INT 150 python -m pytest -m gpu -q -p no:cacheprovider -x tests/gpu/test_backward.py \
    -k "persistent_backward_leaves and 128" > "${OUT:-/tmp}/persistent_smoke.log" 2>&1; then
  echo "smoke run failed or hung:"; tail -20 "${OUT:-/tmp}/persistent_smoke.log"; exit 1
fi
tail -1 "${OUT:-/tmp}/persistent_smoke.log"
TL="${TL:-420}" bash "$(dirname "$0")/run-gpu-ids.sh" /tmp/persistent_bwd_ids.txt persistent_bwd_tests
