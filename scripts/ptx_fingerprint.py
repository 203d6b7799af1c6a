"""The PTX of chosen backward or forward kernels, compiled on this machine (no GPU), with an md5
per kernel and ptxas's register / spill line, so that two trees' kernels can be compared: run
it on each (PYTHONPATH=src of the tree) and diff the outputs. A kernel whose md5 matches one
that ran on the GPU is that kernel.

    CUTE_DSL_ARCH=sm_90a PYTHONPATH=src python scripts/ptx_fingerprint.py --out /tmp/ptx-a \\
        --kind backward --cases 128:causal:1024,96:dense:16384,128:dense:4096:det

A case is dim:causal|dense:seqlen[:det][:gqaHQxHKV] (batch 2, bf16, the planner's plan for
the problem; MHA with 4 heads unless gqa names the query and KV heads, e.g. gqa32x4; det:
deterministic=True, backward only). Each kernel's PTX is kept as
OUT/<case>.ptx. Needs ptxas on PATH for the register line.
"""

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile


def parse_case(text: str) -> tuple[int, bool, int, bool, int, int]:
    """(dim, causal, seqlen, deterministic, heads_q, heads_kv) of a case."""
    parts = text.split(":")
    extra = parts[3:]
    deterministic = "det" in extra
    gqa = [part for part in extra if part.startswith("gqa")]
    heads = (4, 4)
    try:
        if gqa:
            heads = tuple(int(n) for n in gqa[0].removeprefix("gqa").split("x"))
        valid = (
            len(parts) >= 3 and parts[1] in ("causal", "dense") and len(heads) == 2
            and len(extra) == deterministic + len(gqa) and len(gqa) <= 1
        )
        if valid:
            case = (int(parts[0]), parts[1] == "causal", int(parts[2]), deterministic, *heads)
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"a case is dim:causal|dense:seqlen[:det][:gqaHQxHKV], got {text!r}")
    return case


def ptxas_summary(ptx_path: str, arch: str) -> str:
    """ptxas's register and spill lines for one PTX file, or why there are none."""
    if shutil.which("ptxas") is None:
        return "(no ptxas on PATH)"
    run = subprocess.run(
        ["ptxas", f"-arch={arch}", "-v", ptx_path, "-o", os.devnull],
        capture_output=True, text=True,
    )
    lines = [
        line.split(":", 1)[-1].strip() for line in run.stderr.splitlines()
        if "registers" in line or "spill" in line or "arning" in line
    ]
    return "; ".join(lines) or f"(ptxas rc={run.returncode})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the PTX files")
    parser.add_argument("--kind", choices=("backward", "forward"), default="backward")
    parser.add_argument("--family", default="sm90")
    parser.add_argument(
        "--cases", required=True,
        help="comma-separated dim:causal|dense:seqlen[:det][:gqaHQxHKV]",
    )
    args = parser.parse_args(argv)
    cases = [parse_case(text) for text in args.cases.split(",")]
    arch_name = os.environ.get("CUTE_DSL_ARCH")
    if not arch_name:
        parser.error("set CUTE_DSL_ARCH (e.g. sm_90a): the target the DSL compiles for")
    if "cutlass" in sys.modules:
        parser.error("run it in a process of its own: the DSL reads its dump settings on import")
    os.makedirs(args.out, exist_ok=True)
    dump_dir = tempfile.mkdtemp(prefix="ptx-dump-")
    # Read by the DSL when it is imported: where to keep the PTX, and no kernels loaded from
    # its file cache (those leave no PTX).
    os.environ["CUTE_DSL_DUMP_DIR"] = dump_dir
    os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"

    import cuteattn.runtime.compile as compile_module
    from cuteattn.arch import arch_from_name
    from cuteattn.plan import Problem, plan_backward, plan_forward

    options = compile_module.compile_options
    compile_module.compile_options = lambda *a, **k: options(*a, **k) + " --keep-ptx"
    arch = arch_from_name(arch_name)
    for dim, causal, seqlen, deterministic, heads_q, heads_kv in cases:
        name = f"d{dim}-{'causal' if causal else 'dense'}-{seqlen}"
        name += "-det" if deterministic else ""
        name += f"-gqa{heads_q}x{heads_kv}" if (heads_q, heads_kv) != (4, 4) else ""
        for path in glob.glob(os.path.join(dump_dir, "**", "*"), recursive=True):
            if os.path.isfile(path):
                os.remove(path)
        problem = Problem(
            batch=2, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=heads_q, heads_kv=heads_kv,
            head_dim=dim,
            head_dim_v=dim, dtype="bf16", causal=causal, arch=arch, deterministic=deterministic,
        )
        if args.kind == "backward":
            plan = plan_backward(problem, family=args.family)
            compile_module.compile_backward(plan)
        else:
            plan = plan_forward(problem, family=args.family)
            compile_module.compile_forward(plan)
        ptx = sorted(glob.glob(os.path.join(dump_dir, "**", "*.ptx"), recursive=True))
        if not ptx:
            # The same plan as an earlier case: compiled once per process.
            print(f"{name}: {plan.options} (compiled above: same plan)")
            continue
        digest = hashlib.md5(b"".join(open(path, "rb").read() for path in ptx)).hexdigest()
        kept = os.path.join(args.out, name + ".ptx")
        shutil.copy(ptx[-1], kept)
        summary = ptxas_summary(kept, arch_name)
        print(f"{name}: {plan.options} md5 {digest} | {summary}", flush=True)
    shutil.rmtree(dump_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
