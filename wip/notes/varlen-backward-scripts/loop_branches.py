import re, sys, collections
sys.path.insert(0, "/tmp/analysis_varlen/scripts")
from sass_loops import parse, opcode
path, lo, hi = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3], 16)
ins, labels = parse(path)
addrs = [a for a, _ in ins]
idx = {a: i for i, (a, _) in enumerate(ins)}
n_loop = sum(1 for a in addrs if lo <= a <= hi)
print(f"{path} loop {lo:#x}-{hi:#x}: {n_loop} static")
for a, t in ins:
    if not (lo <= a <= hi): continue
    m = re.search(r"BRA\s+(?:(U?!?U?P\w+),\s*)?`\((\.L_x_\d+)\)", t)
    if not m: continue
    tgt = labels.get(m.group(2))
    if tgt is None: continue
    inside = lo <= tgt <= hi
    skipped = idx[tgt] - idx[a] - 1 if tgt > a else None
    print(f"  {a:#06x} {t:50s} -> {tgt:#06x} {'inside' if inside else 'OUTSIDE'} skip={skipped}")
