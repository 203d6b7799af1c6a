import math, sys
sys.path.insert(0, "/work/main/src")
from cuteattn.bench.runner import varlen_lengths
L = varlen_lengths(32768, shortest=128, longest=8192)
print("lengths", L, len(L), sum(L), "max", max(L))
print("sum L^2", sum(l*l for l in L))
def steps(lengths, tm, tn, causal):
    tot = 0; useful = 0; ctas = 0; per_cta = []
    for l in lengths:
        nk = -(-l // tn); nm = -(-l // tm)
        for n in range(nk):
            first = (n * tn) // tm if causal else 0
            s = max(nm - first, 0)
            tot += s; ctas += 1; per_cta.append(s)
        useful += l * l / (2 if causal else 1)
    return tot, useful, ctas, per_cta
for name, dim, heads, tm, tn, causal in [
    ("d64 causal ours/FA4 128x128", 64, 32, 128, 128, True),
    ("d64 dense 128x128", 64, 32, 128, 128, False),
    ("d128 dense ours 64x128", 128, 16, 64, 128, False),
    ("d128 dense FA4 80x128", 128, 16, 80, 128, False),
    ("d128 causal 64x128", 128, 16, 64, 128, True),
]:
    tot, useful, ctas, per = steps(L, tm, tn, causal)
    cells = tot * tm * tn
    # causal useful: l*(l+1)/2 approx; compare with cells computed
    print(f"{name}: CTAs/head {ctas}, CTAs {ctas*heads}, steps/head {tot}, steps {tot*heads}, "
          f"computed cells/useful {cells/useful:.4f}, mean steps/CTA {tot/ctas:.2f}")
    # fixed-length twin 4k
    l = 4096; b = 8
    t2, u2, c2, _ = steps([l]*b, tm, tn, causal)
    print(f"   fixed 4k x8: CTAs {c2*heads}, steps {t2*heads}, cells/useful {t2*tm*tn/u2:.4f}, mean steps/CTA {t2/c2:.2f}")

print("\npadding breakdown (dense): waste as % of useful L^2")
for tm in (128, 80, 64):
    kw = qw = both = 0; useful = 0
    for l in L:
        K = -(-l // 128) * 128; M = -(-l // tm) * tm
        kw += (K - l) * l; qw += l * (M - l); both += (K - l) * (M - l); useful += l * l
    print(f"  tile_m {tm}: keys {kw/useful:.2%}, queries {qw/useful:.2%}, both {both/useful:.2%}, total {(kw+qw+both)/useful:.2%}")
print("causal: computed cells / useful (L(L+1)/2), and the same for fixed 4096")
for tm in (128, 64):
    comp = use = 0
    for l in L:
        nk = -(-l // 128); nm = -(-l // tm)
        for n in range(nk):
            comp += max(nm - (n * 128) // tm, 0) * tm * 128
        use += l * (l + 1) / 2
    c4 = sum(max(4096 // tm - (n * 128) // tm, 0) * tm * 128 for n in range(32)); u4 = 4096 * 4097 / 2
    print(f"  tile_m {tm}: varlen {comp/use:.4f}, fixed 4k {c4/u4:.4f}")
