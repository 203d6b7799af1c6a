"""Host time of one cuteattn call (GPU only): how long the Python side takes to queue a
forward, and where it goes (cProfile), so that the launch gaps of short rows have a number.

    python scripts/host_profile.py [--dim 64] [--seqlen 128] [--calls 500]
"""

import argparse
import cProfile
import pstats
import time

import torch

import cuteattn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seqlen", type=int, default=128)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    q, k, v = (
        torch.randn(2, args.seqlen, 8, args.dim, device="cuda", dtype=torch.bfloat16)
        for _ in range(3)
    )
    backends = {"cuteattn": lambda causal: cuteattn.flash_attn_func(q, k, v, causal=causal)}
    try:
        from flash_attn.cute import flash_attn_func as fa4

        backends["fa4"] = lambda causal: fa4(q, k, v, causal=causal)
    except ImportError:
        pass
    sdpa_q, sdpa_k, sdpa_v = (x.transpose(1, 2) for x in (q, k, v))
    backends["sdpa"] = lambda causal: torch.nn.functional.scaled_dot_product_attention(
        sdpa_q, sdpa_k, sdpa_v, is_causal=causal
    )
    with torch.no_grad():
        for name, call in backends.items():
            for causal in (False, True):
                for _ in range(20):
                    call(causal)
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.calls):
                    call(causal)
                host = (time.perf_counter() - start) / args.calls
                torch.cuda.synchronize()
                print(f"{name:9s} causal={causal!s:5s} host {host * 1e6:7.1f} us per call")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            backends["cuteattn"](True)
        profile.disable()
        torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
