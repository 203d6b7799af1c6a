import re, sys, collections
INS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LAB = re.compile(r"^(\.L_x_\d+):")
def parse(path):
    ins = []; labels = {}
    pending = []
    for line in open(path):
        m = LAB.match(line.strip())
        if m:
            pending.append(m.group(1)); continue
        m = INS.match(line)
        if m:
            addr = int(m.group(1), 16); text = m.group(2)
            for l in pending: labels[l] = addr
            pending = []
            ins.append((addr, text))
    return ins, labels
def opcode(text):
    t = re.sub(r"^@!?U?P\w+\s+", "", text)
    return t.split()[0]
def klass(op):
    base = op.split(".")[0]
    return base
def summarize(rng, ins):
    c = collections.Counter()
    for a, t in ins:
        if rng[0] <= a <= rng[1]:
            c[klass(opcode(t))] += 1
    return c
if __name__ == "__main__":
    path = sys.argv[1]
    ins, labels = parse(path)
    loops = []
    for a, t in ins:
        m = re.search(r"BRA\s+(?:U?!?U?P\w+,\s*)?`\((\.L_x_\d+)\)", t)
        if m and m.group(1) in labels and labels[m.group(1)] <= a:
            loops.append((labels[m.group(1)], a, t))
    print(f"{path}: {len(ins)} instructions")
    keys = ["HGMMA","WARPGROUP","MUFU","FFMA","FMUL","FADD","FSEL","FSETP","SHFL","LDS","STS","STSM","LDSM","BAR","SYNCS","UBLKCP","UBLKRED","UTMALDG","UTMASTG","LDG","STG","S2R","S2UR","LDC","ULDC","BRA","F2FP","ISETP","IMAD","IADD3","LOP3","R2UR","UIADD3","UIMAD","ULOP3","USEL","ISETP"]
    for lo, hi, t in loops:
        n = sum(1 for a, _ in ins if lo <= a <= hi)
        if n < 20: continue
        c = summarize((lo, hi), ins)
        print(f"loop {lo:#06x}-{hi:#06x}: {n} instr; " + ", ".join(f"{k}={c[k]}" for k in keys if c[k]))
