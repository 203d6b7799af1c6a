"""Where cuteattn's backward spends host time (thirtieth session; host_latency_diag.py found
453 us per d128 causal 1k call against FA4's 291). Host us per call with the GPU kept busy
(torch.cuda._sleep), medians of 9 x 20 calls, for nested entry points and each launch alone:

    python wip/notes/host_breakdown.py
"""

import statistics
import time

import torch

import cuteattn
from cuteattn import ops

CALLS = 20


def host_us(fn) -> float:
    samples = []
    for _ in range(9):
        torch.cuda._sleep(100_000_000)
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    torch.manual_seed(0)
    for causal in (True, False):
        q, k, v = (torch.randn(32, 1024, 16, 128, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out = cuteattn.flash_attn_func(*leaves, causal=causal)
        dout = torch.randn_like(out)
        out_d, lse = ops.attention(q, k, v, q.shape[-1] ** -0.5, causal, -1, -1, 0.0, None,
                                   None, False)
        scale = q.shape[-1] ** -0.5
        problem = ops.forward_problem(q, k, v, causal=causal)
        plan = ops.plan_backward(problem)
        impl = ops.backward._init_fn
        rows = {}
        rows["autograd.grad"] = host_us(
            lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
        rows["ops.backward (op)"] = host_us(
            lambda: ops.backward(dout, q, k, v, out_d, lse, scale, causal, -1, -1, 0.0, None,
                                 False))
        rows["backward impl"] = host_us(
            lambda: impl(dout, q, k, v, out_d, lse, scale, causal, -1, -1, 0.0, None, False))
        rows["launch_backward"] = host_us(
            lambda: ops.launch_backward(dout, q, k, v, out_d, lse, scale, plan))
        rows["plan (problem + plan)"] = host_us(
            lambda: ops.plan_backward(ops.forward_problem(q, k, v, causal=causal)))
        family = ops.get_family(plan.family)
        rows_m = -(-1024 // plan.tile_m) * plan.tile_m
        chunks = family.dq_accum_chunks(plan)
        rows["zeros dq_accum"] = host_us(
            lambda: ops.new_dq_accum(q, rows_m, *chunks, head_dim=plan.head_dim))
        rows["empty dq_accum"] = host_us(
            lambda: ops.new_dq_accum(q, rows_m, *chunks, head_dim=plan.head_dim, zeroed=False))
        rows["torch.full (32,16,16)"] = host_us(
            lambda: torch.full((32, 16, 16), 0, dtype=torch.int32, device="cuda"))
        rows["torch.empty x1"] = host_us(lambda: torch.empty(32, 16, 1024, device="cuda"))
        rows["torch.cuda.device ctx"] = host_us(lambda: torch.cuda.device(q.device).__enter__())
        dpsum = torch.empty(32, 16, rows_m, device="cuda")
        lse_log2 = torch.empty_like(dpsum)
        dq_accum = ops.new_dq_accum(q, rows_m, *chunks, head_dim=plan.head_dim)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        kernel = ops.compile_backward(plan)
        pre = ops.compile_backward_preprocess(plan.arch, plan.dtype, 128)
        rows["compile_backward lookup"] = host_us(lambda: ops.compile_backward(plan))
        rows["preprocess launch"] = host_us(
            lambda: pre(out_d, dout, lse, lse_log2, dpsum, None, 0))
        rows["main kernel launch"] = host_us(
            lambda: kernel(q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv, None, None, None,
                           None, 0, scale))
        rows["dq_from_accum"] = host_us(lambda: ops.dq_from_accum(dq_accum, scale, q, plan))
        print(f"d128 1k causal={causal} plan={plan}")
        for label, us in rows.items():
            print(f"  {label:<28}{us:9.1f} us")


if __name__ == "__main__":
    main()
