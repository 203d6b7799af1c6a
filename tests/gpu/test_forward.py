"""Forward matrix on the GPU against the fp32 reference (issue 2's acceptance matrix), run
through every kernel family that supports the GPU (the family override of api.forward)."""

import pytest
import torch

from cuteattn.plan import families

pytestmark = pytest.mark.gpu

# Every (family, head dim) the registry knows; families the GPU cannot run are skipped.
FAMILY_HEAD_DIMS = [(family.name, head_dim) for family in families() for head_dim in family.head_dims]
DTYPES = (torch.bfloat16, torch.float16)
SEQLENS = (
    (1, 1), (1, 239), (113, 203), (203, 113), (239, 1),
    (128, 128), (1000, 1000), (1023, 4097), (4096, 4096),
)
HEADS = ((8, 8), (8, 2), (8, 1))
BATCHES = (1, 3)


def _ids(value):
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return str(value)


def _poisoned_empty_pool(numel: int, device) -> int:
    """Leave a freed NaN block of exactly numel fp32 in torch's caching allocator.

    The kernel's lse buffer is allocated right after, so it reuses this block: an lse element
    the kernel fails to write stays NaN. Returns the block's address to confirm the reuse.
    """
    block = torch.full((numel,), float("nan"), dtype=torch.float32, device=device)
    ptr = block.data_ptr()
    del block
    return ptr


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("heads_q,heads_kv", HEADS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("family,head_dim", FAMILY_HEAD_DIMS, ids=lambda v: str(v))
def test_forward_matches_reference(
    family, head_dim, dtype, causal, seqlen_q, seqlen_k, heads_q, heads_kv, batch
):
    from cuteattn import api
    from cuteattn.plan import get_family
    from cuteattn.reference import attention
    from cuteattn.runtime.arch import device_arch
    from cuteattn.testing import assert_close_to_reference, poison_like

    if not get_family(family).supports(device_arch(torch.device("cuda"))):
        pytest.skip(f"family {family} does not run on this GPU")
    device = "cuda"
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device=device, dtype=dtype)
    out = poison_like(q)
    poison_ptr = _poisoned_empty_pool(batch * heads_q * seqlen_q, device)

    got, lse = api.forward(q, k, v, causal=causal, out=out, family=family)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    assert lse.data_ptr() == poison_ptr, "lse did not reuse the poisoned block"

    out_ref, lse_ref = attention(q, k, v, causal=causal)
    out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)

    empty_rows = torch.isinf(lse_ref)  # (batch, heads, seqlen_q)
    if empty_rows.any():
        assert torch.all(lse[empty_rows] == float("-inf"))
        assert torch.all(got.permute(0, 2, 1, 3)[empty_rows] == 0)


def _poisoned_block_like(shape, dtype, device) -> int:
    """Leave a freed NaN block of ``shape`` and ``dtype`` in torch's caching allocator (the
    next allocation of that size reuses it); returns its address."""
    block = torch.full(shape, float("nan"), dtype=dtype, device=device)
    ptr = block.data_ptr()
    del block
    return ptr


@pytest.mark.parametrize("heads_q,heads_kv", ((8, 8), (8, 1)))
@pytest.mark.parametrize("seqlen_q,seqlen_k", ((1, 239), (113, 203), (1000, 1000)))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("family", [family.name for family in families()])
def test_forward_without_lse_matches_reference(
    family, head_dim, causal, seqlen_q, seqlen_k, heads_q, heads_kv
):
    """A call that reads no lse (no return_lse, no grad, no out): the kernel writes none and
    out still matches; out is allocated inside the op, so it is poisoned through the
    allocator (a freed NaN block of its size, which the op's allocation reuses)."""
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, skip_unless_family_runs

    skip_unless_family_runs(family)
    q = torch.randn(2, seqlen_q, heads_q, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    poison_ptr = _poisoned_block_like(q.shape, q.dtype, "cuda")
    got, lse = api.forward(q, k, v, causal=causal, family=family, return_lse=False)
    torch.cuda.synchronize()
    assert lse is None
    assert got.data_ptr() == poison_ptr, "out did not reuse the poisoned block"
    out_ref, _ = attention(q, k, v, causal=causal)
    out_pt, _ = attention(q, k, v, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)


@pytest.mark.parametrize("feature", ("softcap", "window", "sink"))
@pytest.mark.parametrize("family", [family.name for family in families()])
def test_forward_without_lse_with_features(family, feature):
    """The no-LSE kernels with the score features that change the epilogue's neighbourhood:
    soft-capping, a local window, a learnable sink (its logit still joins the softmax)."""
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, skip_unless_family_runs

    skip_unless_family_runs(family)
    q = torch.randn(2, 113, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 203, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    options = {
        "softcap": dict(softcap=30.0),
        "window": dict(window_size=(64, 0)),
        "sink": dict(learnable_sink=torch.randn(8, device="cuda", dtype=torch.float32)),
    }[feature]
    poison_ptr = _poisoned_block_like(q.shape, q.dtype, "cuda")
    got, lse = api.forward(q, k, v, causal=True, family=family, return_lse=False, **options)
    torch.cuda.synchronize()
    assert lse is None and got.data_ptr() == poison_ptr
    out_ref, _ = attention(q, k, v, causal=True, **options)
    out_pt, _ = attention(q, k, v, causal=True, upcast=False, **options)
    assert_close_to_reference("out", got, out_ref, out_pt)


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("seqlen", (1050, 4160))
@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_forward_with_idle_warpgroups(head_dim, seqlen, causal):
    """Query tiles whose last consumer warpgroups hold no row (1050 and 4160 queries: 26 / 64
    rows in the last 128-row tile, 90 / 128 in the last 192-row one): those warpgroups skip the
    tile's GEMMs and keep the pipelines and the ping-pong turning (sm90 ``drain_tiles``), with
    several key tiles to drain. Against the fp32 reference, the planner's plan (sm90 on Hopper)."""
    from cuteattn import api
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, poison_like

    q = torch.randn(2, seqlen, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, seqlen, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = poison_like(q)
    got, lse = api.forward(q, k, v, causal=causal, out=out)
    torch.cuda.synchronize()
    out_ref, lse_ref = attention(q, k, v, causal=causal)
    out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)
