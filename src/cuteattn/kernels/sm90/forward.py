"""Attention forward for the Hopper family: TMA + WGMMA + warp specialisation (sm_90a).

Layouts (flash-attn's): q, out (batch, seqlen_q, heads_q, dim); k, v (batch, seqlen_k,
heads_kv, dim); lse (batch, heads_q, seqlen_q) fp32. The last mode is contiguous; other strides
are multiples of 16 bytes and may exceed 2^31 (TMA descriptors hold 64-bit strides).
lse is None for a plan with ("lse", False) (a call that reads no lse): none is written.

A CTA computes (tile_m x dim) tiles of out, one (m_block, head, batch) work tile at a time:
one per CTA, or, persistent, a strided share of all of them (``LinearTileScheduler``: L2-sized
sections of heads, longest query tiles first when causal). Its warpgroups:
  - warpgroup 0, the producer: one warp issues TMA loads of the Q tile and of K and V tiles
    into a ``num_stages``-deep ring of swizzled shared-memory buffers (mbarrier pipelines);
    it keeps few registers (setmaxnreg) and gives the rest to the consumers.
  - warpgroups 1..n, the consumers: each owns 64 rows of the query tile. For the key tiles
    n_block = last .. first:
      1. S = Q K^T with WGMMA, both operands in shared memory;
      2. mask S (seqlen bound on the first tile, the causal diagonal on crossing tiles;
         tiles above the diagonal are never loaded);
      3. online softmax in exp2 with the scale folded in; P stays in registers;
      4. O += P V with WGMMA, P from registers, V^T from shared memory.
    Intra-warpgroup overlap: the GEMM S(n) = Q K(n)^T is issued before O += P(n+1) V(n+1),
    so the softmax of tile n runs while the tensor cores finish P V of the previous tile.
    Ping-pong (head dims up to 128, two or more consumer warpgroups): named barriers let
    one warpgroup issue its GEMMs while the other does its softmax.
  - epilogue: O /= row_sum, LSE = (max * scale) + ln(row_sum); O goes registers -> shared
    memory -> global by a TMA store, which clips rows past seqlen_q; the LSE is written from
    registers. Single-tile kernels put O in Q's buffer; persistent ones have an O buffer of
    their own where it fits, so the next tile's Q can load while O is stored (and, with two Q
    stages where they fit too, d64 to d128, while this tile's last key tiles run), else (d192,
    d256) O takes V's stages (the next tile's first V load waits until O's store has read
    them), or, where they are too small, Q's buffer, whose stage the consumers release once
    O's store has read it.
A query tile that sees no key (causal with seqlen_q > seqlen_k) loads no K or V (nor Q, but
where a persistent kernel has no O buffer of its own) and writes O = 0, LSE = -inf.

Varlen (packed sequences, (1, total, heads, dim), lse (1, heads, total)): the query tiles of
each sequence and head (``VarlenTileScheduler``, single tile or persistent), not packed GQA.
Q, K, V and O go through ragged TMA views (``kernels/sm90/ragged.py``), whose boxes stop at
each sequence's end as at a fixed-length batch's seqlen: rows past the sequence's keys load as
zeros and are masked like any past seqlen_k, rows past its queries load as zeros and O's TMA
store stops before them; the grid's few CTAs past the last tile get a query tile past the last
sequence's end, which does nothing.

Constraints: fp16/bf16; head_dim 64, 96, 128, 192, 256 and dim_v == dim, or (192, 128) (V and
O then have dim_v columns, O in Q's buffer); tile_m = 64 per
consumer warpgroup (1..3); tile_n a multiple of 16; Q (one or two stages, + O), stages of K
and V within 227 KB.

Compile and run: ``cuteattn.flash_attn_func`` plans, compiles (once per plan) and launches it;
tests/cpu/test_compile.py cross-compiles the variants for sm_90a on a CPU.
Profile with ``ncu --clock-control none python -m cuteattn.bench --dims 128``.
"""

import functools
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as hopper
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from cuteattn.kernels.common import softcap as capping
from cuteattn.kernels.common.block_info import BlockInfo
from cuteattn.kernels.common.compile_args import check_operand_dtypes
from cuteattn.kernels.common.convert import convert_packed
from cuteattn.kernels.common.epilogue import store_lse
from cuteattn.kernels.common.fragments import acc_as_rows_cols, tile_coords
from cuteattn.kernels.common.kernel_base import AttentionKernel
from cuteattn.kernels.common.mask import AttentionMask
from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.sink import row_sinks
from cuteattn.kernels.common.smem_tiles import transposed
from cuteattn.kernels.common.softmax import (
    OnlineSoftmax,
    rescale_rows,
    rescale_rows_where_needed,
)
from cuteattn.kernels.common.tile_scheduler import (
    DynamicTileScheduler,
    LinearTileCounts,
    LinearTileScheduler,
    VarlenTileCounts,
    VarlenTileScheduler,
    WorkTile,
    make_linear_tile_counts,
    make_varlen_tile_counts,
)
from cuteattn.kernels.sm90 import tiling
from cuteattn.kernels.sm90.ragged import packed_tma_view, sequence_rows
from cuteattn.kernels.sm90.smem import permuted, smem_layout, tma_partition, tma_tile
from cuteattn.kernels.sm90.warpgroup import (
    THREADS_PER_WARPGROUP,
    HeldStages,
    NamedBarrier,
    gemm,
    hold_k_slices,
    operand_stage,
    tma_pipeline,
)

# Lazy O rescale: a row's max may lag by 2^8 (P <= 256, exact in fp16 / bf16 range).
RESCALE_THRESHOLD = 8.0


def wait_stage(stage_pipeline: pipeline.PipelineAsync, state: pipeline.PipelineState):
    """Wait until ``state``'s stage is full: one try_wait first, the blocking wait only if the
    stage is not ready. (A bare consumer_wait is a try_wait loop with a 10 ms suspend hint
    inline in the main loop: NANOSLEEP.SYNCS on every retry.)"""
    stage_pipeline.consumer_wait(state, stage_pipeline.consumer_try_wait(state))


@cute.jit
def wait_phase(barrier: cute.Pointer, phase: Int32):
    """``wait_stage``'s wait on a bare mbarrier: one try_wait, the blocking wait only if the
    phase is not complete yet."""
    ready = cute.arch.mbarrier_try_wait(barrier, phase)
    if ready == 0:
        cute.arch.mbarrier_wait(barrier, phase)


def _pack_heads(tensor: cute.Tensor, group: int, *, seq: int, head: int, inner=(), outer=()):
    """Packed GQA view (group, seqlen, *inner, heads // group, *outer) of the modes named by
    index. Row (g, s) of a query tile is query head head_kv * group + g at position s: the
    ``group`` heads that share a KV head stack, fastest, along the tile's rows."""
    shape, stride = tensor.layout.shape, tensor.layout.stride
    layout = cute.make_layout(
        (
            group, shape[seq], *(shape[m] for m in inner), shape[head] // group,
            *(shape[m] for m in outer),
        ),
        stride=(
            stride[head], stride[seq], *(stride[m] for m in inner), stride[head] * group,
            *(stride[m] for m in outer),
        ),
    )
    return cute.make_tensor(tensor.iterator, layout)


class Mainloop(NamedTuple):
    """What a consumer warpgroup's key-tile steps use, set up once per kernel: its MMA
    partitions and operand views, the O accumulator, the held-back O rescale factors, the mask,
    the K / V pipelines and the scores' tanh scale (soft-capping)."""

    thr_mma_qk: cute.ThrMma
    tiled_mma_qk: cute.TiledMma
    tiled_mma_pv: cute.TiledMma
    # Q, shared memory, as the A operand of S = Q K^T (two Q stages: with a stage mode)
    tSrQ: cute.Tensor
    tSrK: cute.Tensor  # K stages, the B operand
    tOrVt: cute.Tensor  # V^T stages, the B operand of O += P V
    tOrP: cute.Tensor  # P in registers, the A operand
    acc_O: cute.Tensor
    pending_scale: cute.Tensor  # O rescale held back to the next P V (rescale_o_before_pv)
    mask: AttentionMask
    pipeline_k: pipeline.PipelineAsync
    pipeline_v: pipeline.PipelineAsync
    wg_idx: Int32
    tanh_scale: Float32
    sV: cute.Tensor  # V's stages


class FlashForwardSm90(AttentionKernel):
    def __init__(
        self,
        *,
        num_stages: int,
        pingpong: bool | None = None,
        persistent: bool = False,
        dynamic: bool = False,
        separate_o: bool = True,
        o_in_v: bool = False,
        q_stages: int = 1,
        pack_gqa: int = 1,
        sink: bool = False,
        exp2_poly_every: int = 0,
        eager_rescale: bool = False,
        rescale_before_pv: bool | None = None,
        hold_descriptors: bool = False,
        **shape,
    ):
        """pack_gqa: query heads per KV head packed into one tile's rows (1: not packed); the
        caller guarantees heads_q == pack_gqa * heads_kv. dynamic (persistent, fixed-length):
        the tiles handed out from a global counter (``DynamicTileScheduler``; the caller passes
        a zeroed (1,) int32 tensor as tile_counter). sink: the kernel takes a learnable
        sink's logits (``kernels/common/sink.py``). separate_o (persistent only): O has a
        buffer of its own, so the next tile's Q loads during this tile's epilogue; without one
        (``tiling.separate_o_fits``: d192 / d256 tiles leave no room) O takes V's stages where
        they hold it (``o_in_v``, ``tiling.o_in_v_fits``: Q is free after the last S, and only
        the next tile's first V waits until O's store has read them), else Q's buffer (the
        next Q waits until O's store has read it). q_stages (separate_o only, else 1): Q
        buffers, 2 where they fit (``tiling.separate_o_q_stages``): the next work tile's Q
        loads while this one's key tiles still read their own. eager_rescale: O rescaled at
        every key tile, else lazily (``RESCALE_THRESHOLD``; ``family.default_eager_rescale``
        says where each pays). rescale_before_pv: O rescaled while S = Q K^T of the next
        key tile is in flight instead of after the softmax (None: where dim_v > 128, and at
        d128). shape: ``AttentionKernel``'s fields. hold_descriptors: the GEMMs'
        shared-memory descriptors computed once (Q per work tile, K and V per kernel) and kept
        in registers (``warpgroup.HeldStages``)."""
        super().__init__(**shape)
        self.sink = sink
        # Every that-many-th exponential of the softmax on the FMA pipe (soft-capping: the
        # tanh shares MUFU with exp2; ``kernels/common/exp2_poly.py``), 0 for none.
        self.exp2_poly_every = exp2_poly_every
        self.eager_rescale = eager_rescale
        self.hold_descriptors = hold_descriptors
        self.num_stages = num_stages
        self.persistent = persistent
        self.dynamic = dynamic and persistent and not self.varlen
        self.separate_o = persistent and separate_o
        self.o_in_v = persistent and not separate_o and o_in_v
        # Persistent with O in Q's buffer: the consumers hold Q's stage through the epilogue.
        self.q_holds_o = persistent and not separate_o and not self.o_in_v
        # Q is read by no GEMM after the last S: released then, unless O takes its buffer.
        self.q_free_after_qk = self.separate_o or self.o_in_v
        # Two Q stages (separate O only): the producer loads the next tile's Q as soon as it
        # has issued this tile's loads, not once both consumer warpgroups are past their last
        # S. Every other plan keeps one stage (and its code as it was).
        self.q_stages = q_stages if self.separate_o else 1
        assert self.q_stages in (1, 2)
        self.pack_gqa = pack_gqa
        # Query positions per tile: packed, each position takes pack_gqa rows, and the rows
        # past the last whole group stay idle (tile_m need not be a multiple of pack_gqa).
        self.tile_positions = self.tile_m // pack_gqa
        self.num_consumer_wgs = tiling.num_consumer_warpgroups(self.tile_m)
        self.num_consumer_threads = self.num_consumer_wgs * THREADS_PER_WARPGROUP
        self.num_threads = tiling.num_threads(self.tile_m)
        self.consumer_regs, self.producer_regs = tiling.REGISTER_SPLIT[self.num_consumer_wgs]
        # Ping-pong pays where softmax is a large share of a tile's time (small head dims).
        if pingpong is None:
            pingpong = self.num_consumer_wgs >= 2 and self.head_dim <= 128
        self.pingpong = pingpong and self.num_consumer_wgs >= 2
        # Consumer warpgroups with no rows in a query tile skip its GEMMs (``drain_tiles``):
        # whole 64-row warpgroup shares of the tile's rows (not packed GQA).
        self.skips_idle_warpgroups = self.num_consumer_wgs > 1 and pack_gqa == 1
        # At d128 and where dim_v > 128 (not d192 with dim_v 128): rescale O while S = Q K^T
        # is in flight rather than after softmax, which keeps the (large) O rescale off the
        # critical path. d128 timed in the twenty-second session (docs/PERF.md): dense +1-3%,
        # causal 4k / 16k +2-7%, 1k within 0.3%.
        if rescale_before_pv is None:
            rescale_before_pv = self.head_dim_v > 128 or self.head_dim == 128
        self.rescale_o_before_pv = rescale_before_pv
        # The consumer threads' barrier around the O tile in shared memory.
        self.epilogue_sync = functools.partial(
            cute.arch.barrier, barrier_id=int(NamedBarrier.EPILOGUE),
            number_of_threads=self.num_consumer_threads,
        )

    @staticmethod
    def can_implement(
        head_dim, tile_m, tile_n, num_stages, separate_o, smem_capacity, head_dim_v=None
    ) -> bool:
        return tiling.can_implement(
            head_dim, tile_m, tile_n, num_stages, separate_o=separate_o,
            smem_capacity=smem_capacity, head_dim_v=head_dim_v,
        )

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mK: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mV: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mO: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mLSE: cute.Tensor | None,  # (batch, heads_q, seqlen_q) fp32; None: not written
        mSink: cute.Tensor | None,  # (heads_q,) fp32 learnable sink logits, or None
        mCuSeqlensQ: cute.Tensor | None,  # varlen: (batch + 1,) int32 row offsets, else None
        mCuSeqlensK: cute.Tensor | None,
        mSequsedK: cute.Tensor | None,  # varlen: (batch,) int32 keys used, or None
        max_seqlen_q: Int32,  # varlen: the longest sequence (bounds the grid), else unused
        softmax_scale: Float32,
        max_ctas: Int32,  # CTAs resident at once (the SM count): a persistent kernel's grid
        mTileCounter: cute.Tensor | None,  # dynamic: (1,) int32, zeroed; else None
        stream,
    ):
        check_operand_dtypes(mQ, mK, mV, mO)
        packed = self.pack_gqa > 1
        if cutlass.const_expr(self.varlen):
            # Packed sequences, (1, total, heads, dim): a CTA per query tile of each sequence.
            counts = make_varlen_tile_counts(
                total_rows=mQ.shape[1], max_length=max_seqlen_q, tile=self.tile_positions,
                num_heads=mQ.shape[2], num_batches=mCuSeqlensQ.shape[0] - 1,
            )
        else:
            counts = make_linear_tile_counts(
                seqlen_q=mQ.shape[1], seqlen_k=mK.shape[1], tile_m=self.tile_positions,
                num_heads=mK.shape[2] if cutlass.const_expr(packed) else mQ.shape[2],
                num_batches=mQ.shape[0],
                kv_bytes_per_key=(self.head_dim + self.head_dim_v) * self.dtype.width // 8,
            )
        # TMA boxes tile the leading modes: K, V as (seqlen, dim, heads, batch); Q, O likewise
        # or, packed, as (group, seqlen, dim, heads_kv, batch) with the LSE to match. A packed
        # batch's (1, total, heads, dim) as ragged views (``ragged``: boxes stop at each
        # sequence's end; never with packed GQA).
        if cutlass.const_expr(self.varlen):
            mQ, mK, mV, mO = (
                packed_tma_view(t) for t in (mQ, mK, mV, mO)
            )
        else:
            mK, mV = (permuted(t, [1, 3, 2, 0]) for t in (mK, mV))
            if cutlass.const_expr(packed):
                mQ, mO = (
                    _pack_heads(t, self.pack_gqa, seq=1, head=2, inner=(3,), outer=(0,))
                    for t in (mQ, mO)
                )
            else:
                mQ, mO = (permuted(t, [1, 3, 2, 0]) for t in (mQ, mO))
        if cutlass.const_expr(mLSE is not None):
            if cutlass.const_expr(packed):
                mLSE = _pack_heads(mLSE, self.pack_gqa, seq=2, head=1, outer=(0,))
            else:
                mLSE = permuted(mLSE, [2, 1, 0])  # (seqlen_q, heads_q, batch)

        # One Q tile (TMA's box), and Q's buffer: that tile, or q_stages of them.
        sQ_stage_layout = smem_layout(self.dtype, self.tile_m, self.head_dim)
        sQ_layout = sQ_stage_layout
        if cutlass.const_expr(self.q_stages > 1):
            sQ_layout = smem_layout(self.dtype, self.tile_m, self.head_dim, self.q_stages)
        sK_layout = smem_layout(self.dtype, self.tile_n, self.head_dim, self.num_stages)
        sV_layout = smem_layout(self.dtype, self.tile_n, self.head_dim_v, self.num_stages)
        sO_layout = smem_layout(self.dtype, self.tile_m, self.head_dim_v)
        o_elems = cute.cosize(sO_layout) if cutlass.const_expr(self.separate_o) else 0

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2 * self.q_stages]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            tile_slot: cute.struct.MemRange[Int32, 1 if self.dynamic else 0]  # the next index
            # O in V's stages: O's store has read them (an arrival per consumer warp).
            mbar_o: cute.struct.MemRange[cutlass.Int64, 1 if self.o_in_v else 0]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[self.dtype, o_elems], 1024]

        # The planner sizes plans by ``tiling.smem_bytes`` (its 1024 bytes of slack hold the
        # barrier block): it must not undercount the struct.
        smem_model = tiling.smem_bytes(
            self.head_dim, self.tile_m, self.tile_n, self.num_stages, self.separate_o,
            self.head_dim_v, self.q_stages,
        )
        assert SharedStorage.size_in_bytes() <= smem_model, (
            f"SharedStorage {SharedStorage.size_in_bytes()} bytes, tiling model {smem_model}"
        )

        tma_load = cpasync.CopyBulkTensorTileG2SOp()
        sQ_tile_layout = self.query_smem(sQ_stage_layout)
        tma_atom_q, tma_q = cpasync.make_tiled_tma_atom(
            tma_load, mQ, sQ_tile_layout, self.query_tile_shape()
        )
        kv_stage_layout = cute.select(sK_layout, mode=[0, 1])
        tma_atom_k, tma_k = cpasync.make_tiled_tma_atom(
            tma_load, mK, kv_stage_layout, (self.tile_n, self.head_dim), 1
        )
        v_stage_layout = cute.select(sV_layout, mode=[0, 1])
        tma_atom_v, tma_v = cpasync.make_tiled_tma_atom(
            tma_load, mV, v_stage_layout, (self.tile_n, self.head_dim_v), 1
        )
        tma_atom_o, tma_o = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO, self.query_smem(sO_layout, self.head_dim_v),
            self.query_tile_shape(self.head_dim_v),
        )
        # The rows TMA fills (packed: whole groups only; the box is transferred in full).
        tile_bytes_q = (
            self.tile_positions * self.pack_gqa * self.head_dim * self.dtype.width // 8
        )
        tile_bytes_kv = cute.size_in_bytes(self.dtype, kv_stage_layout)
        tile_bytes_v = cute.size_in_bytes(self.dtype, v_stage_layout)

        # Consumer warpgroups stack along M, 64 rows each.
        tiled_mma_qk = hopper.make_trivial_tiled_mma(
            self.dtype,
            self.dtype,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.K,
            Float32,
            atom_layout_mnk=(self.num_consumer_wgs, 1, 1),
            tiler_mn=(64, self.tile_n),
        )
        tiled_mma_pv = hopper.make_trivial_tiled_mma(
            self.dtype,
            self.dtype,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.MN,
            Float32,
            atom_layout_mnk=(self.num_consumer_wgs, 1, 1),
            tiler_mn=(64, self.head_dim_v),
            a_source=warpgroup.OperandSource.RMEM,
        )

        grid = self.scheduler_class().grid_shape(
            counts, persistent=self.persistent, max_ctas=max_ctas
        )
        self.kernel(
            tma_q,
            tma_k,
            tma_v,
            tma_o,
            mLSE,
            mSink,
            mCuSeqlensQ,
            mCuSeqlensK,
            mSequsedK,
            mTileCounter,
            tma_atom_q,
            tma_atom_k,
            tma_atom_v,
            tma_atom_o,
            capping.exp2_scale(softmax_scale, self.softcap),
            capping.tanh_scale(softmax_scale, self.softcap),
            counts,
            sQ_layout,
            sK_layout,
            sV_layout,
            sO_layout,
            tiled_mma_qk,
            tiled_mma_pv,
            tile_bytes_q,
            tile_bytes_kv,
            tile_bytes_v,
            SharedStorage,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,  # TMA views, (seqlen, dim, heads, batch); Q, O packed: (group, ...)
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor | None,  # (seqlen_q, heads_q, batch); packed: (group, seqlen_q, heads_kv,
        #   batch); None: not written
        mSink: cute.Tensor | None,
        mCuSeqlensQ: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
        mSequsedK: cute.Tensor | None,
        mTileCounter: cute.Tensor | None,
        tma_atom_q: cute.CopyAtom,
        tma_atom_k: cute.CopyAtom,
        tma_atom_v: cute.CopyAtom,
        tma_atom_o: cute.CopyAtom,
        scale_log2: Float32,
        tanh_scale: Float32,
        counts: LinearTileCounts | VarlenTileCounts,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        tile_bytes_q: cutlass.Constexpr[int],
        tile_bytes_kv: cutlass.Constexpr[int],
        tile_bytes_v: cutlass.Constexpr[int],
        SharedStorage: cutlass.Constexpr,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_atom_q, tma_atom_k, tma_atom_v, tma_atom_o):
                cpasync.prefetch_descriptor(atom)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        pipeline_q = self.tma_pipeline(storage.mbar_q.data_ptr(), self.q_stages, tile_bytes_q)
        pipeline_k = self.tma_pipeline(storage.mbar_k.data_ptr(), self.num_stages, tile_bytes_kv)
        pipeline_v = self.tma_pipeline(storage.mbar_v.data_ptr(), self.num_stages, tile_bytes_v)
        o_read = None
        if cutlass.const_expr(self.o_in_v):
            o_read = storage.mbar_o.data_ptr()
            if warp_idx == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_init(o_read, self.num_consumer_threads // 32)
        pipeline.pipeline_init_arrive()
        pipeline.pipeline_init_wait()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sO = sQ
        if cutlass.const_expr(self.separate_o):
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        elif cutlass.const_expr(self.o_in_v):
            sO = storage.sV.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        elif cutlass.const_expr(self.head_dim_v != self.head_dim):
            # O (dim_v columns) in Q's buffer.
            sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        block_info = BlockInfo(
            tile_m=self.tile_positions, tile_n=self.tile_n, causal=self.causal,
            window=self.window,
        )
        seqlen_q = mQ.shape[1] if cutlass.const_expr(self.pack_gqa > 1) else mQ.shape[0]
        # Varlen: each work tile's sequence (``SeqlenInfo.varlen``) replaces this.
        seqlen = SeqlenInfo(seqlen_q=seqlen_q, seqlen_k=mK.shape[0])
        cu_seqlens = dict(
            mCuSeqlensQ=mCuSeqlensQ, mCuSeqlensK=mCuSeqlensK, mSequsedK=mSequsedK
        )
        # Dynamic scheduling: the global ticket counter and the shared slot the producer
        # passes each next work index through.
        tiles = (None, None)
        if cutlass.const_expr(self.dynamic):
            tiles = (mTileCounter, storage.tile_slot.get_tensor(cute.make_layout(1)))

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.produce(
                    mQ, mK, mV, sQ, sK, sV, tma_atom_q, tma_atom_k, tma_atom_v,
                    pipeline_q, pipeline_k, pipeline_v, counts, block_info, seqlen, cu_seqlens,
                    tiles, o_read,
                )
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consume(
                mO, mLSE, mSink, sQ, sK, sV, sO, tma_atom_o, tiled_mma_qk, tiled_mma_pv,
                pipeline_q, pipeline_k, pipeline_v, scale_log2, tanh_scale, counts, block_info,
                seqlen, cu_seqlens, tiles, o_read,
            )

    def tma_pipeline(self, barriers: cute.Pointer, num_stages: int, tile_bytes: int):
        return tma_pipeline(barriers, num_stages, tile_bytes, self.num_consumer_threads)

    def scheduler_class(self):
        """A packed batch's tiles follow its sequences (``VarlenTileScheduler``); otherwise the
        linear order of L2 sections, single tile or persistent, statically strided or handed
        out as CTAs ask (``DynamicTileScheduler``)."""
        if self.varlen:
            return VarlenTileScheduler
        return DynamicTileScheduler if self.dynamic else LinearTileScheduler

    def make_scheduler(self, counts, cu_seqlens_q: cute.Tensor | None, tiles, producer: bool):
        """``tiles``: (ticket counter, shared slot) of a dynamic kernel; ``producer``: the
        producer warp's scheduler (it draws the tickets) or a consumer's."""
        if cutlass.const_expr(self.dynamic):
            return DynamicTileScheduler.create(
                counts, longest_first=self.causal, counter=tiles[0], slot=tiles[1],
                producer=producer, consumer_threads=self.num_consumer_threads,
                full_id=int(NamedBarrier.TILE_FULL), empty_id=int(NamedBarrier.TILE_EMPTY),
            )
        if cutlass.const_expr(self.varlen):
            return VarlenTileScheduler.create(
                counts, cu_seqlens_q, tile=self.tile_positions, longest_first=self.causal,
                persistent=self.persistent,
                # Query tiles that differ in work: a sequence's heads take turns.
                heads_fastest=self.causal or self.window is not None,
            )
        return LinearTileScheduler.create(
            counts, longest_first=self.causal, persistent=self.persistent
        )

    # ---- Producer: TMA loads ------------------------------------------------------------------

    @cute.jit
    def produce(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        tma_atom_q: cute.CopyAtom,
        tma_atom_k: cute.CopyAtom,
        tma_atom_v: cute.CopyAtom,
        pipeline_q: pipeline.PipelineAsync,
        pipeline_k: pipeline.PipelineAsync,
        pipeline_v: pipeline.PipelineAsync,
        counts: LinearTileCounts | VarlenTileCounts,
        block_info: BlockInfo,
        seqlen: SeqlenInfo,
        cu_seqlens: dict,
        tiles: tuple,
        o_read: cute.Pointer | None,
    ):
        """Per work tile: Q and the first K tile (one Q stage: that K first, then Q once the
        consumers have released the last tile's; two: Q first), then K and V tiles from the
        last visible one down to 0, in the order the consumers use them (with intra-warpgroup
        overlap K(n - 1) before V(n))."""
        # O in V's stages: the phase of ``o_read`` the next tile's first V load waits for (a
        # fresh mbarrier counts its phase before the first as completed).
        o_phase = Int32(1)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        scheduler = self.make_scheduler(counts, cu_seqlens["mCuSeqlensQ"], tiles, producer=True)
        work = scheduler.initial_work_tile()
        loads = dict(
            mQ=mQ, mK=mK, mV=mV, sQ=sQ, sK=sK, sV=sV, tma_atom_q=tma_atom_q,
            tma_atom_k=tma_atom_k, tma_atom_v=tma_atom_v, pipeline_q=pipeline_q,
            pipeline_k=pipeline_k, pipeline_v=pipeline_v, block_info=block_info, seqlen=seqlen,
            o_read=o_read, **cu_seqlens,
        )
        if cutlass.const_expr(self.persistent):
            while work.is_valid:
                if cutlass.const_expr(self.dynamic):
                    scheduler.prefetch_next()
                q_state, kv_state, o_phase = self.produce_tile(
                    work, q_state, kv_state, o_phase, **loads
                )
                work = scheduler.advance()
        else:
            # One work tile per CTA, straight-line: a loop here costs registers in the consumers.
            q_state, kv_state, o_phase = self.produce_tile(
                work, q_state, kv_state, o_phase, **loads
            )

    @cute.jit
    def produce_tile(
        self, work: WorkTile, q_state, kv_state, o_phase: Int32, *, mQ, mK, mV, sQ, sK, sV,
        tma_atom_q, tma_atom_k, tma_atom_v, pipeline_q, pipeline_k, pipeline_v, block_info,
        seqlen, o_read, mCuSeqlensQ, mCuSeqlensK, mSequsedK,
    ):
        """One work tile's loads; returns the advanced pipeline states and ``o_read``'s next
        phase. O in V's stages: the tile's first V load (or, a tile with no key, its Q, which
        the consumers wait for) waits until the last tile's O store has read them; the
        consumers of this tile cannot arrive again before that, so the wait's phase is never
        ambiguous."""
        head_kv = work.head  # packed: work tiles are per KV head
        if cutlass.const_expr(self.pack_gqa == 1):
            head_kv = work.head // (mQ.shape[2] // mK.shape[2])
        if cutlass.const_expr(self.varlen):
            seqlen = SeqlenInfo.varlen(mCuSeqlensQ, mCuSeqlensK, mSequsedK, work.batch)
        n_block_min, n_block_max = self.key_tile_range(block_info, seqlen, work.m_block)
        gQ = self.query_tile(mQ, work, seqlen)
        tile_kv = (self.tile_n, self.head_dim)
        tile_v = (self.tile_n, self.head_dim_v)
        sQ_stage = sQ
        if cutlass.const_expr(self.q_stages > 1):
            sQ_stage = sQ[None, None, q_state.index]  # the stage this tile's Q loads into
        tQsQ, tQgQ = tma_partition(
            tma_atom_q, self.query_smem(sQ_stage), gQ, tile_rank=cute.rank(gQ)
        )
        tKsK, tKgK = tma_tile(
            tma_atom_k, sK, self.key_rows(mK, head_kv, work.batch, seqlen), tile_kv, (None, 0)
        )
        tVsV, tVgV = tma_tile(
            tma_atom_v, sV, self.key_rows(mV, head_kv, work.batch, seqlen), tile_v, (None, 0)
        )
        if n_block_max > n_block_min:
            if cutlass.const_expr(self.q_stages > 1):
                # Its stage was released by the tile before last (after that tile's last S);
                # with short key ranges the producer may wait for it here, harmlessly: this
                # tile's first K waits for the same consumers anyway.
                self.load_q(tma_atom_q, tQgQ, tQsQ, pipeline_q, q_state)
                q_state.advance()
            self.load_tile(tma_atom_k, tKgK, tKsK, pipeline_k, n_block_max - 1, kv_state)
            if cutlass.const_expr(self.q_stages == 1):
                # One stage: K goes out while the consumers may still hold the last tile's Q.
                self.load_q(tma_atom_q, tQgQ, tQsQ, pipeline_q, q_state)
                q_state.advance()
            for i in cutlass.range(n_block_max - 1 - n_block_min, unroll=1):
                n_block = n_block_max - 2 - i
                v_state = kv_state.clone()
                kv_state.advance()
                self.load_tile(tma_atom_k, tKgK, tKsK, pipeline_k, n_block, kv_state)
                if cutlass.const_expr(self.o_in_v):
                    if i == 0:
                        wait_phase(o_read, o_phase)
                self.load_tile(tma_atom_v, tVgV, tVsV, pipeline_v, n_block + 1, v_state)
            if cutlass.const_expr(self.o_in_v):
                if n_block_max - 1 == n_block_min:
                    wait_phase(o_read, o_phase)
            self.load_tile(tma_atom_v, tVgV, tVsV, pipeline_v, n_block_min, kv_state)
            kv_state.advance()
        if cutlass.const_expr(self.q_holds_o or self.o_in_v):
            # A tile with no key loads its Q too: the consumers wait for it (O in Q's buffer:
            # before O takes the buffer, so the next tile's Q cannot land on this tile's O).
            if n_block_max <= n_block_min:
                if cutlass.const_expr(self.o_in_v):
                    wait_phase(o_read, o_phase)
                self.load_q(tma_atom_q, tQgQ, tQsQ, pipeline_q, q_state)
                q_state.advance()
        if cutlass.const_expr(self.o_in_v):
            o_phase = o_phase ^ 1
        return q_state, kv_state, o_phase

    @cute.jit
    def load_q(self, tma_atom_q, tQgQ, tQsQ, pipeline_q: pipeline.PipelineAsync, q_state):
        """TMA the work tile's Q into its buffer once the consumers have released it."""
        pipeline_q.producer_acquire(q_state)
        cute.copy(tma_atom_q, tQgQ, tQsQ, tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))

    def query_tile_shape(self, columns: int | None = None) -> tuple:
        """The TMA box of a Q / O tile: (tile_m, dim), or, packed, (group, positions, dim);
        ``columns``: O's (dim_v) where they differ."""
        columns = columns or self.head_dim
        if self.pack_gqa == 1:
            return (self.tile_m, columns)
        return (self.pack_gqa, self.tile_positions, columns)

    def query_smem(self, smem, columns: int | None = None):
        """The Q / O buffer (a tensor or its layout) as TMA sees it: packed, row g + group * s
        of the tile holds head g at position s; rows past the last whole group are not used."""
        if self.pack_gqa == 1:
            return smem
        rows = cute.make_layout(
            self.query_tile_shape(columns), stride=(1, self.pack_gqa, self.tile_m)
        )
        return cute.composition(smem, rows)

    def query_tile(
        self, tensor: cute.Tensor, work: WorkTile, seqlen: SeqlenInfo | None = None,
        columns: int | None = None,
    ) -> cute.Tensor:
        """Work tile ``work``'s block of the TMA view of q or out (varlen: of its sequence,
        ``ragged.sequence_rows``: loads zeros past its end, stores stop there); ``columns``
        as in ``query_tile_shape``."""
        shape = self.query_tile_shape(columns)
        if cutlass.const_expr(self.varlen):
            rows = sequence_rows(tensor, work.head, seqlen.offset_q, seqlen.seqlen_q)
            return cute.local_tile(rows, shape, (work.m_block, 0))
        if cutlass.const_expr(self.pack_gqa == 1):
            return cute.local_tile(
                tensor[None, None, work.head, work.batch], shape, (work.m_block, 0)
            )
        return cute.local_tile(
            tensor[None, None, None, work.head, work.batch], shape, (0, work.m_block, 0)
        )

    def key_rows(self, tensor: cute.Tensor, head_kv, batch, seqlen: SeqlenInfo) -> cute.Tensor:
        """The (seqlen_k, dim) TMA view of k or v for one KV head: of its batch, or varlen, of
        its sequence (``ragged.sequence_rows``): TMA loads zeros past its keys (used), which
        the seqlen mask hides."""
        if cutlass.const_expr(self.varlen):
            return sequence_rows(tensor, head_kv, seqlen.offset_k, seqlen.seqlen_k)
        return tensor[None, None, head_kv, batch]

    @cute.jit
    def key_tile_range(self, block_info: BlockInfo, seqlen: SeqlenInfo, m_block: Int32):
        """(n_block_min, n_block_max) of a work tile; varlen: none for a query tile past its
        sequence's end (the grid's CTAs past the last tile)."""
        n_block_min, n_block_max = block_info.n_block_min_max(seqlen, m_block)
        if cutlass.const_expr(self.varlen):
            if m_block * self.tile_positions >= seqlen.seqlen_q:
                n_block_max = n_block_min
        return n_block_min, n_block_max

    @cute.jit
    def load_tile(
        self,
        tma_atom: cute.CopyAtom,
        tiles_gmem: cute.Tensor,
        stages_smem: cute.Tensor,
        kv_pipeline: pipeline.PipelineAsync,
        n_block: Int32,
        state: pipeline.PipelineState,
    ):
        """TMA one K or V tile into the stage ``state`` names, once that stage is free."""
        kv_pipeline.producer_acquire(state)
        cute.copy(
            tma_atom, tiles_gmem[None, n_block], stages_smem[None, state.index],
            tma_bar_ptr=kv_pipeline.producer_get_barrier(state),
        )

    # ---- Consumers: GEMMs, softmax, epilogue --------------------------------------------------

    @cute.jit
    def consume(
        self,
        mO: cute.Tensor,
        mLSE: cute.Tensor | None,
        mSink: cute.Tensor | None,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        sO: cute.Tensor,
        tma_atom_o: cute.CopyAtom,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        pipeline_q: pipeline.PipelineAsync,
        pipeline_k: pipeline.PipelineAsync,
        pipeline_v: pipeline.PipelineAsync,
        scale_log2: Float32,
        tanh_scale: Float32,
        counts: LinearTileCounts | VarlenTileCounts,
        block_info: BlockInfo,
        seqlen: SeqlenInfo,
        cu_seqlens: dict,
        tiles: tuple,
        o_read: cute.Pointer | None,
    ):
        tidx = cute.arch.thread_idx()[0] - THREADS_PER_WARPGROUP
        wg_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        # Shared-memory operands are partitioned per warpgroup (WGMMA reads them as a whole).
        wg_mma_qk = tiled_mma_qk.get_slice(wg_idx * THREADS_PER_WARPGROUP)
        wg_mma_pv = tiled_mma_pv.get_slice(wg_idx * THREADS_PER_WARPGROUP)
        # Two Q stages: a stage mode last, the work tile's stage taken in ``consume_tile``.
        tSrQ = wg_mma_qk.make_fragment_A(wg_mma_qk.partition_A(sQ))
        tSrK = wg_mma_qk.make_fragment_B(wg_mma_qk.partition_B(sK))
        tOrVt = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(transposed(sV)))
        tOrP = wg_mma_pv.make_fragment_A(wg_mma_pv.partition_shape_A((self.tile_m, self.tile_n)))
        if cutlass.const_expr(self.hold_descriptors):
            tSrK, tOrVt = HeldStages(tSrK), HeldStages(tOrVt)
        acc_O = cute.make_rmem_tensor(
            tiled_mma_pv.partition_shape_C((self.tile_m, self.head_dim_v)), Float32
        )
        num_rows = cute.size(acc_as_rows_cols(acc_O), mode=[0])
        mask = AttentionMask(
            tile_m=self.tile_positions, tile_n=self.tile_n, seqlen=seqlen,
            pack_gqa=self.pack_gqa, window=self.window,
        )
        pending_scale = cute.make_rmem_tensor(num_rows, Float32)

        if cutlass.const_expr(self.pingpong):
            # The first consumer warpgroup goes first: pre-arrive on its own barrier.
            if wg_idx == 0:
                cute.arch.barrier_arrive(
                    barrier_id=int(NamedBarrier.SCHEDULER_WG0),
                    number_of_threads=2 * THREADS_PER_WARPGROUP,
                )

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        loop = Mainloop(
            thr_mma_qk=thr_mma_qk, tiled_mma_qk=tiled_mma_qk, tiled_mma_pv=tiled_mma_pv,
            tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt, tOrP=tOrP, acc_O=acc_O,
            pending_scale=pending_scale, mask=mask, pipeline_k=pipeline_k, pipeline_v=pipeline_v,
            wg_idx=wg_idx, tanh_scale=tanh_scale, sV=sV,
        )
        scheduler = self.make_scheduler(counts, cu_seqlens["mCuSeqlensQ"], tiles, producer=False)
        if cutlass.const_expr(self.dynamic):
            scheduler.consumer_start()
        work = scheduler.initial_work_tile()
        tile_args = dict(
            mO=mO, mLSE=mLSE, mSink=mSink, sO=sO, tma_atom_o=tma_atom_o, pipeline_q=pipeline_q,
            scale_log2=scale_log2, block_info=block_info, seqlen=seqlen, tidx=tidx,
            num_rows=num_rows, loop=loop, o_read=o_read, **cu_seqlens,
        )
        if cutlass.const_expr(self.persistent):
            while work.is_valid:
                q_state, kv_state = self.consume_tile(work, q_state, kv_state, **tile_args)
                work = scheduler.advance()
        else:
            q_state, kv_state = self.consume_tile(work, q_state, kv_state, **tile_args)
        if tidx < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def consume_tile(
        self, work: WorkTile, q_state, kv_state, *, mO, mLSE, mSink, sO, tma_atom_o, pipeline_q,
        scale_log2, block_info, seqlen, tidx, num_rows: cutlass.Constexpr[int], loop: Mainloop,
        o_read, mCuSeqlensQ, mCuSeqlensK, mSequsedK,
    ):
        """One work tile: the key tiles, then the epilogue; returns the advanced states."""
        if cutlass.const_expr(self.varlen):
            seqlen = SeqlenInfo.varlen(mCuSeqlensQ, mCuSeqlensK, mSequsedK, work.batch)
            loop = loop._replace(
                mask=AttentionMask(
                    tile_m=self.tile_positions, tile_n=self.tile_n, seqlen=seqlen,
                    pack_gqa=self.pack_gqa, window=self.window,
                )
            )
        if cutlass.const_expr(self.q_stages > 1):
            # This tile's Q stage: q_state advances once per tile with keys, as the producer's
            # does (a tile with no key neither loads nor reads Q).
            loop = loop._replace(tSrQ=loop.tSrQ[None, None, None, q_state.index])
        if cutlass.const_expr(self.hold_descriptors):
            loop = loop._replace(tSrQ=hold_k_slices(loop.tSrQ))
        acc_O, thr_mma_qk, pending_scale = loop.acc_O, loop.thr_mma_qk, loop.pending_scale
        m_block = work.m_block
        n_block_min, n_block_max = self.key_tile_range(block_info, seqlen, m_block)
        # Key tiles below the first one: those crossing the diagonal, then unmasked ones. A
        # local window: across its right bound, unmasked, across its left bound.
        num_causal_tiles = Int32(0)
        if cutlass.const_expr(self.causal):
            causal_start = block_info.n_block_causal_start(seqlen, m_block)
            num_causal_tiles = cutlass.max(n_block_max - 1 - causal_start, 0)
        num_unmasked_tiles = cutlass.max(n_block_max - 1 - num_causal_tiles, 0)
        num_left_masked = Int32(0)
        if cutlass.const_expr(self.window is not None):
            num_causal_tiles, num_unmasked_tiles, num_left_masked = (
                block_info.window_tile_counts(seqlen, m_block, n_block_min, n_block_max)
            )
        softmax = OnlineSoftmax(
            scale_log2, num_rows,
            rescale_threshold=0.0 if self.eager_rescale else RESCALE_THRESHOLD,
            exp2_poly_every=self.exp2_poly_every,
        )
        acc_O.fill(0.0)
        pending_scale.fill(1.0)
        # A warpgroup whose rows all lie past seqlen_q (the last query tile of a 192-row plan
        # at 1k queries: two of three) only keeps the pipelines and the ping-pong turning.
        run_tiles = n_block_max > n_block_min
        if cutlass.const_expr(self.skips_idle_warpgroups):
            first_row = m_block * self.tile_m + loop.wg_idx * tiling.WARPGROUP_ROWS
            if first_row >= seqlen.seqlen_q:
                if run_tiles:
                    wait_stage(pipeline_q, q_state)
                    kv_state = self.drain_tiles(loop, kv_state, n_block_max - n_block_min)
                    # Q's stage released once, as the tiles below release it (with a
                    # separate O after the drain: with one Q stage the producer asks for
                    # the next Q only after this tile's K / V loads; with two, it loaded it
                    # into the other stage already).
                    if cutlass.const_expr(self.q_free_after_qk):
                        pipeline_q.consumer_release(q_state)
                    if cutlass.const_expr(not self.persistent):
                        pipeline_q.consumer_release(q_state)
                    if cutlass.const_expr(not self.q_holds_o):
                        q_state.advance()
                run_tiles = cutlass.Boolean(False)
        if run_tiles:
            wait_stage(pipeline_q, q_state)
            # Q is read by no GEMM after the last S: the step of key tile n_block_min releases
            # it as soon as that S is done, with K (``release_q``), so the next tile's Q loads
            # while this one's last softmax, P V and epilogue run.
            release_q = None
            if cutlass.const_expr(self.q_free_after_qk):
                release_q = (pipeline_q, q_state, n_block_min)
            kv_state = self.first_tile(
                loop, kv_state, n_block_max - 1, m_block=m_block, softmax=softmax,
                release_q=release_q,
            )
            for i in cutlass.range(num_causal_tiles, unroll=1):
                kv_state = self.next_tile(
                    loop, kv_state, n_block_max - 2 - i, m_block=m_block, mask_causal=True,
                    softmax=softmax, release_q=release_q,
                )
            unmasked_end = num_unmasked_tiles
            if cutlass.const_expr(self.window is not None):
                unmasked_end = n_block_min + num_left_masked + num_unmasked_tiles
            for i in cutlass.range(num_unmasked_tiles, unroll=1):
                kv_state = self.next_tile(
                    loop, kv_state, unmasked_end - 1 - i, m_block=m_block,
                    mask_causal=False, softmax=softmax, release_q=release_q,
                )
            if cutlass.const_expr(self.window is not None):
                for i in cutlass.range(num_left_masked, unroll=1):
                    kv_state = self.next_tile(
                        loop, kv_state, n_block_min + num_left_masked - 1 - i, m_block=m_block,
                        mask_causal=True, softmax=softmax, release_q=release_q,
                    )
            # Left in flight: the epilogue's softmax.finalize runs under it.
            self.last_pv(loop, kv_state, n_block_min)
            if cutlass.const_expr(not self.persistent):
                pipeline_q.consumer_release(q_state)
            if cutlass.const_expr(not self.q_holds_o):
                q_state.advance()
        if cutlass.const_expr(self.q_holds_o or self.o_in_v):
            if n_block_max <= n_block_min:
                # The Q a tile with no key loads too (``produce_tile``). O in Q's buffer: O
                # must not land before it.
                wait_stage(pipeline_q, q_state)
                if cutlass.const_expr(self.o_in_v):
                    pipeline_q.consumer_release(q_state)
                    q_state.advance()

        # ---- Epilogue ------------------------------------------------------------------
        lse = cute.make_rmem_tensor(num_rows, Float32)
        score_coords = tile_coords(thr_mma_qk, (self.tile_m, self.tile_n))
        sinks = None
        if cutlass.const_expr(self.sink):
            sinks = row_sinks(mSink, work.head, score_coords, num_rows, self.pack_gqa)
        row_scale = softmax.finalize(lse, sinks)
        # A basic-block boundary on a per-thread condition (true only for a NaN lse, and then
        # harmless): without it ptxas hoists the wait below above the row sums' shuffles.
        if lse[0] != lse[0]:
            cute.arch.fence_view_async_shared()
        # Unconditional: on no path may acc_O be read while a GEMM could still write it (ptxas
        # would serialise every WGMMA of the kernel: C7514).
        warpgroup.wait_group(0)
        if run_tiles:
            kv_state = self.release_last_v(loop, kv_state)
        rescale_rows(acc_O, row_scale)
        positions_left = seqlen.seqlen_q - m_block * self.tile_positions
        gLSE = None
        if cutlass.const_expr(mLSE is None):
            rows_left = positions_left
            if cutlass.const_expr(self.pack_gqa > 1 and not self.varlen):
                rows_left = self.pack_gqa * cutlass.min(positions_left, self.tile_positions)
        elif cutlass.const_expr(self.varlen):
            gLSE = cute.local_tile(
                cute.domain_offset((seqlen.offset_q,), mLSE[None, work.head, 0]),
                (self.tile_m,), (m_block,),
            )
            rows_left = positions_left
        elif cutlass.const_expr(self.pack_gqa == 1):
            gLSE = cute.local_tile(
                mLSE[None, work.head, work.batch], (self.tile_m,), (m_block,)
            )
            rows_left = positions_left
        else:
            gLSE = cute.local_tile(
                mLSE[None, None, work.head, work.batch],
                (self.pack_gqa, self.tile_positions), (0, m_block),
            )
            rows_left = self.pack_gqa * cutlass.min(positions_left, self.tile_positions)
        gO = self.query_tile(mO, work, seqlen, columns=self.head_dim_v)
        self.store_o(gO, acc_O, sO, tma_atom_o, loop.tiled_mma_pv, tidx)
        if cutlass.const_expr(self.q_holds_o):
            # The next tile's Q may load into Q's buffer.
            self.wait_for_o_store_reads(tidx)
            pipeline_q.consumer_release(q_state)
            q_state.advance()
        if cutlass.const_expr(self.o_in_v):
            # The next tile's V may load into V's stages.
            self.wait_for_o_store_reads(tidx)
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_arrive(o_read)
        # Last: LSE stores in flight before a fence to the async proxy (O's store; the wait
        # before Q's or V's buffer is handed back) made it wait for them (ncu: that fence's
        # long-scoreboard stalls were ~7x cuDNN's).
        if cutlass.const_expr(mLSE is not None):
            store_lse(gLSE, lse, score_coords, rows_left)
        return q_state, kv_state

    @cute.jit
    def wait_for_o_store_reads(self, tidx: Int32):
        """This warp, once O's store has read sO (the TMA store: warp 0, which issued it, waits
        for it; the others' arrivals count only with warp 0's), with those reads ordered before
        a later TMA (async proxy) write there."""
        if tidx < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.fence_view_async_shared()
        cute.arch.sync_warp()

    @cute.jit
    def qk_gemm(self, tiled_mma_qk, tSrQ, tSrK, stage: Int32, wait_groups: cutlass.Constexpr[int]):
        acc_S = cute.make_rmem_tensor(
            tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32
        )
        gemm(tiled_mma_qk, acc_S, tSrQ, operand_stage(tSrK, stage), zero_init=True,
             wait_groups=wait_groups)
        return acc_S

    @cute.jit
    def scores_to_probs(
        self,
        acc_S: cute.Tensor,
        n_block: Int32,
        *,
        thr_mma_qk,
        softmax: OnlineSoftmax,
        mask: AttentionMask,
        tanh_scale: Float32,
        m_block: Int32,
        is_first: cutlass.Constexpr[bool],
        mask_seqlen: cutlass.Constexpr[bool],
        mask_causal: cutlass.Constexpr[bool],
    ) -> cute.Tensor:
        """Soft-cap and mask S, run the online softmax on it in place; returns the O rescale
        factors."""
        capping.apply_softcap(acc_S, tanh_scale, self.softcap)
        if cutlass.const_expr(mask_causal):
            mask.apply(
                acc_S, thr_mma_qk, m_block, n_block, mask_seqlen=mask_seqlen,
                mask_causal=mask_causal,
            )
        elif cutlass.const_expr(mask_seqlen):
            # Only a key tile that reaches past seqlen_k has keys to hide (dense, 1k keys: no
            # tile does, and the first tile of each work tile skips ~100 selects per thread).
            if (n_block + 1) * self.tile_n > mask.seqlen.seqlen_k:
                hide_keys_past_seqlen(mask, acc_S, thr_mma_qk, m_block, n_block)
        return softmax.step(acc_S, is_first=is_first)

    def store_p(self, acc_S: cute.Tensor, tOrP: cute.Tensor):
        """P (fp32 accumulator) -> the 16-bit A operand of P V, in registers.

        The WGMMA accumulator of an m64nN tile and the register A operand of an m64nNk16 MMA
        share the thread -> element mapping, so the conversion is element-wise.
        """
        convert_packed(acc_S, tOrP)

    def scheduler_sync(self, wg_idx):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(
                barrier_id=int(NamedBarrier.SCHEDULER_WG0) + wg_idx,
                number_of_threads=2 * THREADS_PER_WARPGROUP,
            )

    def scheduler_arrive(self, wg_idx):
        if cutlass.const_expr(self.pingpong):
            next_wg = wg_idx + 1
            if cutlass.const_expr(self.num_consumer_wgs == 2):
                next_wg = 1 - wg_idx
            else:
                next_wg = next_wg % self.num_consumer_wgs
            cute.arch.barrier_arrive(
                barrier_id=int(NamedBarrier.SCHEDULER_WG0) + next_wg,
                number_of_threads=2 * THREADS_PER_WARPGROUP,
            )

    @cute.jit
    def first_tile(
        self, loop: Mainloop, kv_state, n_block: Int32, *, m_block: Int32,
        softmax: OnlineSoftmax, release_q=None,
    ):
        """The last visible key tile: seqlen (and causal) mask, the softmax initialised.
        release_q: (pipeline_q, q_state, n_block_min), Q's stage released after this S if
        ``n_block`` is the work tile's last key tile (``release_q_after``), or None."""
        # Outside the ping-pong: this GEMM waits for itself, and ptxas would sink the arrive
        # past the whole softmax below, holding the other warpgroup back once per work tile.
        wait_stage(loop.pipeline_k, kv_state)
        acc_S = self.qk_gemm(
            loop.tiled_mma_qk, loop.tSrQ, loop.tSrK, kv_state.index, wait_groups=0
        )
        loop.pipeline_k.consumer_release(kv_state)
        release_q_after(release_q, n_block)
        self.scores_to_probs(
            acc_S, n_block, thr_mma_qk=loop.thr_mma_qk, softmax=softmax, mask=loop.mask,
            tanh_scale=loop.tanh_scale, m_block=m_block, is_first=True, mask_seqlen=True,
            mask_causal=self.causal or self.window is not None,
        )
        self.store_p(acc_S, loop.tOrP)
        return kv_state

    @cute.jit
    def next_tile(
        self, loop: Mainloop, kv_state, n_block: Int32, *, m_block: Int32,
        softmax: OnlineSoftmax, mask_causal: cutlass.Constexpr[bool], release_q=None,
    ):
        """One key tile after the first. kv_state is the stage whose V (of the previous key
        tile) is still to be multiplied: S(n) is issued before P(n + 1) V(n + 1), and the
        softmax of S(n) runs while that P V is in flight. release_q: as in ``first_tile``."""
        thr_mma_qk, tiled_mma_qk = loop.thr_mma_qk, loop.tiled_mma_qk
        tiled_mma_pv = loop.tiled_mma_pv
        tSrQ, tSrK, tOrVt, tOrP = loop.tSrQ, loop.tSrK, loop.tOrVt, loop.tOrP
        acc_O, pending_scale, mask = loop.acc_O, loop.pending_scale, loop.mask
        pipeline_k, pipeline_v, wg_idx = loop.pipeline_k, loop.pipeline_v, loop.wg_idx
        v_state = kv_state.clone()
        kv_state.advance()
        wait_stage(pipeline_k, kv_state)
        self.scheduler_sync(wg_idx)
        acc_S = self.qk_gemm(tiled_mma_qk, tSrQ, tSrK, kv_state.index, wait_groups=-1)
        if cutlass.const_expr(self.rescale_o_before_pv):
            self.rescale_o(acc_O, pending_scale)
        wait_stage(pipeline_v, v_state)
        gemm(tiled_mma_pv, acc_O, tOrP, operand_stage(tOrVt, v_state.index),
             zero_init=False, wait_groups=-1)
        self.scheduler_arrive(wg_idx)
        warpgroup.wait_group(1)  # S is ready; P V may still run
        pipeline_k.consumer_release(kv_state)
        release_q_after(release_q, n_block)
        row_scale = self.scores_to_probs(
            acc_S, n_block, thr_mma_qk=thr_mma_qk, softmax=softmax, mask=mask,
            tanh_scale=loop.tanh_scale, m_block=m_block, is_first=False, mask_seqlen=False,
            mask_causal=mask_causal,
        )
        warpgroup.wait_group(0)
        pipeline_v.consumer_release(v_state)
        self.store_p(acc_S, tOrP)
        if cutlass.const_expr(self.rescale_o_before_pv):
            pending_scale.store(row_scale.load())
        else:
            self.rescale_o(acc_O, row_scale)
        return kv_state

    def rescale_o(self, acc_O: cute.Tensor, row_scale: cute.Tensor):
        if cutlass.const_expr(self.eager_rescale):
            rescale_rows(acc_O, row_scale)
        else:
            rescale_rows_where_needed(acc_O, row_scale)

    @cute.jit
    def drain_tiles(self, loop: Mainloop, kv_state, num_tiles: Int32):
        """A warpgroup with no rows in this tile: the K and V stages of its ``num_tiles`` key
        tiles waited for and released, and the ping-pong turns taken, in the order
        ``first_tile``, ``next_tile`` and ``last_pv`` take them, with no GEMM and no
        softmax."""
        pipeline_k, pipeline_v, wg_idx = loop.pipeline_k, loop.pipeline_v, loop.wg_idx
        wait_stage(pipeline_k, kv_state)
        pipeline_k.consumer_release(kv_state)
        for _ in cutlass.range(num_tiles - 1, unroll=1):
            v_state = kv_state.clone()
            kv_state.advance()
            wait_stage(pipeline_k, kv_state)
            self.scheduler_sync(wg_idx)
            wait_stage(pipeline_v, v_state)
            self.scheduler_arrive(wg_idx)
            pipeline_k.consumer_release(kv_state)
            pipeline_v.consumer_release(v_state)
        wait_stage(pipeline_v, kv_state)
        pipeline_v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    @cute.jit
    def last_pv(self, loop: Mainloop, kv_state, n_block: Int32):
        """Issue O += P V for the last key tile (``n_block``), which the overlapped loop leaves
        pending, and leaves it in flight: the epilogue waits for it (the row sums' reduction
        runs meanwhile) and then ``release_last_v``."""
        tiled_mma_pv, tOrVt, tOrP = loop.tiled_mma_pv, loop.tOrVt, loop.tOrP
        acc_O, pending_scale, pipeline_v = loop.acc_O, loop.pending_scale, loop.pipeline_v
        if cutlass.const_expr(self.rescale_o_before_pv):
            self.rescale_o(acc_O, pending_scale)
        wait_stage(pipeline_v, kv_state)
        gemm(tiled_mma_pv, acc_O, tOrP, operand_stage(tOrVt, kv_state.index),
             zero_init=False, wait_groups=-1)

    @cute.jit
    def release_last_v(self, loop: Mainloop, kv_state):
        """``last_pv``'s V stage, once its GEMM is done; returns the advanced state."""
        loop.pipeline_v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    @cute.jit
    def store_o(
        self,
        gO: cute.Tensor,
        acc_O: cute.Tensor,
        sO: cute.Tensor,
        tma_atom_o: cute.CopyAtom,
        tiled_mma_pv: cute.TiledMma,
        tidx: Int32,
    ):
        """O -> shared memory with stmatrix -> global with one TMA store (clipped to seqlen_q).

        The first consumer warp issues the store; before sO is written again it waits until the
        previous store has read it (the barrier then holds every other thread back).
        """
        rO = cute.make_fragment_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        if tidx < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        # sO is free (previous store read it; no warpgroup still reads Q or V, where O may
        # live).
        epilogue_threads = self.num_consumer_threads
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=epilogue_threads)
        stmatrix = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
        )
        smem_thr_store = cute.make_tiled_copy_C(stmatrix, tiled_mma_pv).get_slice(tidx)
        cute.copy(stmatrix, smem_thr_store.retile(rO), smem_thr_store.partition_D(sO))
        # Generic-proxy writes must be visible to the TMA (async proxy) before it reads them.
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=int(NamedBarrier.EPILOGUE), number_of_threads=epilogue_threads)
        if tidx < 32:
            tOsO, tOgO = tma_partition(
                tma_atom_o, self.query_smem(sO, self.head_dim_v), gO, tile_rank=cute.rank(gO)
            )
            cute.copy(tma_atom_o, tOsO, tOgO)
            cute.arch.cp_async_bulk_commit_group()


@cute.jit
def hide_keys_past_seqlen(
    mask: AttentionMask, acc_S: cute.Tensor, thr_mma_qk, m_block: Int32, n_block: Int32
):
    """The seqlen mask alone (a function of its own: the caller's dynamic branch then carries
    no mask object)."""
    mask.apply(acc_S, thr_mma_qk, m_block, n_block, mask_seqlen=True, mask_causal=False)


@cute.jit
def release_q_after(release_q, n_block: Int32):
    """``release_q`` = (pipeline_q, q_state, n_block_min) or None: Q's stage released once its
    last S (key tile ``n_block_min``, the last a work tile runs) is done, i.e. where the step
    of key tile ``n_block`` releases K if that is the one. Released at the loop's end instead,
    it waited for that tile's softmax, and the next work tile's Q (one stage: loaded only
    after both warpgroups release this one) for it too."""
    if cutlass.const_expr(release_q is not None):
        pipeline_q, q_state, n_block_min = release_q
        if n_block == n_block_min:
            pipeline_q.consumer_release(q_state)
