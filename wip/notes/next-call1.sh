#!/usr/bin/env bash
# Issue 6, next session's second device call (at most 460 s), from the repository root:
#   source .devdeps/prelude.sh && bash wip/notes/next-call1.sh
# (Run wip/notes/head-backward-tests.sh first, its own call: the GPU tests the landed tree owes.)
# The tail-sections A/B: GQA rows (issue 5's GQA shape among them) with and without
#    wip/bwd-gqa-tail-sections.diff; MHA causal rows with each of the two tail-sections diffs.
# Logs under $OUT.
set -u
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
