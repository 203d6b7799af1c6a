"""The backward preprocess alone, us per call (CUDA events over 50 calls, median of 5), at
issue 6's d128 row sizes (32 x 1k x 16 heads, 8 x 4k, 2 x 16k): compare trees by running it in
each (thirtieth session: wip/bwd-preprocess-loads-first.diff).

    python wip/notes/preprocess_time.py
"""

import statistics

import torch

from cuteattn.runtime.arch import device_arch
from cuteattn.runtime.compile import compile_backward_preprocess


def main() -> None:
    arch = device_arch(torch.device("cuda")).name
    for batch, seqlen, heads, dim in ((32, 1024, 16, 128), (8, 4096, 16, 128), (2, 16384, 16, 128),
                                      (32, 1024, 32, 64)):
        out = torch.randn(batch, seqlen, heads, dim, device="cuda", dtype=torch.bfloat16)
        dout = torch.randn_like(out)
        lse = torch.randn(batch, heads, seqlen, device="cuda")
        lse_log2 = torch.empty(batch, heads, seqlen, device="cuda")
        dpsum = torch.empty_like(lse_log2)
        kernel = compile_backward_preprocess(arch, "bf16", dim)
        samples = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                kernel(out, dout, lse, lse_log2, dpsum, None, 0)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 50 * 1e3)
        want = (dout.float() * out.float()).sum(-1).transpose(1, 2)
        err = (dpsum - want).abs().max().item()
        gbytes = 2 * out.numel() * 2 / 1e9
        us = statistics.median(samples)
        print(f"b{batch} s{seqlen} h{heads} d{dim}: {us:7.1f} us  {gbytes / us * 1e3:5.2f} TB/s"
              f"  max |dpsum - ref| {err:.2e}")


if __name__ == "__main__":
    main()
