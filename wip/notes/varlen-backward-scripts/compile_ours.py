import sys, os
from cuteattn.arch import arch_from_name
from cuteattn.plan import Problem, plan_backward
from cuteattn.runtime.compile import compile_backward
dim, causal, varlen = int(sys.argv[1]), sys.argv[2] == "causal", sys.argv[3] == "varlen"
arch = arch_from_name("sm_90a")
p = Problem(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1, head_dim=dim, head_dim_v=dim,
            dtype="bf16", causal=causal, arch=arch, varlen=varlen)
plan = plan_backward(p)
print(plan)
compile_backward(plan)
