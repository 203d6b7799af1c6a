"""Every tiling the planner can choose on any architecture, run once on this GPU.

For each family, ``every_plan`` gives the plans it would pick on each known arch (sm_80's 163 KB
tiles, the 99 KB ones of sm_86/89/120, Hopper's), retargeted to this GPU; each runs through
``api.forward(plan=...)`` on a shape with partial tiles at both ends, against the reference.
"""

import pytest
import torch

from cuteattn.plan import families

pytestmark = pytest.mark.gpu

CASES = [
    (family.name, head_dim, causal, dtype)
    for family in families()
    for head_dim in family.head_dims
    for causal in (False, True)
    for dtype in ("bf16", "fp16")
]
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.mark.parametrize("family,head_dim,causal,dtype", CASES)
def test_every_tiling_runs(family, head_dim, causal, dtype):
    from cuteattn import api
    from cuteattn.plan import get_family
    from cuteattn.reference import attention
    from cuteattn.runtime.arch import device_arch
    from cuteattn.testing import assert_close_to_reference, poison_like

    arch = device_arch(torch.device("cuda"))
    descriptor = get_family(family)
    if not descriptor.supports(arch):
        pytest.skip(f"family {family} does not run on {arch.name}")
    plans = descriptor.every_plan(dtype=dtype, head_dim=head_dim, causal=causal, run_on=arch)
    assert plans, f"no plan of {family} for d{head_dim} runs on {arch.name}"

    torch_dtype = TORCH_DTYPES[dtype]
    for plan in plans:
        # A packed-GQA plan is compiled for one group size: give it that many heads per KV head.
        group = plan.option("pack_gqa", 1)
        q = torch.randn(2, 333, 2 * (group if group > 1 else 2), head_dim, device="cuda",
                        dtype=torch_dtype)
        k = torch.randn(2, 517, 2, head_dim, device="cuda", dtype=torch_dtype)
        v = torch.randn_like(k)
        out_ref, lse_ref = attention(q, k, v, causal=causal)
        out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
        out = poison_like(q)
        got, lse = api.forward(q, k, v, causal=causal, out=out, plan=plan)
        torch.cuda.synchronize()
        try:
            assert_close_to_reference("out", got, out_ref, out_pt)
            assert_close_to_reference("lse", lse, lse_ref, lse_pt)
        except AssertionError as exc:
            raise AssertionError(f"{plan}: {exc}") from None
