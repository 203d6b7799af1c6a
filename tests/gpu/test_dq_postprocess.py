"""The backward's dq postprocess kernel (``kernels/bwd_postprocess.py``) on the GPU against a
PyTorch reading of the accumulator: every layout the families use (chunks, padded rows, padded
head dims), fixed-length and packed batches, caller buffers of any strides. The accumulator's
padding and the rows past each sequence hold random values (the kernel must not read them); dq is
poisoned with NaN first."""

import pytest
import torch

from cuteattn import ops, validate
from cuteattn.runtime.arch import device_arch
from cuteattn.runtime.compile import compile_dq_postprocess

pytestmark = pytest.mark.gpu

# (kernel_dim, dim, chunks, row_pad): plain rows in one or more chunks, padded rows (the sm90
# wide backward's: d256's 4 chunks, d192's 3), padded head dims. (Fragment orders below.)
LAYOUTS = (
    (128, 128, 2, 8), (96, 96, 1, 8), (64, 40, 2, 8), (256, 256, 4, 8), (64, 64, 1, 0),
    (256, 200, 1, 0), (192, 192, 3, 8), (64, 8, 2, 8), (64, 16, 1, 0),
)


def _from_rows(block: torch.Tensor, dim: int) -> torch.Tensor:
    """(heads, chunks, rows, chunk_dim) accumulator rows -> (rows, heads, dim)."""
    return block.permute(2, 0, 1, 3).flatten(-2)[..., :dim]


@pytest.mark.parametrize("kernel_dim,dim,chunks,row_pad", LAYOUTS)
def test_fixed_length_postprocess(kernel_dim, dim, chunks, row_pad):
    batch, seqlen_q, heads, tile = 2, 130, 3, 64
    rows = -(-seqlen_q // tile) * tile
    chunk_dim = kernel_dim // chunks
    accum = torch.randn(batch, heads, chunks, rows, chunk_dim + row_pad, device="cuda")
    want = torch.stack(
        [_from_rows(accum[b, :, :, :seqlen_q, :chunk_dim], dim) for b in range(batch)]
    )
    dq = torch.full(
        (batch, seqlen_q, heads, dim), float("nan"), dtype=torch.bfloat16, device="cuda"
    )
    arch = device_arch(dq.device).name
    postprocess = compile_dq_postprocess(arch, "bf16", dim, kernel_dim, chunks, row_pad)
    postprocess(accum, dq, None, 0, 0.5, None, None, None)
    torch.cuda.synchronize()
    assert not dq.isnan().any()
    torch.testing.assert_close(dq.float(), (want * 0.5).bfloat16().float(), atol=0, rtol=0)


@pytest.mark.parametrize("strided", (False, True))
def test_dq_from_accum_into_a_caller_buffer(strided):
    """ops.dq_from_accum with the planner's plan: into a caller's dq of any strides (a view
    one element into its storage: not kernel-addressable, filled through a copy)."""
    from cuteattn.plan import Problem, get_family, plan_backward

    # The sm90 wide backward (d256) adds dq in padded rows; up to d128 both families add it in
    # fragment order (test_fragment_order_postprocess_* cover that): the accumulator below is
    # row-major.
    arch = device_arch(torch.device("cuda"))
    batch, seqlen_q, heads, dim = 2, 100, 4, 256 if arch.wgmma else 128
    q = torch.randn(batch, seqlen_q, heads, dim, device="cuda", dtype=torch.bfloat16)
    problem = Problem(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_q, heads_q=heads, heads_kv=heads,
        head_dim=dim, head_dim_v=dim, dtype="bf16", causal=False, arch=arch,
    )
    plan = plan_backward(problem)
    if get_family(plan.family).dq_accum_fragment_order(plan) is not None:
        pytest.skip("a row-major accumulator needs a family that adds dq in rows")
    chunks, row_pad = get_family(plan.family).dq_accum_chunks(plan)
    rows = -(-seqlen_q // plan.tile_m) * plan.tile_m
    accum = torch.randn(batch, heads, chunks, rows, dim // chunks + row_pad, device="cuda")
    want = torch.stack(
        [_from_rows(accum[b, :, :, :seqlen_q, : dim // chunks], dim) for b in range(batch)]
    )
    if strided:
        storage = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
        dq = storage[1:].view(batch, heads, seqlen_q, dim).transpose(1, 2)
        assert not validate.kernel_addressable(dq)
    else:
        dq = torch.empty_like(q)
    dq.fill_(float("nan"))
    assert ops.dq_from_accum(accum, 0.25, q, plan, dq=dq) is dq
    torch.cuda.synchronize()
    torch.testing.assert_close(dq.float(), (want * 0.25).bfloat16().float(), atol=0, rtol=0)


@pytest.mark.parametrize("kernel_dim,dim,chunks,row_pad", LAYOUTS)
@pytest.mark.parametrize("tile", (64, 128))
def test_packed_postprocess(kernel_dim, dim, chunks, row_pad, tile):
    """Varlen: each sequence's rows from its tile-aligned block (rows_tile = the main kernel's
    tile_m); empty and one-row sequences; the packed rows past the last sequence (more than one
    CTA's stride) get zeros."""
    heads = 3
    lengths = [70, 0, 1, 64, 129]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    total = sum(lengths) + 70
    rows = ops.padded_rows(total, len(lengths), tile)
    chunk_dim = kernel_dim // chunks
    accum = torch.randn(1, heads, chunks, rows, chunk_dim + row_pad, device="cuda")
    want = torch.zeros(total, heads, dim, device="cuda")
    starts = cu.tolist()
    for b, length in enumerate(lengths):
        start = (starts[b] + b * tile) // tile * tile
        want[starts[b]:starts[b] + length] = _from_rows(
            accum[0, :, :, start:start + length, :chunk_dim], dim
        )
    dq = torch.full((total, heads, dim), float("nan"), dtype=torch.bfloat16, device="cuda")
    postprocess = compile_dq_postprocess(
        device_arch(dq.device).name, "bf16", dim, kernel_dim, chunks, row_pad, tile
    )
    postprocess(accum, dq.unsqueeze(0), cu, max(lengths), 0.5, None, None, None)
    torch.cuda.synchronize()
    assert not dq.isnan().any()
    torch.testing.assert_close(dq.float(), (want * 0.5).bfloat16().float(), atol=0, rtol=0)
    assert torch.all(dq[-70:] == 0)


@pytest.mark.parametrize("dims", ((128, 128), (192, 128), (64, 64)), ids=str)
def test_packed_postprocess_zeroes_the_key_rows_past_the_last_sequence(dims):
    """With dk and dv given, the rows past cu_seqlens_k[-1] of every KV head become zeros and
    the sequences' rows (the main kernel's) are left as they are."""
    dim, dim_v = dims
    heads_q, heads_kv, tile = 4, 2, 64
    cu_q = torch.tensor([0, 5, 133], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 40, 300], dtype=torch.int32, device="cuda")
    total_q, total_k = 140, 300 + 77
    rows = ops.padded_rows(total_q, 2, tile)
    kernel_dim = 256 if dim > 128 else dim
    chunks, row_pad = (4, 8) if dim > 128 else (2, 8)
    accum = torch.randn(1, heads_q, chunks, rows, kernel_dim // chunks + row_pad, device="cuda")
    dq = torch.full((total_q, heads_q, dim), float("nan"), dtype=torch.bfloat16, device="cuda")
    dk = torch.randn(total_k, heads_kv, dim, device="cuda").bfloat16()
    dv = torch.randn(total_k, heads_kv, dim_v, device="cuda").bfloat16()
    dk_before, dv_before = dk.clone(), dv.clone()
    postprocess = compile_dq_postprocess(
        device_arch(dq.device).name, "bf16", dim, kernel_dim, chunks, row_pad, tile,
        zero_kv_dims=(dim, dim_v),
    )
    postprocess(accum, dq.unsqueeze(0), cu_q, 128, 1.0, dk.unsqueeze(0), dv.unsqueeze(0), cu_k)
    torch.cuda.synchronize()
    assert not dq.isnan().any() and torch.all(dq[133:] == 0)
    assert torch.equal(dk[:300], dk_before[:300]) and torch.equal(dv[:300], dv_before[:300])
    assert torch.all(dk[300:] == 0) and torch.all(dv[300:] == 0)


@pytest.mark.parametrize("family", ("sm90", "sm80"))
def test_varlen_gradients_from_recycled_memory(family):
    """The varlen backward allocates dk and dv without zeroing them (the kernel and the
    postprocess write every row): with the caching allocator's blocks full of NaN first, the
    gradients still match the reference, zeros past the last sequence included."""
    import cuteattn
    from cuteattn.testing import assert_grads_close, skip_unless_family_runs

    skip_unless_family_runs(family)
    lengths_q, lengths_k = [0, 1, 200, 77], [30, 0, 150, 129]
    cu_q = torch.tensor([0, 0, 1, 201, 278], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 30, 30, 180, 309], dtype=torch.int32, device="cuda")
    q = torch.randn(278 + 5, 4, 128, device="cuda", dtype=torch.bfloat16)  # 5 rows past
    k = torch.randn(309 + 9, 2, 128, device="cuda", dtype=torch.bfloat16)  # 9 rows past
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = cuteattn.flash_attn_varlen_func(
        *leaves, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True, family=family
    )
    # Blocks of the gradients' sizes, NaN-filled and freed: the allocator hands them out again.
    poison = [torch.full_like(x, float("nan")) for x in (q, k, v, k, v, q)]
    del poison
    out.backward(dout)
    torch.cuda.synchronize()
    kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    grads = [x.grad for x in leaves]
    assert all(not g.isnan().any() for g in grads)
    assert torch.all(grads[0][278:] == 0) and torch.all(grads[1][309:] == 0)
    assert torch.all(grads[2][309:] == 0)
    assert_grads_close(
        [grads[0][:278], grads[1][:309], grads[2][:309]], q[:278], k[:309], v[:309],
        dout[:278], **kwargs,
    )


# The backwards' fragment orders: (head_dim, kernel_dim, tile_m, dq_accum's chunks, the
# family's layout): sm80's (tile_m, threads, warps_dq); sm90's (tile_m): split by rows (d64
# 128-row tiles), by columns (d64 / d128 64-row tiles), by keys (d96), transposed (d128 80 rows).
FRAGMENT_LAYOUTS = (
    (64, 64, 128, 1, ("sm80", 128, 256, (4, 2))), (128, 128, 64, 1, ("sm80", 64, 256, (2, 4))),
    (256, 256, 64, 1, ("sm80", 64, 256, (2, 4))), (40, 64, 128, 1, ("sm80", 128, 256, (4, 2))),
    (96, 96, 64, 1, ("sm80", 64, 128, (2, 2))),
    (64, 64, 128, 1, ("sm90", 128)), (64, 64, 64, 2, ("sm90", 64)), (96, 96, 64, 1, ("sm90", 64)),
    (128, 128, 64, 2, ("sm90", 64)), (128, 128, 80, 2, ("sm90", 80)),
    (40, 64, 128, 1, ("sm90", 128)),
)


@pytest.mark.parametrize("dim,kernel_dim,tile,chunks,layout", FRAGMENT_LAYOUTS, ids=str)
@pytest.mark.parametrize("packed", (False, True))
def test_fragment_order_postprocess_permutes_each_query_tile(
    dim, kernel_dim, tile, chunks, layout, packed
):
    """dq_accum in fragment order (``kernels/sm80/dq_postprocess.py``,
    ``kernels/sm90/dq_postprocess.py``): each whole query tile of dq holds exactly its
    accumulator rows' values (every chunk's), scaled (a permutation: every value once, none from
    another tile; a padded head dim: a subset). The backward tests check the order against the
    MMA's (dq against the reference)."""
    arch = device_arch(torch.device("cuda"))
    if layout[0] == "sm90" and not arch.wgmma:
        pytest.skip("the sm90 backward's layout needs a Hopper GPU")
    heads = 2
    # Packed: the last sequence the shortest (the grid's tiles past it must not read past the
    # accumulator).
    lengths = [2 * tile, 0, tile, 3 * tile, tile // 2] if packed else [3 * tile] * 2
    chunk_dim = kernel_dim // chunks
    if packed:
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                          device="cuda")
        rows = ops.padded_rows(sum(lengths), len(lengths), tile)
        accum = torch.randn(1, heads, chunks, rows, chunk_dim, device="cuda")
    else:
        cu = None
        rows = lengths[0]
        accum = torch.randn(len(lengths), heads, chunks, rows, chunk_dim, device="cuda")
    dq_shape = (sum(lengths), heads, dim) if packed else (len(lengths), rows, heads, dim)
    dq = torch.full(dq_shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    postprocess = compile_dq_postprocess(
        arch.name, "bf16", dim, kernel_dim, chunks, 0, tile if packed else 0,
        fragment_order=layout,
    )
    target = dq.unsqueeze(0) if packed else dq
    postprocess(accum, target, cu, max(lengths), 1.0, None, None, None)
    torch.cuda.synchronize()
    assert not dq.isnan().any()
    starts = cu.tolist() if packed else None
    for b, length in enumerate(lengths):
        for m in range(length // tile):
            if packed:
                first = (starts[b] + b * tile) // tile * tile + m * tile
                block = accum[0, :, :, first:first + tile]
                got = dq[starts[b] + m * tile:starts[b] + (m + 1) * tile]
            else:
                block = accum[b, :, :, m * tile:(m + 1) * tile]
                got = dq[b, m * tile:(m + 1) * tile]
            for h in range(heads):
                values = got[:, h].float().flatten().sort().values
                if dim == kernel_dim:
                    want = block[h].flatten().bfloat16().float().sort().values
                    assert torch.equal(values, want)
                else:
                    # A padded head dim: dq's columns take a subset of the block's values.
                    assert torch.isin(values, block[h].bfloat16().float()).all()
