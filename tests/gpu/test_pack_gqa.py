"""Packed GQA in the sm90 family: the query heads of a KV head share one tile's rows.

Every case forces a packed plan (``pack_gqa`` = query heads per KV head, the planner's tiles
for the head dim, single-tile and persistent) and compares out and lse with the fp32
reference: groups that divide the tile and groups that leave idle rows (3, 7), the causal
diagonal at positions i // group with seqlen_q below, equal to and above seqlen_k, batch and
KV heads > 1, q and out read through strided views. The planner's own packing (short queries)
runs through tests/gpu/test_forward.py's (8, 2) and (8, 1) heads.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

SEQLENS = [(1, 239), (7, 1000), (113, 203), (200, 200), (333, 128)]


def _packed_plans(head_dim, causal, heads_q, heads_kv, seqlen_q):
    from cuteattn.plan import Problem, get_family, plan_forward
    from cuteattn.runtime.arch import device_arch

    arch = device_arch(torch.device("cuda"))
    family = get_family("sm90")
    if not family.supports(arch):
        pytest.skip("the sm90 family does not run on this GPU")
    chosen = plan_forward(
        Problem(
            batch=1, seqlen_q=seqlen_q, seqlen_k=seqlen_q, heads_q=heads_q, heads_kv=heads_kv,
            head_dim=head_dim, head_dim_v=head_dim, dtype="bf16", causal=causal, arch=arch,
        ),
        family="sm90",
    )
    plans = [
        family.plan(
            arch, dtype="bf16", head_dim=head_dim, causal=causal, tile_m=chosen.tile_m,
            tile_n=chosen.tile_n, num_stages=chosen.num_stages, persistent=persistent,
            pack_gqa=heads_q // heads_kv,
        )
        for persistent in (False, True)
    ]
    return [p for p in plans if family.can_implement(p, arch)]


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS, ids=str)
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
@pytest.mark.parametrize("group", (2, 3, 4, 7, 8))
@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_packed_gqa_matches_reference(head_dim, group, causal, seqlen_q, seqlen_k):
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    heads_kv = 2
    heads_q = group * heads_kv
    plans = _packed_plans(head_dim, causal, heads_q, heads_kv, seqlen_q)
    assert plans
    # q as a view with a head stride of dim and a sequence stride past heads_q * dim.
    q = torch.randn(2, seqlen_q, heads_q + 3, head_dim, **bf16)[:, :, 3:]
    k = torch.randn(2, seqlen_k, heads_kv, head_dim, **bf16)
    v = torch.randn_like(k)
    out_ref, lse_ref = attention(q, k, v, causal=causal)
    out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
    for plan in plans:
        out_buffer = poison_like(torch.empty(2, seqlen_q, heads_q + 1, head_dim, **bf16))
        out = out_buffer[:, :, 1:]
        got, lse = api.forward(q, k, v, causal=causal, out=out, plan=plan)
        torch.cuda.synchronize()
        try:
            assert got.data_ptr() == out.data_ptr()
            assert_close_to_reference("out", got, out_ref, out_pt)
            assert_close_to_reference("lse", lse, lse_ref, lse_pt)
        except AssertionError as exc:
            raise AssertionError(f"{plan}: {exc}") from None
        assert torch.isnan(out_buffer[:, :, 0]).all(), f"{plan}: wrote outside out's view"
