import sys, re, collections
sys.path.insert(0, "/tmp/analysis_varlen/scripts")
from sass_loops import parse, opcode
f, loop_lo, loop_hi = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3], 16)
ins, labels = parse(f)
alloc = [a for a, t in ins if "USETMAXREG.TRY_ALLOC" in t][0]
exits = [a for a, t in ins if re.search(r"\bEXIT\b", t) and a > loop_hi]
def count(lo, hi):
    c = collections.Counter(); n = 0
    for a, t in ins:
        if lo <= a < hi:
            n += 1; c[opcode(t).split(".")[0]] += 1
    return n, c
n, c = count(alloc, loop_lo)
print(f"{f}: consumer prologue (TRY_ALLOC..loop head) {n} static: " + ", ".join(f"{k}={v}" for k, v in c.most_common(14)))
n, c = count(loop_hi + 16, exits[-1] + 16)
print(f"   epilogue (loop end..last EXIT) {n} static: " + ", ".join(f"{k}={v}" for k, v in c.most_common(14)))
