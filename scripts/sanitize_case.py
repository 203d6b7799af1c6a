"""Small launches for compute-sanitizer (memcheck / racecheck / synccheck) runs on the GPU.

    compute-sanitizer --tool racecheck python scripts/sanitize_case.py [--family sm90] [--backward] [--head-dim 256]

Runs seqlen 1000, dim 128 (or --head-dim), causal and not, through the planner's plan for the family and,
for sm90, its single-tile and persistent variants both. ``--backward`` runs the backward
instead (the planner's backward plan, plain and deterministic).
"""

import argparse
import dataclasses

import torch

from cuteattn import api
from cuteattn.arch import arch_from_name
from cuteattn.plan import Problem, plan_forward

parser = argparse.ArgumentParser()
parser.add_argument("--family", default=None, help="force a kernel family (default: planner)")
parser.add_argument("--backward", action="store_true", help="run the backward kernels")
parser.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
args = parser.parse_args()

arch = arch_from_name("sm_%d%d" % torch.cuda.get_device_capability())
for causal in (False, True):
    q = torch.randn(1, 1000, 2, args.head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1000, 2, args.head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    problem = Problem(
        batch=1, seqlen_q=1000, seqlen_k=1000, heads_q=2, heads_kv=2, head_dim=args.head_dim,
        head_dim_v=args.head_dim, dtype="bf16", causal=causal, arch=arch,
    )
    if args.backward:
        out, lse = api.forward(q, k, v, causal=causal)
        dout = torch.randn_like(out)
        for deterministic in (False, True):
            grads = api.backward(
                dout, q, k, v, out, lse, causal=causal, deterministic=deterministic,
                family=args.family,
            )
            torch.cuda.synchronize()
            finite = all(bool(torch.isfinite(g).all()) for g in grads)
            print(causal, "deterministic" if deterministic else "atomic", "finite:", finite)
        continue
    plan = plan_forward(problem, family=args.family)
    plans = [plan]
    if plan.option("persistent") is not None:
        flipped = dict(plan.options) | {"persistent": not plan.option("persistent")}
        if plan.option("persistent"):
            # Options only a persistent kernel takes (the tile counter, one Q stage).
            flipped.pop("dynamic", None)
            flipped.pop("q_stages", None)
        plans.append(dataclasses.replace(plan, options=tuple(sorted(flipped.items()))))
    for each in plans:
        out, _ = api.forward(q, k, v, causal=causal, plan=each)
        torch.cuda.synchronize()
        print(causal, dict(each.options), "finite:", bool(torch.isfinite(out).all()), flush=True)
