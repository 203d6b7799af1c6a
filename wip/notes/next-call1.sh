#!/usr/bin/env bash
# Issue 6, next session's first device call (at most 580 s, ~520 with a cold start), from the repository root:
#   source .devdeps/prelude.sh && bash wip/notes/next-call1.sh
# 1. The GPU test ids whose test code changed with 33bf840 (claims at d96 / d192 up to 4k keys;
#    the kernels ran in the twenty-eighth session, the tests' new bookkeeping did not).
# 2. The tail-sections A/B: GQA rows (issue 5's GQA shape among them) with and without
#    wip/bwd-gqa-tail-sections.diff; MHA causal rows with each of the two tail-sections diffs.
# Logs under $OUT.
set -u
out="${OUT:-/tmp}"
timeout 120 python -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/gpu/test_backward.py \
  -k "(claims_under_contention and (96 or 192)) or (recycled_memory and sm90-False and (96 or 192))" \
  > "$out/claims-d96-d192-tests.log" 2>&1
tail -1 "$out/claims-d96-d192-tests.log"
timeout 220 scripts/ab_each.sh gqa "--mode bwd --backends cuteattn,fa4,sdpa-cudnn --dims 128 \
--seqlens 1024,4096,16384 --causal true --hidden 4096 --heads-kv 4 \
--extra-shape dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both \
--extra-shape dim=128,seqlen=2048,heads=32,heads_kv=1,causal=true" wip/bwd-gqa-tail-sections.diff
# A timeout inside the first A/B may leave its diff applied: take it out.
for diff in wip/bwd-gqa-tail-sections.diff wip/bwd-tail-sections-all.diff; do
  patch -s -p1 -R -F0 --dry-run < "$diff" > /dev/null 2>&1 && patch -s -p1 -R -F0 < "$diff"
done
timeout 240 scripts/ab_each.sh mha "--mode bwd --backends cuteattn,fa4,sdpa-cudnn --dims 64,128 \
--seqlens 1024,4096,16384 --causal true" wip/bwd-gqa-tail-sections.diff wip/bwd-tail-sections-all.diff
