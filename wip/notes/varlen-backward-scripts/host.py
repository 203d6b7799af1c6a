import sys, math
sys.path.insert(0, "/work/main/src")
from cuteattn.bench.runner import varlen_lengths
L = list(varlen_lengths(32768, shortest=128, longest=8192))
T, n, mx = sum(L), len(L), max(L)
cdiv = lambda a, b: -(-a // b)
def padded_rows(total, nseq, tile): return cdiv(total + nseq * tile, tile) * tile
for dim, heads, tm, fa4_tm in ((64, 32, 128, 128), (128, 16, 64, 80)):
    rows = padded_rows(T, n, tm)
    need = sum(cdiv(l, tm) * tm for l in L)
    acc = heads * rows * dim * 4
    print(f"d{dim} ({heads} heads, tile_m {tm}): dq_accum rows {rows} (sequences' tiles need {need}); "
          f"zero fill {acc/1e6:.1f} MB (fixed 8x4096: {8*4096*heads*dim*4/1e6:.1f} MB); lse_log2 + dpsum {2*heads*rows*4/1e6:.2f} MB")
    # preprocess: grid (ceil(round_up(max, tm)/64), heads, nseq), 128 threads, 64 rows per CTA
    longest = cdiv(mx, tm) * tm
    pre_grid = cdiv(longest, 64) * heads * n
    pre_useful = sum(cdiv(cdiv(l, tm) * tm, 64) for l in L) * heads
    print(f"   preprocess: grid {cdiv(longest,64)} x {heads} x {n} = {pre_grid} CTAs (128 thr), with rows {pre_useful} ({pre_useful/pre_grid:.0%}); fixed 8x4k: {4096//64*heads*8}")
    # postprocess: FragmentDqPostprocess rows_per_cta = tm; grid (ceil(max/tm), heads, n+1)
    post_grid = cdiv(mx, tm) * heads * (n + 1)
    post_useful = sum(cdiv(l, tm) for l in L) * heads
    print(f"   postprocess: grid {cdiv(mx,tm)} x {heads} x {n+1} = {post_grid} CTAs (256 thr), with rows {post_useful} ({post_useful/post_grid:.0%}); fixed 8x4k: {4096//tm*heads*8}")
    # main kernel grid: min(loose, longest) * heads
    loose = (T + n * 127) // 128; longest_b = n * cdiv(mx, 128)
    main_grid = min(loose, longest_b) * heads
    main_useful = sum(cdiv(l, 128) for l in L) * heads
    print(f"   main: grid {main_grid} CTAs, with a key tile {main_useful} ({main_grid-main_useful} exit at once); FA4 bound {(T + n*127)//128*heads}")
    # FA4 preprocess/postprocess: SingleTileVarlenScheduler, tile fa4_tm
    fa4_grid = (T + n * (fa4_tm - 1)) // fa4_tm * heads
    fa4_useful = sum(cdiv(l, fa4_tm) for l in L) * heads
    print(f"   FA4 pre/post (tile {fa4_tm}): grid {fa4_grid} CTAs, valid {fa4_useful}")
