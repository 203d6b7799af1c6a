import sys
from cuteattn.plan import Problem, plan_backward
from cuteattn.arch import arch_from_name
from cuteattn.runtime.compile import compile_backward
cases = [  # (dim, causal, deterministic, seqused_k, window)
    (64, False, False, False, None), (64, True, True, False, None), (96, True, False, True, None),
    (128, True, True, True, None), (128, False, False, False, (256, 0)), (256, False, False, False, None),
    (192, True, False, False, None),
]
for d, causal, det, used, window in cases:
    p = Problem(batch=5, seqlen_q=1000, seqlen_k=3000, heads_q=8, heads_kv=2, head_dim=d, head_dim_v=d,
                dtype="bf16", causal=causal, arch=arch_from_name("sm_90a"), varlen=True, seqused_k=used,
                window=window, deterministic=det)
    plan = plan_backward(p)
    compile_backward(plan)
    print("ok", d, causal, det, used, window, flush=True)
