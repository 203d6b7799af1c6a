import sys
from cuteattn.plan import Problem, plan_backward
from cuteattn.arch import arch_from_name
from cuteattn.runtime.compile import compile_backward
d = int(sys.argv[1]); varlen = sys.argv[2] == "varlen"; causal = len(sys.argv) > 3 and sys.argv[3] == "causal"
heads = 16 if d == 128 else 32
p = Problem(batch=8, seqlen_q=4096, seqlen_k=4096, heads_q=heads, heads_kv=heads, head_dim=d, head_dim_v=d,
            dtype="bf16", causal=causal, arch=arch_from_name("sm_90a"), varlen=varlen)
plan = plan_backward(p)
print(plan)
compile_backward(plan)
