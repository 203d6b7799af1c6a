"""Warpgroup-level pieces of the sm90 family: WGMMA over a tile, warp roles, named barriers.

WGMMA is asynchronous: ``gemm`` issues the k-slices of one tile as a single commit group and
waits only as far as ``wait_groups`` says, so a caller can keep one GEMM in flight while it
works on the registers of another.
"""

import enum

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int64
from cutlass.cute.nvgpu import warpgroup
from cutlass.cute.nvgpu.tcgen05 import int_to_smem_descriptor, smem_descriptor_to_int

from cuteattn.kernels.common.opaque import opaque_u64

THREADS_PER_WARPGROUP = 128


class NamedBarrier(enum.IntEnum):
    """Hardware barrier ids (0 is __syncthreads)."""

    EPILOGUE = 1  # consumer threads (+ the storing warp): O is in shared memory
    # Ping-pong: consumer warpgroup i waits on SCHEDULER_WG0 + i before issuing its GEMMs
    # and signals the next warpgroup's barrier once they are issued.
    SCHEDULER_WG0 = 2
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


# Shared-memory WGMMA operands held as descriptor values. A fragment made from shared memory
# carries a descriptor that each GEMM rebuilds from the shared-memory address at its use; in the
# persistent forward's loop nest ptxas keeps that in the key loop (SASS: 445 instructions per
# d64 key step against the single-tile kernel's 418, most of them uniform descriptor
# arithmetic). A value computed once, behind a move neither MLIR nor LLVM folds away
# (``opaque.opaque_u64``), stays in registers instead.


def _held_view(value: Int64, layout) -> cute.Tensor:
    return cute.make_tensor(int_to_smem_descriptor(value), layout)


def hold_k_slices(operand: cute.Tensor) -> tuple:
    """The k-slice views (operand[None, None, k]) of an unstaged operand, each from a
    descriptor value computed here: for Q, once per work tile."""
    return tuple(
        _held_view(opaque_u64(smem_descriptor_to_int(operand[None, None, k].iterator)),
                   operand[None, None, k].layout)
        for k in range(cute.size(operand.shape[2]))
    )


def hold_base(operand: cute.Tensor) -> cute.Tensor:
    """``operand`` (every mode) made from its descriptor value computed here: one value held,
    the k-slices' offsets added at each GEMM (where holding every slice costs too many
    registers: the backward)."""
    return _held_view(opaque_u64(smem_descriptor_to_int(operand.iterator)), operand.layout)


class HeldStages:
    """A staged operand (modes ..., k, stage: the forward's K and V^T, the backward's Q, dO,
    dS^T and their transposes) as its first stage's descriptor value, computed where this is
    made, and its layout; ``stage(i)`` adds stage i's offset."""

    def __init__(self, operand: cute.Tensor):
        self.layout = operand.layout
        self.stage_layout = operand[None, None, None, 0].layout
        self.base = opaque_u64(smem_descriptor_to_int(operand.iterator))

    def stage(self, index) -> cute.Tensor:
        offset = cute.crd2idx((0, 0, 0, index), self.layout)
        return _held_view(self.base + Int64(offset), self.stage_layout)


def _k_slice(operand, k: int) -> cute.Tensor:
    return operand[k] if isinstance(operand, tuple) else operand[None, None, k]


def operand_stage(operand, index) -> cute.Tensor:
    """Stage ``index`` of a staged operand, held (``HeldStages``) or not."""
    if isinstance(operand, HeldStages):
        return operand.stage(index)
    return operand[None, None, None, index]


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
    """acc (+)= A B over the k mode of the operands, as one WGMMA commit group. Either
    operand may be a tuple of k-slice views (``hold_k_slices``).

    ``wait_groups`` >= 0 waits until at most that many commit groups are still in flight;
    -1 returns at once (the caller waits later, before touching acc).
    """
    warpgroup.fence()
    mma_atom = cute.make_mma_atom(tiled_mma.op)
    mma_atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    blocks = k_blocks
    if cutlass.const_expr(k_blocks is None):
        blocks = tuple(range(
            len(operand_a) if isinstance(operand_a, tuple) else cute.size(operand_a.shape[2])
        ))
    for k in cutlass.range_constexpr(len(blocks)):
        k = blocks[k]
        cute.gemm(mma_atom, acc, _k_slice(operand_a, k), _k_slice(operand_b, k), acc)
        mma_atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if cutlass.const_expr(wait_groups >= 0):
        warpgroup.wait_group(wait_groups)
