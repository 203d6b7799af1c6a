"""Compact listing: addr, opcode text, innermost cuteattn source location (only when it changes)."""
import sys
sys.path.insert(0, "/tmp/sass_varlen/scripts")
from sass import parse
ins, labels = parse(sys.argv[1])
lo = int(sys.argv[2], 16) if len(sys.argv) > 2 else 0
hi = int(sys.argv[3], 16) if len(sys.argv) > 3 else 1 << 30
rev = {}
for l, a in labels.items(): rev.setdefault(a, []).append(l)
last = None
for i in ins:
    if not lo <= i["a"] <= hi: continue
    for l in rev.get(i["a"], []): print(f"{l}:")
    loc = i["loc"][1] or i["loc"][0]
    tag = "" if loc == last else "   # " + (i["loc"][0] + (" <- " + i["loc"][1] if i["loc"][1] else ""))
    last = loc
    print(f"  {i['a']:05x} {i['t'][:90]}{tag}")
