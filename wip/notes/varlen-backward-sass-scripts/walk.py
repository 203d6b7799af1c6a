"""walk.py listing start stop [taken_branch_addr ...]: executed instructions from start to stop (inclusive),
conditional branches fall through unless their address is listed; unconditional BRA are followed."""
import sys, re
ins, labels, pending = [], {}, []
for line in open(sys.argv[1]):
    m = re.match(r"^(\.L_x_\d+):", line)
    if m: pending.append(m.group(1)); continue
    m = re.match(r"^\s+([0-9a-f]{5}) (.*?)(   #.*)?$", line)
    if m:
        a = int(m.group(1), 16)
        for l in pending: labels[l] = len(ins)
        pending = []
        ins.append((a, m.group(2)))
idx = {a: i for i, (a, _) in enumerate(ins)}
start, stop = int(sys.argv[2], 16), int(sys.argv[3], 16)
taken = {int(x, 16) for x in sys.argv[4:]}
i, n, trace = idx[start], 0, []
while True:
    a, t = ins[i]; n += 1
    if a == stop: break
    m = re.search(r"`\((\.L_x_\d+)\)", t)
    if "BRA" in t.split()[0] or (t.startswith("@") and "BRA" in t.split()[1]):
        cond = t.startswith("@")
        if (not cond) or a in taken:
            trace.append(f"{a:05x}->{ins[labels[m.group(1)]][0]:05x}")
            i = labels[m.group(1)]; continue
    if "EXIT" in t and not t.startswith("@"): break
    i += 1
print(n, " ".join(trace))
