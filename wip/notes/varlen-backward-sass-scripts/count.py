"""count.py listing a-b [a-b ...]: instructions in the inclusive address ranges (hex), with opcode histogram."""
import sys, re, collections
ins = []
for line in open(sys.argv[1]):
    m = re.match(r"^\s+([0-9a-f]{5}) (\S+)(.*?)(   #.*)?$", line)
    if m: ins.append((int(m.group(1), 16), re.sub(r"^@!?U?P[T0-9]+$", "", m.group(2)) or m.group(3).split()[0], line))
tot = 0; hist = collections.Counter()
for r in sys.argv[2:]:
    a, b = (int(x, 16) for x in r.split("-"))
    sel = [i for i in ins if a <= i[0] <= b]
    tot += len(sel)
    for i in sel:
        op = i[1].split(".")[0]
        hist[op] += 1
print(tot, dict(hist.most_common()))
