"""A few small forward launches for compute-sanitizer (memcheck / racecheck) runs on the GPU.

    compute-sanitizer --tool racecheck python scripts/sanitize_case.py
"""

import torch

import cuteattn

for head_dim, causal, (seqlen_q, seqlen_k) in (
    (64, True, (203, 113)),
    (128, False, (113, 203)),
    (256, True, (239, 1)),
):
    q = torch.randn(2, seqlen_q, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, seqlen_k, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = cuteattn.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    print(head_dim, causal, seqlen_q, seqlen_k, "finite:", bool(torch.isfinite(out).all()))
