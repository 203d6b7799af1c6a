"""Parse nvdisasm -c -gi output: instructions with source (file:line), labels, blocks, loops."""
import re, sys, collections
INS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LOC = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
LAB = re.compile(r"^(\.L_x_\d+):")

def short(f):
    return f.split("/src/cuteattn/")[-1].split("/site-packages/")[-1] if f else "?"

def parse(path):
    ins, labels = [], {}
    loc = ("?", 0); pending = []
    for line in open(path):
        m = LOC.search(line)
        if m:
            if m.group(3) and "cuteattn" in m.group(3) and "cuteattn" not in m.group(1):
                # inlined from the DSL library: keep the innermost cuteattn frame too
                loc = (short(m.group(1)) + ":" + m.group(2), short(m.group(3)) + ":" + m.group(4))
            else:
                loc = (short(m.group(1)) + ":" + m.group(2), None)
            continue
        m = LAB.match(line)
        if m:
            pending.append(m.group(1)); continue
        m = INS.match(line)
        if m:
            a = int(m.group(1), 16)
            for l in pending: labels[l] = a
            pending = []
            ins.append(dict(a=a, t=m.group(2), loc=loc))
    return ins, labels

def opcode(t):
    t = re.sub(r"^@!?U?P[T0-9]+\s+", "", t)
    return t.split()[0] if t.split() else t

def opbase(t):
    return opcode(t).split(".")[0]

def target(t, labels):
    m = re.search(r"`\((\.L_x_\d+)\)", t)
    return labels.get(m.group(1)) if m else None

def loops(ins, labels):
    """(head, tail) of each backward branch."""
    out = []
    for i in ins:
        if opbase(i["t"]) in ("BRA",):
            tg = target(i["t"], labels)
            if tg is not None and tg <= i["a"]:
                out.append((tg, i["a"]))
    return out

if __name__ == "__main__":
    ins, labels = parse(sys.argv[1])
    print(len(ins), "instructions")
    for h, t in loops(ins, labels):
        body = [i for i in ins if h <= i["a"] <= t]
        ops = collections.Counter(opbase(i["t"]) for i in body)
        key = [k for k in ("HGMMA", "UTMALDG", "UBLKCP", "UBLKRED", "UTMASTG", "SYNCS", "SHFL", "LDG") if ops.get(k)]
        print(f"loop {h:#06x}-{t:#06x}: {len(body)} instr; {key}")
