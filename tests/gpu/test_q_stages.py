"""The sm90 forward's persistent kernels with an O buffer of their own (d64 / d96 / d128): two
Q stages (``tiling.separate_o_q_stages``), the producer loading the next work tile's Q while
the current one runs, the consumers taking the stage of their tile. Enough work tiles that
each CTA reuses both stages many times (more than 3 x 132), tiles with no key (causal,
seqlen_q > seqlen_k) and idle warpgroups (seqlen_q no multiple of the tile) between keyed ones,
a window, packed GQA and a packed batch; against the fp32 reference, out and lse poisoned
first, the same bits on a second call."""

import dataclasses

import pytest
import torch

from cuteattn.plan import get_family
from cuteattn.testing import check_packed_batch_plan, skip_unless_family_runs

pytestmark = pytest.mark.gpu


def _two_q_stages(plan, pack_gqa: int = 1):
    """The plan made persistent (and packed with ``pack_gqa`` > 1); checks that it runs with
    two Q stages."""
    from cuteattn.arch import arch_from_name
    from cuteattn.kernels.sm90 import tiling

    def option(name, value):
        if name == "persistent":
            return True
        return pack_gqa if name == "pack_gqa" and pack_gqa > 1 else value

    # Without ("q_stages", 1), with which the planner keeps one stage (d128 dense).
    plan = dataclasses.replace(plan, options=tuple(
        (name, option(name, value)) for name, value in plan.options if name != "q_stages"
    ))
    arch = arch_from_name(plan.arch)
    assert get_family("sm90").can_implement(plan, arch), plan
    assert tiling.separate_o_q_stages(
        plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages, arch.smem_per_block
    ) == 2, plan
    return plan


def _check(q, k, v, plan, causal, window):
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    mask = dict(causal=causal, window_size=window)
    got, lse = api.forward(q, k, v, out=poison_like(q), plan=plan, **mask)
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, **mask)
    out_pt, lse_pt = attention(q, k, v, upcast=False, **mask)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)
    again, _ = api.forward(q, k, v, out=poison_like(q), plan=plan, **mask)
    assert torch.equal(again, got)


CASES = [
    (head_dim, dtype, causal, (-1, -1))
    for head_dim in (64, 96, 128)
    for dtype in (torch.bfloat16, torch.float16)
    for causal in (False, True)
] + [(128, torch.bfloat16, True, (300, 0)), (64, torch.float16, False, (100, 50))]


@pytest.mark.parametrize("head_dim,dtype,causal,window", CASES, ids=str)
def test_two_q_stages_fixed_length(head_dim, dtype, causal, window):
    from cuteattn import ops
    from cuteattn.plan import plan_forward

    skip_unless_family_runs("sm90")
    # 4 x 8 heads x 12-16 query tiles (1500 rows: the last tile's second warpgroup idle at
    # 128 rows): 384-512 work tiles; causal: the first 800 rows see no key.
    q = torch.randn(4, 1500, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(4, 700, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    problem = ops.forward_problem(
        q, k, v, causal=causal, window_left=window[0], window_right=window[1]
    )
    _check(q, k, v, _two_q_stages(plan_forward(problem, family="sm90")), causal, window)


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (64, 128))
def test_two_q_stages_packed_gqa(head_dim, causal):
    """The 4 query heads of a KV head in one tile's rows: Q's packed TMA box into each stage."""
    from cuteattn import ops
    from cuteattn.plan import plan_forward

    skip_unless_family_runs("sm90")
    q = torch.randn(16, 100, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(16, 700, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    problem = ops.forward_problem(q, k, v, causal=causal, window_left=-1, window_right=-1)
    plan = _two_q_stages(plan_forward(problem, family="sm90"), pack_gqa=4)
    _check(q, k, v, plan, causal, (-1, -1))


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (64, 128))
def test_two_q_stages_packed_batch(head_dim, causal):
    """Persistent varlen (the planner's for d64 and d128 dense; causal made persistent here):
    sequences without keys, without queries and of one row among long ones."""
    skip_unless_family_runs("sm90")
    check_packed_batch_plan(head_dim, causal, _two_q_stages, repeat=3)
