"""List-scheduling of the varlen backward's CTAs on 132 SMs (one CTA per SM at a time, each
CTA to the SM that frees first, in launch order). A CTA's duration = overhead + steps * (tile_m / 64)
(step cost proportional to the query rows it covers); overhead in 64-row-step units."""
import heapq, math, sys
sys.path.insert(0, "/work/main/src")
from cuteattn.bench.runner import varlen_lengths
L = list(varlen_lengths(32768, shortest=128, longest=8192))

def ctas(lengths, heads, tm, tn, causal, order):
    """order: 'fa4' (given sequence order, heads-last), 'ours_causal' (tiles longest first,
    heads fastest), 'ours_dense' (longest first, heads-last), 'lf_heads_last', 'given_heads_fastest'"""
    seqs = list(range(len(lengths)))
    if order.startswith("lf") or order.startswith("ours"):
        seqs.sort(key=lambda b: (-math.ceil(lengths[b] / tn), b))
    heads_fastest = order in ("ours_causal", "given_heads_fastest", "lf_heads_fastest")
    out = []
    for b in seqs:
        l = lengths[b]; nk = -(-l // tn); nm = -(-l // tm)
        def steps(n):
            first = (n * tn) // tm if causal else 0
            return max(nm - first, 0)
        if heads_fastest:
            out += [steps(n) for n in range(nk) for _ in range(heads)]
        else:
            out += [steps(n) for _ in range(heads) for n in range(nk)]
    return out

def makespan(durs, sms=132):
    free = [0.0] * sms
    for d in durs:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)

def run(dim, causal, tm, order, overhead, heads, tn=128, sms=132, per_row=1.0):
    st = ctas(L, heads, tm, tn, causal, order)
    durs = [overhead + s * tm / 64 * per_row for s in st]
    ms = makespan(durs, sms)
    return ms, sum(durs) / sms, len(st)

if __name__ == "__main__":
    for dim, causal, heads in ((64, True, 32), (64, False, 32), (128, False, 16), (128, True, 16)):
        for tm, who in ((128, "both"),) if dim == 64 else ((64, "ours"), (80, "fa4")) if not causal else ((64, "both"),):
            for overhead in (0.0, 1.0, 2.0, 4.0):
                row = []
                for order in ("fa4", "ours_causal" if causal else "ours_dense", "lf_heads_last", "lf_heads_fastest"):
                    ms, ideal, n = run(dim, causal, tm, order, overhead, heads)
                    row.append(f"{order}: {ms:8.1f} ({ms/ideal - 1:+.2%})")
                print(f"d{dim} {'causal' if causal else 'dense'} tile_m {tm} ({who}) CTA overhead {overhead} steps: " + "  ".join(row))
