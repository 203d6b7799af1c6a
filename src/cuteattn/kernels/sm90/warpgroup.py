"""Warpgroup-level pieces of the sm90 family: WGMMA over a tile, warp roles, named barriers.

WGMMA is asynchronous: ``gemm`` issues the k-slices of one tile as a single commit group and
waits only as far as ``wait_groups`` says, so a caller can keep one GEMM in flight while it
works on the registers of another.
"""

import enum

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import warpgroup

THREADS_PER_WARPGROUP = 128


class NamedBarrier(enum.IntEnum):
    """Hardware barrier ids (0 is __syncthreads)."""

    EPILOGUE = 1  # consumer threads (+ the storing warp): O is in shared memory
    # Ping-pong: consumer warpgroup i waits on SCHEDULER_WG0 + i before issuing its GEMMs
    # and signals the next warpgroup's barrier once they are issued.
    SCHEDULER_WG0 = 2
    # Varlen: consumer warpgroup i has zeroed the V rows past its sequence's keys (5 + i).
    ZEROED_WG0 = 5
    # Dynamic persistent scheduling: the producer warp has put the next work index in shared
    # memory (full), the consumers have read it (empty).
    TILE_FULL = 8
    TILE_EMPTY = 9


def tma_pipeline(barriers: cute.Pointer, num_stages: int, tile_bytes: int, consumer_threads: int):
    """A ring of ``num_stages`` shared-memory buffers that one producer thread fills by TMA
    (``tile_bytes`` per stage) and every consumer warp releases (PipelineTmaAsync elects a
    lane). Barrier init is left to one fence for all rings (``pipeline_init_arrive`` /
    ``pipeline_init_wait``)."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barriers,
        num_stages=num_stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_threads // 32),
        tx_count=tile_bytes,
        defer_sync=True,
    )


@cute.jit
def gemm(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    operand_a: cute.Tensor,
    operand_b: cute.Tensor,
    zero_init: cutlass.Constexpr[bool],
    wait_groups: cutlass.Constexpr[int],
    k_blocks: cutlass.Constexpr = None,
):
    """acc (+)= A B over the k mode of the operands, as one WGMMA commit group.

    ``wait_groups`` >= 0 waits until at most that many commit groups are still in flight;
    -1 returns at once (the caller waits later, before touching acc).
    """
    warpgroup.fence()
    mma_atom = cute.make_mma_atom(tiled_mma.op)
    mma_atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    blocks = k_blocks
    if cutlass.const_expr(k_blocks is None):
        blocks = tuple(range(cute.size(operand_a.shape[2])))
    for k in cutlass.range_constexpr(len(blocks)):
        k = blocks[k]
        cute.gemm(mma_atom, acc, operand_a[None, None, k], operand_b[None, None, k], acc)
        mma_atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if cutlass.const_expr(wait_groups >= 0):
        warpgroup.wait_group(wait_groups)
