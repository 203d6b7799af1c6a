"""Compile checks (no GPU): every forward variant for sm_80, sm_90a and sm_120a, fake tensors.

The planner picks the tiling for each target, so this also compiles the 99 KB fallbacks.
"""

import itertools

import pytest

from cuteattn.plan import SUPPORTED_HEAD_DIMS, Problem, plan_forward
from cuteattn.arch import arch_from_name
from cuteattn.runtime.compile import compile_forward

pytestmark = pytest.mark.compile

TARGETS = ("sm_80", "sm_90a", "sm_120a")


@pytest.mark.parametrize(
    "arch,head_dim,causal,dtype",
    list(itertools.product(TARGETS, SUPPORTED_HEAD_DIMS, (False, True), ("bf16", "fp16"))),
)
def test_forward_compiles(arch, head_dim, causal, dtype):
    plan = plan_forward(
        Problem(
            batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1, head_dim=head_dim,
            head_dim_v=head_dim, dtype=dtype, causal=causal, arch=arch_from_name(arch),
        )
    )
    assert compile_forward(plan) is not None
