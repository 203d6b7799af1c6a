"""The backward's fp32 dq accumulator layouts and the postprocess that reads them (CPU)."""

import pytest
import torch

from cuteattn.ops import dq_from_accum, new_dq_accum


@pytest.mark.parametrize("chunks,row_pad", [(1, 0), (1, 8), (2, 8), (3, 8), (4, 8)])
@pytest.mark.parametrize("strided_out", [False, True])
def test_postprocess_reads_every_chunk_and_skips_padding(chunks, row_pad, strided_out):
    batch, seqlen_q, heads, dim, tile_m = 2, 70, 3, 192 if chunks == 3 else 128, 64
    rows = -(-seqlen_q // tile_m) * tile_m
    q = torch.empty(batch, seqlen_q, heads, dim, dtype=torch.bfloat16)
    accum = new_dq_accum(q, rows, chunks, row_pad)
    chunk_dim = dim // chunks
    assert accum.shape == (batch, heads, chunks, rows, chunk_dim + row_pad)
    assert not accum.any()
    expected = torch.randn(batch, seqlen_q, heads, dim)
    # Padding columns and padded rows hold NaN: the postprocess must not read them.
    accum.fill_(float("nan"))
    for c in range(chunks):
        columns = expected[..., c * chunk_dim : (c + 1) * chunk_dim]  # (b, s, h, chunk_dim)
        accum[:, :, c, :seqlen_q, :chunk_dim] = columns.permute(0, 2, 1, 3)
    if strided_out:
        dq = torch.empty(batch, heads, seqlen_q, dim, dtype=torch.bfloat16).transpose(1, 2)
    else:
        dq = torch.empty(batch, seqlen_q, heads, dim, dtype=torch.bfloat16)
    result = dq_from_accum(accum, 0.125, dq)
    assert result is dq
    torch.testing.assert_close(dq.float(), (expected * 0.125).bfloat16().float())


@pytest.mark.parametrize(
    "chunks,row_pad,kernel_dim,dim", [(1, 0, 64, 40), (2, 8, 64, 40), (2, 8, 128, 104), (4, 8, 256, 200)]
)
def test_postprocess_drops_the_padded_columns(chunks, row_pad, kernel_dim, dim):
    """A padded kernel accumulates kernel_dim columns (chunked); dq keeps the first dim."""
    batch, seqlen_q, heads, tile_m = 2, 70, 3, 64
    rows = -(-seqlen_q // tile_m) * tile_m
    q = torch.empty(batch, seqlen_q, heads, dim, dtype=torch.bfloat16)
    accum = new_dq_accum(q, rows, chunks, row_pad, head_dim=kernel_dim)
    chunk_dim = kernel_dim // chunks
    assert accum.shape == (batch, heads, chunks, rows, chunk_dim + row_pad)
    full = torch.randn(batch, seqlen_q, heads, kernel_dim)
    accum.fill_(float("nan"))
    for c in range(chunks):
        columns = full[..., c * chunk_dim : (c + 1) * chunk_dim]
        accum[:, :, c, :seqlen_q, :chunk_dim] = columns.permute(0, 2, 1, 3)
    dq = torch.empty(batch, seqlen_q, heads, dim, dtype=torch.bfloat16)
    assert dq_from_accum(accum, 0.5, dq, kernel_dim=kernel_dim) is dq
    torch.testing.assert_close(dq.float(), (full[..., :dim] * 0.5).bfloat16().float())


def test_sm90_backward_tiles_fit_shared_memory():
    """Every backward tile the sm90 family offers fits the H200's shared memory (the model is
    the kernel's SharedStorage), its dq rows whole 16-byte units for the bulk reductions."""
    from cuteattn.arch import arch_from_name
    from cuteattn.kernels.sm90.family import (
        BACKWARD_TILES,
        backward_dq_chunks,
        backward_smem_bytes,
    )

    capacity = arch_from_name("sm_90a").smem_per_block
    assert backward_dq_chunks(128, 80) == (2, 0)
    for head_dim, tiles in BACKWARD_TILES.items():
        for tile_m, tile_n, stages in tiles:
            chunks, pad = backward_dq_chunks(head_dim, tile_m)
            assert (head_dim // chunks + pad) * 4 % 16 == 0
            assert backward_smem_bytes(head_dim, tile_m, tile_n, stages) <= capacity
