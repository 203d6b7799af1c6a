#!/usr/bin/env bash
# wip/bwd-preprocess-loads-first.diff's A/B (after wip/notes/preprocess-tests.sh passed): the
# kernels of d128 1k calls, causal and dense (scripts/kernel_times.py: the preprocess's time
# per call), then the bench's d128 rows with the GQA 8k row, main then the diff (one process
# each). From the repository root on the device (main, no diff applied):
#   source .devdeps/prelude.sh && bash wip/notes/preprocess-ab.sh
set -u
diff=wip/bwd-preprocess-loads-first.diff
out="${OUT:-/tmp}"
rows="--mode bwd --backends cuteattn,fa4 --dims 128 --seqlens 1024 --causal both"
python scripts/kernel_times.py $rows > "$out/kt-main.log" 2>&1
git apply "$diff" && python scripts/kernel_times.py $rows > "$out/kt-preprocess.log" 2>&1
git apply -R "$diff"
grep -iE "preprocess|call|^dim|causal" "$out"/kt-main.log "$out"/kt-preprocess.log | cut -c1-170
timeout 300 scripts/ab_each.sh pre "--mode bwd --backends cuteattn,fa4,sdpa-cudnn --dims 128 \
--seqlens 1024,4096,16384 --causal both \
--extra-shape dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both" "$diff"
git apply -R --check "$diff" 2>/dev/null && git apply -R "$diff"
