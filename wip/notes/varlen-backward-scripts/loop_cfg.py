import re, sys, collections
sys.path.insert(0, "/tmp/analysis_varlen/scripts")
from sass_loops import parse, opcode, klass
path, lo, hi = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3], 16)
ins, labels = parse(path)
addr2lab = collections.defaultdict(list)
for l, a in labels.items(): addr2lab[a].append(l)
body = [(a, t) for a, t in ins if lo <= a <= hi]
# print branches and labels with counts between them
seg_start = lo; count = 0
for a, t in body:
    if a in addr2lab and a != lo:
        print(f"  [{seg_start:#06x}-{a:#06x}) {count} instr")
        print(f"{a:#06x} label {addr2lab[a]}")
        seg_start = a; count = 0
    count += 1
    op = opcode(t)
    if op.startswith(("BRA", "BSSY", "BSYNC", "EXIT", "WARPSYNC", "BAR", "SYNCS", "HGMMA", "WARPGROUP")) or "BRA" in t:
        if op.startswith("HGMMA"):
            continue
        print(f"    {a:#06x} {t}")
print(f"  [{seg_start:#06x}-{hi:#06x}] {count} instr")
