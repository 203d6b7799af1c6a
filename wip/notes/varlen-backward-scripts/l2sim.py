"""LRU model of L2 traffic for the backward's streamed rows (Q + dO tiles, the dq_accum tile's
read-modify-write) under a launch order: CTAs placed by list scheduling on 132 SMs, each step
one time unit; misses counted in bytes. Rough: ignores K/V, lse/dpsum, dK/dV, L2 partitions."""
import heapq, math, sys
from collections import OrderedDict
sys.path.insert(0, "/work/main/src")
from cuteattn.bench.runner import varlen_lengths

def cta_list(lengths, heads, tm, tn, causal, order):
    seqs = list(range(len(lengths)))
    if order in ("ours", "lf_heads_last", "lf_heads_fastest"):
        seqs.sort(key=lambda b: (-math.ceil(lengths[b] / tn), b))
    fastest = order in ("lf_heads_fastest",)
    out = []
    for b in seqs:
        l = lengths[b]; nk = -(-l // tn); nm = -(-l // tm)
        pairs = [(n, h) for n in range(nk) for h in range(heads)] if fastest else \
                [(n, h) for h in range(heads) for n in range(nk)]
        for n, h in pairs:
            first = (n * tn) // tm if causal else 0
            out.append((b, h, n, list(range(first, nm))))
    return out

def simulate(lengths, heads, dim, tm, tn, causal, order, l2_mb=50, sms=132, overhead=2.0):
    ctas = cta_list(lengths, heads, tm, tn, causal, order)
    free = [(0.0, i) for i in range(sms)]
    heapq.heapify(free)
    events = []
    for (b, h, n, ms) in ctas:
        t, sm = heapq.heappop(free)
        t0 = t + overhead / 2
        for i, m in enumerate(ms):
            events.append((t0 + i, b, h, m))
        heapq.heappush(free, (t0 + len(ms) + overhead / 2, sm))
    events.sort()
    qdo = tm * dim * 2 * 2  # Q + dO bf16
    acc = tm * dim * 4      # dq_accum fp32
    cap = l2_mb * 2**20
    lru = OrderedDict(); used = 0
    hbm = 0; total = 0
    def touch(key, size, rmw):
        nonlocal used, hbm
        if key in lru:
            lru.move_to_end(key); return
        hbm += size * (2 if rmw else 1)  # a dq_accum miss: read now, write back when evicted
        lru[key] = size; used += size
        while used > cap:
            _, s = lru.popitem(last=False); used -= s
    for t, b, h, m in events:
        touch(("q", b, h, m), qdo, False)
        touch(("a", b, h, m), acc, True)
        total += qdo + acc
    return hbm, total, len(events), events[-1][0]

if __name__ == "__main__":
    L = list(varlen_lengths(32768, shortest=128, longest=8192))
    for dim, causal, heads, tm in ((64, True, 32, 128), (64, False, 32, 128), (128, False, 16, 64), (128, True, 16, 64)):
        for order in ("fa4", "lf_heads_last", "lf_heads_fastest"):
            for l2 in (50, 35):
                hbm, total, steps, end = simulate(L, heads, dim, tm, 128, causal, order, l2_mb=l2)
                print(f"varlen d{dim} {'causal' if causal else 'dense'} {order:16s} L2 {l2} MB: "
                      f"HBM {hbm/2**30:6.2f} GiB of {total/2**30:6.2f} GiB streamed "
                      f"({hbm/total:.1%}); per step {hbm/steps/1024:5.1f} KB")
        hbm, total, steps, end = simulate([4096]*8, heads, dim, tm, 128, causal, "fixed", l2_mb=50)
        print(f"fixed 4k x8 d{dim} {'causal' if causal else 'dense'} (key tiles fastest): HBM {hbm/2**30:6.2f} GiB of {total/2**30:6.2f} GiB ({hbm/total:.1%}); per step {hbm/steps/1024:5.1f} KB")
