"""The backward's fp32 dq accumulator layouts (CPU; the postprocess kernel that reads them:
tests/gpu/test_dq_postprocess.py)."""

import torch

from cuteattn.ops import new_dq_accum


def test_accumulator_layout():
    """(batch, heads, chunks, rows, chunk_dim + row_pad), zeroed; the kernel's head dim when it
    pads q's (the postprocess kernel reads it: tests/gpu/test_dq_postprocess.py)."""
    q = torch.empty(2, 70, 3, 40, dtype=torch.bfloat16)
    accum = new_dq_accum(q, 128, 2, 8, head_dim=64)
    assert accum.shape == (2, 3, 2, 128, 40)
    assert accum.dtype == torch.float32 and not accum.any()
    assert new_dq_accum(q, 128, 1, 0).shape == (2, 3, 1, 128, 40)


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
    assert backward_dq_chunks(64, 128) == (1, 8) and backward_dq_chunks(64, 64) == (2, 8)
    for head_dim, tiles in BACKWARD_TILES.items():
        for tile_m, tile_n, stages in tiles:
            chunks, pad = backward_dq_chunks(head_dim, tile_m)
            assert (head_dim // chunks + pad) * 4 % 16 == 0
            assert backward_smem_bytes(head_dim, tile_m, tile_n, stages) <= capacity
