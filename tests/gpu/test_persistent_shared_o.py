"""The sm90 forward's persistent kernels without an O buffer of their own (d192 / d256: no room;
``tiling.separate_o_fits``). O in V's stages where they hold it (the planner's tiles,
``tiling.o_in_v_fits``): the next tile's first V load waits until O's store has read them;
else (d256 with one stage of 112 keys here) O in Q's buffer: the consumers hold Q's stage
through the epilogue and release it once O's store has read it. Either way a query tile with
no key loads its Q anyway. More work tiles than SMs, so each CTA runs several; causal with
seqlen_q > seqlen_k gives tiles with no key; fixed-length and packed (ragged TMA views)
batches, against the fp32 reference, out and lse poisoned first."""

import dataclasses

import pytest
import torch

from cuteattn.plan import get_family
from cuteattn.testing import check_packed_batch_plan, skip_unless_family_runs

pytestmark = pytest.mark.gpu


def _persistent(plan, o_buffer: str):
    """The plan made persistent; ``o_buffer`` "v": as planned (O in V's stages), "q": one
    stage of 112 keys (d256: O in Q's buffer, V's stage too small)."""
    from cuteattn.arch import arch_from_name
    from cuteattn.kernels.sm90 import tiling

    options = tuple((name, True if name == "persistent" else value) for name, value in plan.options)
    plan = dataclasses.replace(plan, options=options)
    if o_buffer == "q":
        plan = dataclasses.replace(plan, tile_n=112, num_stages=1)
    arch = arch_from_name(plan.arch)
    assert get_family("sm90").can_implement(plan, arch), plan
    assert not tiling.separate_o_fits(
        plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages, arch.smem_per_block
    ), plan
    assert tiling.o_in_v_fits(plan.tile_m, plan.tile_n, plan.num_stages) == (o_buffer == "v")
    return plan


CASES = [
    (head_dim, dtype, causal, (-1, -1), "v")
    for head_dim in (192, 256)
    for dtype in (torch.bfloat16, torch.float16)
    for causal in (False, True)
] + [
    (256, torch.bfloat16, True, (300, 0), "v"), (192, torch.float16, False, (100, 50), "v"),
    (256, torch.bfloat16, True, (-1, -1), "q"), (256, torch.float16, False, (-1, -1), "q"),
    (256, torch.float16, False, (300, 0), "q"),
]


@pytest.mark.parametrize("head_dim,dtype,causal,window,o_buffer", CASES, ids=str)
def test_persistent_fixed_length_without_an_o_buffer(head_dim, dtype, causal, window, o_buffer):
    from cuteattn import ops
    from cuteattn.plan import plan_forward

    skip_unless_family_runs("sm90")
    # 3 x 8 heads x 12 query tiles: 288 work tiles; causal: the first 800 rows see no key.
    q = torch.randn(3, 1500, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(3, 700, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    problem = ops.forward_problem(
        q, k, v, causal=causal, window_left=window[0], window_right=window[1]
    )
    plan = _persistent(plan_forward(problem, family="sm90"), o_buffer)
    _check_against_reference(q, k, v, plan, causal, window)


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (192, 256))
def test_persistent_packed_gqa_with_o_in_v(head_dim, causal):
    """Packed GQA (the 4 query heads of a KV head stacked in one tile's rows): O's TMA store
    out of V's stages, through the packed view."""
    from cuteattn import ops
    from cuteattn.arch import arch_from_name
    from cuteattn.plan import plan_forward

    skip_unless_family_runs("sm90")
    q = torch.randn(4, 100, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 700, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    problem = ops.forward_problem(q, k, v, causal=causal, window_left=-1, window_right=-1)
    plan = _persistent(plan_forward(problem, family="sm90"), "v")
    options = tuple((name, 4 if name == "pack_gqa" else value) for name, value in plan.options)
    plan = dataclasses.replace(plan, options=options)
    assert get_family("sm90").can_implement(plan, arch_from_name(plan.arch)), plan
    _check_against_reference(q, k, v, plan, causal, (-1, -1))


def _check_against_reference(q, k, v, plan, causal, window):
    """out and lse of ``plan`` against the fp32 reference (poisoned first), and the same bits
    on a second call."""
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    mask = dict(causal=causal, window_size=window)
    out = poison_like(q)
    got, lse = api.forward(q, k, v, out=out, plan=plan, **mask)
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, **mask)
    out_pt, lse_pt = attention(q, k, v, upcast=False, **mask)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)
    # Every call the same bits (a race on the shared buffer would not be).
    again, _ = api.forward(q, k, v, out=poison_like(q), plan=plan, **mask)
    assert torch.equal(again, got)


@pytest.mark.parametrize(
    "head_dim,causal,o_buffer",
    [(192, False, "v"), (192, True, "v"), (256, False, "v"), (256, True, "v"), (256, True, "q")],
)
def test_persistent_packed_batch_without_an_o_buffer(head_dim, causal, o_buffer):
    skip_unless_family_runs("sm90")
    check_packed_batch_plan(head_dim, causal, lambda plan: _persistent(plan, o_buffer))
