"""The backward's host path through autograd, variant by variant, in one process (thirtieth
session: autograd.grad took 626-764 us of host time per d128 1k call, the cuteattn::backward
op 249-267 of it). Per variant: host us per call (GPU kept busy), a single synchronized call's
time and the bench's 10-call window (us per call), medians of 9:

  main            as on main
  direct impl     _attention_backward calls the backward's Python function, not the op
  + no zeros      ... and setup_context turns off materialized grads (no zero grad_lse)
  fa4             FlashAttention-4, for reference

    python wip/notes/host_autograd_variants.py
"""

import statistics
import time

import torch

import cuteattn
from cuteattn import ops
from cuteattn.bench.runner import time_call_ms


def host_us(fn, calls: int = 20) -> float:
    samples = []
    for _ in range(9):
        torch.cuda._sleep(100_000_000)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def measure(label, call):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    host = host_us(call)
    single = statistics.median(time_call_ms(call, 1) * 1e3 for _ in range(9))
    window = statistics.median(time_call_ms(call, 10) * 1e3 for _ in range(9))
    print(f"  {label:<16}{host:10.1f}{single:10.1f}{window:10.1f}", flush=True)


def main() -> None:
    torch.manual_seed(0)
    op_backward = ops.backward
    for causal in (True, False):
        q, k, v = (torch.randn(32, 1024, 16, 128, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        dout = torch.randn_like(q)
        print(f"d128 1k causal={causal}: host / single / window-10 (us)")

        def bind():
            out = cuteattn.flash_attn_func(*leaves, causal=causal)
            return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)

        ops.backward = op_backward
        measure("main", bind())
        ops.backward = op_backward._init_fn
        measure("direct impl", bind())

        def setup_no_materialize(ctx, inputs, output):
            ops._attention_setup_context(ctx, inputs, output)
            ctx.set_materialize_grads(False)

        ops.attention.register_autograd(ops._attention_backward, setup_context=setup_no_materialize)
        measure("+ no zeros", bind())
        ops.attention.register_autograd(
            ops._attention_backward, setup_context=ops._attention_setup_context)
        ops.backward = op_backward
        try:
            from flash_attn.cute import flash_attn_func as fa4

            out4 = fa4(*leaves, causal=causal)
            out4 = out4[0] if isinstance(out4, tuple) else out4
            measure("fa4", lambda: torch.autograd.grad(out4, leaves, dout, retain_graph=True))
        except Exception as exc:  # noqa: BLE001 - a diagnostic: report and go on
            print(f"  fa4: {exc!r}")


if __name__ == "__main__":
    main()
