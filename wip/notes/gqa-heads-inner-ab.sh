#!/usr/bin/env bash
# wip/bwd-gqa-heads-inner.diff's A/B (after `git apply wip/bwd-gqa-heads-inner.diff && bash
# wip/notes/gqa-tail-tests.sh` passed: every causal sm90 fixed-length backward id, GQA ones
# among them; revert the diff before this): d128 causal GQA 32 / 4 at 1k / 4k / 16k, issue
# 5's GQA row (8k, both), MQA 32 / 1 at 2k, and an MHA row that must not move (the diff
# changes GQA plans only). From the repository root on the device (main, no diff applied):
#   source .devdeps/prelude.sh && bash wip/notes/gqa-heads-inner-ab.sh
set -u
timeout 400 scripts/ab_each.sh heads "--mode bwd --backends cuteattn,fa4,sdpa-cudnn --dims 128 \
--seqlens 1024,4096,16384 --causal true --hidden 4096 --heads-kv 4 \
--extra-shape dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both \
--extra-shape dim=128,seqlen=2048,heads=32,heads_kv=1,causal=true \
--extra-shape dim=128,seqlen=4096,heads=16,heads_kv=16,causal=true" wip/bwd-gqa-heads-inner.diff
patch -s -p1 -R -F0 --dry-run < wip/bwd-gqa-heads-inner.diff > /dev/null 2>&1 \
  && patch -s -p1 -R -F0 < wip/bwd-gqa-heads-inner.diff
