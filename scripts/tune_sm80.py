"""Time candidate sm80 tilings against SDPA-flash on the same inputs (GPU only).

    python scripts/tune_sm80.py --dims 64,256 --seqlens 1024,4096 --causal both

Each candidate (tile_m, tile_n, threads) is compiled as its own KernelPlan and timed in
interleaved rounds with SDPA's FlashAttention-2; the table shows TFLOP/s (bench convention).
"""

import argparse
import itertools
import statistics

import torch

from cuteattn import ops
from cuteattn.bench.runner import Shape, attention_flops, time_call_ms
from cuteattn.kernels.sm80 import tiling
from cuteattn.plan import KernelPlan
from cuteattn.runtime.arch import device_arch

CANDIDATES = {
    64: [(128, 128, 128), (128, 64, 128), (64, 128, 128), (128, 128, 256), (64, 64, 128)],
    96: [(128, 64, 128), (64, 64, 128), (128, 64, 256)],
    128: [(128, 64, 128), (128, 128, 256), (64, 64, 128), (128, 64, 256)],
    192: [(128, 64, 256), (64, 64, 128), (128, 32, 256)],
    256: [(128, 64, 256), (64, 64, 128), (128, 32, 256), (64, 32, 128)],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="64,256")
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--causal", choices=("both", "true", "false"), default="both")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    arch = device_arch(torch.device("cuda"))
    causal_modes = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    dims = [int(d) for d in args.dims.split(",")]
    seqlens = [int(s) for s in args.seqlens.split(",")]
    for dim, seqlen, causal in itertools.product(dims, seqlens, causal_modes):
        batch, heads = max(1, 32768 // seqlen), 2048 // dim
        shape = Shape(dim=dim, seqlen=seqlen, causal=causal, batch=batch, heads=heads)
        q, k, v = (
            torch.randn(batch, seqlen, heads, dim, device="cuda", dtype=torch.bfloat16)
            for _ in range(3)
        )
        out = torch.empty_like(q)
        calls = {}
        for tile_m, tile_n, threads in CANDIDATES[dim]:
            if not tiling.can_implement(dim, tile_m, tile_n, threads, arch.smem_per_block):
                continue
            plan = KernelPlan(
                family="sm80", arch=arch.name, dtype="bf16", head_dim=dim, causal=causal,
                tile_m=tile_m, tile_n=tile_n, num_threads=threads,
            )
            calls[f"{tile_m}x{tile_n}/{threads}"] = (
                lambda plan=plan: ops.launch_forward(q, k, v, out, dim**-0.5, plan)
            )
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def sdpa():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        calls["sdpa-flash"] = sdpa
        for call in calls.values():
            for _ in range(3):
                call()
        times = {name: [] for name in calls}
        for r in range(args.rounds):
            names = list(calls)
            names = names[r % len(names):] + names[: r % len(names)]
            for name in names:
                times[name].append(time_call_ms(calls[name], args.iters))
        flops = attention_flops(shape)
        row = ", ".join(
            f"{name} {flops / statistics.median(t) / 1e9:.1f}" for name, t in times.items()
        )
        print(f"d{dim} s{seqlen} causal={causal}: {row}", flush=True)


if __name__ == "__main__":
    main()
