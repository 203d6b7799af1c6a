#!/usr/bin/env bash
# wip/bwd-mqa-heads-inner.diff's A/B (after `git apply wip/bwd-mqa-heads-inner.diff && bash
# wip/notes/gqa-tail-tests.sh` passed, then reverted): causal MQA 32 / 1 at d128 1k / 2k / 8k and
# d96 8k (past the claims' 4k keys), with a GQA 32 / 4 row and an MHA row that must not move
# (the diff changes MQA plans only). From the repository root on the device (main, no diff):
#   source .devdeps/prelude.sh && bash wip/notes/mqa-heads-inner-ab.sh
set -u
timeout 400 scripts/ab_each.sh mqa "--mode bwd --backends cuteattn,fa4,sdpa-cudnn --dims 128 \
--seqlens 1024,2048,8192 --causal true --hidden 4096 --heads-kv 1 \
--extra-shape dim=96,seqlen=8192,heads=32,heads_kv=1,causal=true \
--extra-shape dim=128,seqlen=8192,heads=32,heads_kv=4,causal=true \
--extra-shape dim=128,seqlen=4096,heads=16,heads_kv=16,causal=true" wip/bwd-mqa-heads-inner.diff
patch -s -p1 -R -F0 --dry-run < wip/bwd-mqa-heads-inner.diff > /dev/null 2>&1 \
  && patch -s -p1 -R -F0 < wip/bwd-mqa-heads-inner.diff
