"""The sm90 forward's persistent kernels that keep O in Q's buffer (d192 / d256: no room for
an O buffer of its own; ``tiling.separate_o_fits``): the consumers hold Q's stage through the
epilogue and release it once O's store has read the buffer, and a query tile with no key loads
its Q anyway. More work tiles than SMs, so each CTA runs several; causal with seqlen_q >
seqlen_k gives tiles with no key; fixed-length (TMA store) and packed (row stores) batches,
against the fp32 reference, out and lse poisoned first."""

import dataclasses

import pytest
import torch

from cuteattn.testing import skip_unless_family_runs

pytestmark = pytest.mark.gpu


def _persistent(plan):
    from cuteattn.arch import arch_from_name
    from cuteattn.kernels.sm90 import tiling

    options = tuple((name, True if name == "persistent" else value) for name, value in plan.options)
    plan = dataclasses.replace(plan, options=options)
    assert not tiling.separate_o_fits(
        plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages,
        arch_from_name(plan.arch).smem_per_block,
    ), plan
    return plan


CASES = [
    (head_dim, dtype, causal, (-1, -1))
    for head_dim in (192, 256)
    for dtype in (torch.bfloat16, torch.float16)
    for causal in (False, True)
] + [(256, torch.bfloat16, True, (300, 0)), (192, torch.float16, False, (100, 50))]


@pytest.mark.parametrize("head_dim,dtype,causal,window", CASES, ids=str)
def test_persistent_fixed_length_with_o_in_q_buffer(head_dim, dtype, causal, window):
    from cuteattn import api, ops
    from cuteattn.plan import plan_forward
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    skip_unless_family_runs("sm90")
    # 3 x 8 heads x 12 query tiles: 288 work tiles; causal: the first 800 rows see no key.
    q = torch.randn(3, 1500, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(3, 700, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    problem = ops.forward_problem(
        q, k, v, causal=causal, window_left=window[0], window_right=window[1]
    )
    plan = _persistent(plan_forward(problem, family="sm90"))
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


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (192, 256))
def test_persistent_packed_batch_with_o_in_q_buffer(head_dim, causal):
    from cuteattn import ops
    from cuteattn.plan import plan_forward
    from cuteattn.testing import assert_attention_close

    skip_unless_family_runs("sm90")
    lengths_q = [0, 1, 1300, 257, 2100, 640, 999, 128]
    lengths_k = [3, 0, 700, 257, 2500, 100, 999, 1]
    cu_q, cu_k = (
        torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        for n in (lengths_q, lengths_k)
    )
    q = torch.randn(sum(lengths_q), 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.full_like(q, float("nan"))
    problem = ops.varlen_problem(
        q, k, v, cu_q, max(lengths_q), max(lengths_k), causal=causal, window_left=-1,
        window_right=-1, softcap=0.0, sink=False, seqused_k=False,
    )
    plan = _persistent(plan_forward(problem, family="sm90"))
    bookkeeping = (cu_q, cu_k, None, max(lengths_q))
    lse = ops.launch_forward(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), out.unsqueeze(0),
        head_dim ** -0.5, plan, None, bookkeeping,
    ).squeeze(0)
    torch.cuda.synchronize()
    assert_attention_close(out, lse, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal)
