source .devdeps/prelude.sh
B="python -m cuteattn.bench --mode bwd"
timeout 200 $B --backends cuteattn,fa4,sdpa-cudnn --seqlens 1024,4096,16384 --causal both --dims 64,128,256 --extra-shape dim=128,seqlen=8192,heads=32,heads_kv=4,causal=both > $OUT/grid.log 2>&1; echo grid rc=$?; grep -E "geomean" $OUT/grid.log
timeout 200 $B --backends cuteattn,cuteattn-deterministic,fa4,fa4-deterministic --dims 64,128,256 --seqlens 4096,16384 --causal both > $OUT/det.log 2>&1; echo det rc=$?; grep -E "^ *[0-9]+ +[0-9]+ " $OUT/det.log | tr -s " "
timeout 190 scripts/ab_each.sh c96 "--mode bwd --backends cuteattn,fa4,sdpa-cudnn --seqlens 1024,4096,16384 --causal both --dims 96,192" wip/claims-d96-d192.diff
