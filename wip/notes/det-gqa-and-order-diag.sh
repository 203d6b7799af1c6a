# Twenty-ninth session, call 6: the deterministic GQA sections' tests (with wip/det-gqa-sections.diff
# applied then), the 1k row's order diagnosis twice, issue 6's grid with --settle-calls 1. From the
# repository root on the device: source .devdeps/prelude.sh && bash wip/notes/det-gqa-and-order-diag.sh
python -m pytest -p no:cacheprovider tests/gpu/test_backward.py -m gpu --collect-only -q -k "(deterministic_backward_is_bitwise_reproducible and sm90) or (recycled_memory and sm90-True)" 2>/dev/null | grep "::" > /tmp/detgqa_ids.txt
TL=200 bash wip/notes/run-gpu-ids.sh /tmp/detgqa_ids.txt detgqa_tests
timeout 100 python wip/notes/short_row_diag.py --mode bwd --backends cuteattn,fa4,sdpa-cudnn --dims 128 --seqlens 1024 --causal true > $OUT/diag2.log 2>&1; grep -A12 "us per call" $OUT/diag2.log
timeout 130 python -m cuteattn.bench --settle-calls 1 --mode bwd --backends cuteattn,fa4,sdpa-cudnn --seqlens 1024,4096,16384 --causal both --dims 64,128,256 --extra-shape dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both > $OUT/grid-settle.log 2>&1; tail -8 $OUT/grid-settle.log
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 90 python wip/notes/short_row_diag.py --mode bwd --backends cuteattn,fa4,sdpa-cudnn --dims 128 --seqlens 1024 --causal true > $OUT/diag3.log 2>&1; grep -A12 "us per call" $OUT/diag3.log
