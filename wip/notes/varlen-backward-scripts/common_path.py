"""The loop body's common path (branches listed as taken are skipped), opcode sequence."""
import re, sys, difflib
sys.path.insert(0, "/tmp/analysis_varlen/scripts")
from sass_loops import parse, opcode
def path(f, lo, hi, skips):
    ins, labels = parse(f)
    out = []
    skip_until = None
    for a, t in ins:
        if not (lo <= a <= hi): continue
        if skip_until is not None and a < skip_until: continue
        skip_until = None
        out.append((a, t))
        if a in skips:
            m = re.search(r"`\((\.L_x_\d+)\)", t)
            skip_until = labels[m.group(1)]
    return out
def norm(t):
    t = re.sub(r"R\d+", "R", t); t = re.sub(r"UR\d+", "UR", t); t = re.sub(r"P\d", "P", t)
    t = re.sub(r"0x[0-9a-f]+", "#", t); t = re.sub(r"\.L_x_\d+", "L", t)
    return t
if __name__ == "__main__":
    a = path(sys.argv[1], int(sys.argv[2],16), int(sys.argv[3],16), {int(x,16) for x in sys.argv[4].split(",")})
    b = path(sys.argv[5], int(sys.argv[6],16), int(sys.argv[7],16), {int(x,16) for x in sys.argv[8].split(",")})
    print(len(a), len(b))
    sa = [norm(t) for _, t in a]; sb = [norm(t) for _, t in b]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, sa, sb, autojunk=False).get_opcodes():
        if tag == "equal": continue
        print(tag, [t for _, t in a[i1:i2]][:12], "=>", [t for _, t in b[j1:j2]][:12])
    # key op positions
    for name, p in (("A", a), ("B", b)):
        ops = [opcode(t) for _, t in p]
        first_wait = [i for i, (_, t) in enumerate(p) if "DEPBAR" in t]
        ex2 = [i for i, o in enumerate(ops) if o.startswith("MUFU.EX2")]
        print(name, "DEPBAR at", first_wait, "EX2 range", (ex2[0], ex2[-1]) if ex2 else None, "HGMMA idx", [i for i,o in enumerate(ops) if o.startswith("HGMMA")][:40:4])
