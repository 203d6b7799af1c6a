"""Opcode-level diff of two listings (from listing.py) of the same region."""
import sys, re, difflib, collections
def load(p):
    out = []
    for line in open(p):
        m = re.match(r"^\s+([0-9a-f]{5}) (.*?)(   # (.*))?$", line)
        if not m: continue
        t = m.group(2)
        out.append((m.group(1), t))
    return out
def norm(t, full):
    t = re.sub(r"^@!?U?P[T0-9]+\s+", "", t)
    if not full:
        return t.split()[0]
    t = re.sub(r"\bU?R\d+\b", "R", t); t = re.sub(r"\bU?P\d\b", "P", t)
    return t
a, b = load(sys.argv[1]), load(sys.argv[2])
full = len(sys.argv) > 3
na = [norm(t, full) for _, t in a]; nb = [norm(t, full) for _, t in b]
sm = difflib.SequenceMatcher(None, na, nb, autojunk=False)
ca, cb = collections.Counter(x.split()[0] for x in na), collections.Counter(x.split()[0] for x in nb)
print("opcode count diff (b - a):", {k: cb[k]-ca[k] for k in sorted(set(ca)|set(cb)) if cb[k]!=ca[k]})
for tag, i1, i2, j1, j2 in sm.get_opcodes():
    if tag == "equal": continue
    print(f"--- {tag} a[{i1}:{i2}] b[{j1}:{j2}]")
    for k in range(i1, i2): print("  - ", a[k][0], a[k][1])
    for k in range(j1, j2): print("  + ", b[k][0], b[k][1])
