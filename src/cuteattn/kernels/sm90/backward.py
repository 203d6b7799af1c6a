"""Attention backward for the Hopper family: TMA + WGMMA + warp specialisation (sm_90a).

Same inputs and outputs as the sm80 backward (``kernels/sm80/backward.py``): q, dout, k, v in
flash-attn layouts; lse_log2 and dpsum from ``kernels/bwd_preprocess.py``, and the fp32 dq
accumulator, padded to whole query tiles; dk, dv written; dS K added to dq_accum (the
postprocess scales it).

One CTA owns one key tile (tile_n = 128 keys) of one KV head and visits every query tile of
every query head of the group (GQA / MQA without atomics on dK, dV). Its warpgroups:
  - warpgroup 0, the producer: warp 0 TMA-loads K and V once, then Q and dO of each
    (query head, m_block) step into two-stage rings (mbarrier pipelines), the step's lse with
    Q and its dpsum with dO (1-D bulk copies on the same barriers); warp 1 (deterministic,
    where two dQ buffers fit: warps 1 and 2, steps in turn) adds each step's dQ from shared
    memory to dq_accum with one bulk reduction (cp.reduce.async.bulk) per warpgroup share
    (d96: one, warpgroup 0's): L2 takes whole lines instead of one fp32 atomic per element,
    and the consumers only wait for the buffer, never for global memory.
    dq_accum is laid out for it: (batch, heads, chunks, rows, chunk dim), a chunk per
    warpgroup share of the columns, so
    that each share of a query tile is one contiguous block (family.py ``dq_accum_chunks``),
    which holds the share in the fragment order of the dQ GEMM's accumulator (FlashAttention-4's
    layout: thread t's values 4i..4i+3 at floats (128 i + t) * 4 of its warpgroup's buffer, so
    that each warp stores 512 contiguous bytes, without bank conflicts or row padding; the
    postprocess, ``kernels/sm90/dq_postprocess.py``, puts them back in rows).
  - warpgroups 1 and 2, the consumers: each owns 64 of the tile's keys, with its dK and dV
    rows in registers. Per step, keys along M ("swapped" GEMMs, as FlashAttention-3):
      1. S^T = K Q^T and dP^T = V dO^T (WGMMA, operands in shared memory);
      2. mask (only tiles holding a key past seqlen_k or above the causal diagonal),
         P^T = exp2(S^T * scale_log2 - lse) while dP^T is still running, dS^T = P^T (dP^T -
         dpsum), lse and dpsum read from shared memory per query column;
      3. dV += P^T dO (issued before the wait for dP^T) and dK += dS^T Q with P^T, dS^T as
         register A operands (their accumulator layout is WGMMA's A layout), dO and Q read
         MN-major from shared memory;
      4. dS^T to shared memory (stmatrix, two buffers so the next step never waits for this
         one's readers); dQ = dS K (A = dS, B = K^T, both MN-major from shared memory) to the
         dQ buffer for the writer warp, in fragment order. d64 / d128: the two warpgroups
         split dQ's columns (32 / 64 each, one swizzle atom of K: ``k_smem_layout``), meeting
         on a 256-thread barrier, one
         add per element; d64's 128-row query tiles split the rows instead (each warpgroup
         its 64 queries, every column, same barrier); d96, whose half is not a whole swizzle
         atom: warpgroup 0 alone computes all of dQ over all 128 keys (reading both
         warpgroups' dS^T after the same 256-thread barrier) into the one buffer, one add per
         element (FlashAttention-4's dQ_single_wg; family.py ``backward_dq_single_wg``), and
         warpgroup 1 skips the dQ GEMM and the hand-over. (Each warpgroup adding its own
         keys' share of every column, two adds per element, remains the code's fallback.)
    Then dK *= softmax_scale; dK and dV go through K's and V's buffers (stmatrix) to global
    memory by TMA, which clips the rows past seqlen_k.

Deterministic (``deterministic=True``): warp 1 adds a query tile's dQ in a fixed key-tile
order (``kernels/common/turns.py``; causal: descending, the last key tiles dispatched first),
waiting for each step's additions to complete. Fixed length, the CTAs come in L2 sections, the
(batch, KV head) pairs of a section taking turns at each key tile (``turns.section_work_tile``),
so that fewer additions queue behind each other at a query tile. Where they fit (all but d128's
80-row tile, ``family.backward_dq_slots``): two dQ buffers per consumer warpgroup, used by step
parity, each with its writer warp (warp 1 the even steps, warp 2 the odd ones:
``add_dq_two_slots``), so that consecutive steps' L2 round trips overlap. A query tile's first
turn stores its dQ (a bulk copy) where the others add, so dq_accum needs no zero fill where
every query tile has one (``ops.dq_accum_needs_zeros``).

Not deterministic, fixed length, no window, d64 / d256, and d96 / d192 up to 4k keys (the plan's
``claims``: ``family.claims_first_addition``; d128 lost 2-4% to the per-step protocol): the
additions come in any order, but the first to
a query tile is claimed (a compare-and-swap on its counter, ``turns.claim``) and stores its dQ;
the others add once that store is performed, so dq_accum needs no zero fill there either.
Dense, each key tile starts at its own share of the query tiles (``step_tile``'s rotation), so
that a query tile's visits come a step or more apart and seldom wait for a claim.

Constraints: fp16/bf16; head_dim 64, 96, 128 (192 and 256: ``backward_wide.py``, a subclass);
tile_m 64 (d64: or 128; d128: or 80, dQ then computed transposed), tile_n 128 (two consumer
warpgroups), Q / dO stages 2 (``family.BACKWARD_TILES``).
"""

import enum
import functools

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as hopper
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.experimental import primitives as prims

from cuteattn.kernels.common import mask
from cuteattn.kernels.common import softcap as capping
from cuteattn.kernels.common import turns
from cuteattn.kernels.common.block_info import BlockInfo
from cuteattn.kernels.common.compile_args import check_same_dtype
from cuteattn.kernels.common.convert import convert_packed
from cuteattn.kernels.common.fragments import acc_as_rows_cols, tile_coords
from cuteattn.kernels.common.kernel_base import AttentionKernel
from cuteattn.kernels.common.opaque import computed_here
from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.smem_tiles import transposed
from cuteattn.kernels.common.tile_scheduler import (
    LinearTileCounts,
    LinearTileScheduler,
    VarlenTileCounts,
    VarlenTileScheduler,
    make_tail_section_counts,
    make_varlen_tile_counts,
)
from cuteattn.kernels.sm90.family import (
    CLAIM_HEAD_DIMS,
    SHORT_CLAIM_HEAD_DIMS,
    backward_dq_chunks,
    backward_dq_single_wg,
    backward_dq_slots,
    backward_dq_splits_rows,
    backward_do_stages,
    backward_smem_bytes,
    claims_first_addition,
)
from cuteattn.kernels.sm90.dq_fragments import DqSplit, fragment_slots, fragment_vectors
from cuteattn.kernels.sm90.ragged import packed_tma_view, sequence_rows
from cuteattn.kernels.sm90.smem import permuted, smem_layout, tma_tile
from cuteattn.kernels.sm90.warpgroup import (
    THREADS_PER_WARPGROUP,
    HeldStages,
    gemm,
    hold_base,
    operand_stage,
    tma_pipeline,
)

KEYS_PER_WARPGROUP = 64
NUM_CONSUMER_WGS = 2
DS_STAGES = 2
DQ_WRITER_WARP = 1
# Two dQ slots (``dq_slots``): warp 1 adds the even steps' dQ (slot 0), this warp the odd ones'.
DQ_SECOND_WRITER_WARP = 2


class BackwardBarrier(enum.IntEnum):
    """Hardware barrier ids (0 is __syncthreads); the +wg ones come in one per consumer
    warpgroup."""

    # dS^T of this step is in shared memory: split by keys, per warpgroup (128 threads); split
    # by dim or rows, or warpgroup 0 alone computing dQ (d96), DS_READY alone (256 threads).
    # The wide kernels (backward_wide.py): DS_READY and PDS_FREE alone, each warpgroup's dQ
    # reading every key of dS.
    DS_READY = 1
    # A warpgroup's dQ buffer: EMPTY once its writer warp's bulk reductions have read it
    # (two slots: performed, and the turn passed), FULL once the warpgroup has written it
    # (128 + 32 threads).
    DQ_EMPTY = 3
    DQ_FULL = 5
    # The second dQ buffers' pair (``dq_slots`` 2): DQ_EMPTY and DQ_FULL + DQ_SECOND_SLOT.
    DQ_EMPTY_SECOND = 12
    DQ_FULL_SECOND = 14
    # Consumers (256 threads): done with K and V, then dK and dV are in their buffers.
    EPILOGUE = 9
    # The wide variant's single P / dS buffers are free again (backward_wide.py).
    PDS_FREE = 7


DQ_SECOND_SLOT = BackwardBarrier.DQ_EMPTY_SECOND - BackwardBarrier.DQ_EMPTY
assert DQ_SECOND_SLOT == BackwardBarrier.DQ_FULL_SECOND - BackwardBarrier.DQ_FULL


class FlashBackwardSm90(AttentionKernel):
    def __init__(
        self, *, num_stages: int, deterministic: bool = False, hold_descriptors: bool = False,
        claims: bool = False, **shape,
    ):
        """hold_descriptors: the GEMMs' shared-memory descriptors computed once per kernel
        and kept in registers (``warpgroup.HeldStages``). claims: each query tile's first dQ
        addition claimed and stored (``family.claims_first_addition``: not deterministic,
        fixed length, no window). shape: ``AttentionKernel``'s fields."""
        super().__init__(**shape)
        self.num_stages = num_stages
        # dO's stages: Q's, or fewer (``family.BACKWARD_DO_STAGES``; the wide kernel only).
        self.do_stages = backward_do_stages(self.head_dim, self.tile_m, self.tile_n, num_stages)
        self.deterministic = deterministic
        # A query tile's first addition claimed and stored (``turns.claim``), dq_accum
        # unzeroed (the plan's ``claims``).
        if claims and not claims_first_addition(
            deterministic=deterministic, varlen=self.varlen, window=self.window,
            head_dim=self.head_dim,
        ):
            raise ValueError(
                "claims: only non-deterministic fixed-length kernels without a window at head "
                f"dims {CLAIM_HEAD_DIMS + SHORT_CLAIM_HEAD_DIMS} claim their first additions"
            )
        self.claims = claims
        # Causal, fixed length, not deterministic: the key tiles (key tile 0 the heaviest) in
        # ``make_tail_section_counts``' order, so that GQA launches do not end on heavy tiles.
        self.heaviest_first = (
            not deterministic and not self.varlen and self.causal and self.window is None
        )
        self.hold_descriptors = hold_descriptors
        self.num_consumer_threads = NUM_CONSUMER_WGS * THREADS_PER_WARPGROUP
        self.num_threads = (1 + NUM_CONSUMER_WGS) * THREADS_PER_WARPGROUP
        self.consumer_regs, self.producer_regs = 240, 24
        # d128's per-warpgroup dQ share (64 x 128 fp32) would leave ptxas too few registers to
        # keep WGMMAs in flight (C7512: every WGMMA serialised): split dQ's columns instead;
        # d64 splits them too in 64-row query tiles (one bulk addition per element instead of
        # two: half the L2 reduction traffic) and its rows in 128-row ones (each warpgroup its
        # 64 queries: m64n64 WGMMAs, and K keeps its full-width swizzle), d96 cannot (48
        # columns are no whole swizzle atom): warpgroup 0 computes it alone (``dq_single_wg``).
        # Each consumer warpgroup's share goes through a (tile_m, dq_chunk_cols) buffer, as
        # dq_accum's chunks hold it: in fragment order, or (wide kernels) in padded rows.
        chunks, row_pad = backward_dq_chunks(self.head_dim, self.tile_m)
        # 128-row query tiles: each warpgroup its 64 queries' dQ, every column.
        self.dq_split_rows = backward_dq_splits_rows(self.head_dim, self.tile_m)
        self.dq_split_dim = chunks == NUM_CONSUMER_WGS
        # A query tile that is no multiple of WGMMA's M (FlashAttention-4's 80 rows at d128):
        # dQ^T = K^T dS^T, dim along M, the warpgroups splitting it.
        self.dq_transposed = self.tile_m % 64 != 0
        # Query tiles past 64 rows hold more score registers per thread: dV is issued after
        # dS^T is formed (see ``consume``).
        self.dv_after_ds = self.tile_m > 64
        # Taller query tiles read each step's lse / dpsum as 2 values per lane and 64 query
        # columns, shuffled to the lanes that need them (``own_stats``), instead of a shared
        # memory load per column: 1.05-1.09x faster at d64 (128 rows); 64-row tiles keep the
        # loads (the shuffles cost d128 1-5%, d96 1%; twelfth session, docs/PERF.md). So does
        # d128's 80-row tile (FlashAttention-4's loads: 10 LDS.64 per statistic): shuffled, its
        # 40 SHFL per step sit after the dP^T wait and ptxas hoists that wait above every
        # exponential and even the lse FFMAs, so nothing of the softmax overlaps dP^T.
        self.shuffle_stats = self.dv_after_ds and not self.dq_transposed
        # dpsum loaded before the dP^T wait (FlashAttention-4's order) where it is one load per
        # column pair: in flight while dP^T runs.
        self.early_dpsum = self.dv_after_ds and not self.shuffle_stats
        # 64-row tiles: dV's k-blocks issued before dP^T's wait (the exponentials overlap dP^T),
        # the rest after dS^T is stored (in flight at the DS_READY barrier). None: all first.
        self.dv_first_k_blocks = None if self.dv_after_ds else tuple(range(0, self.tile_m // 32))
        assert not self.dq_transposed or self.dq_split_dim, "a transposed dQ splits dim"
        self.dq_chunk_cols = self.head_dim // chunks
        self.dq_row = self.dq_chunk_cols + row_pad
        # Rows of a warpgroup's dQ buffer (and of its bulk addition).
        self.dq_buffer_rows = self.tile_m // NUM_CONSUMER_WGS if self.dq_split_rows else self.tile_m
        self.dq_passes = 1  # dQ GEMMs (and buffer hand-overs) per warpgroup and step
        # d96 (split neither by rows nor by columns): warpgroup 0 alone computes dQ over all
        # the tile's keys (FlashAttention-4's dQ_single_wg), one buffer (per slot) and one bulk
        # addition per step; warpgroup 1 skips the dQ GEMM and the hand-over.
        self.dq_single_wg = backward_dq_single_wg(self.head_dim, self.tile_m)
        # Warpgroups that hand dQ to the writer warp(s) (a buffer and a DQ_EMPTY / DQ_FULL pair
        # each, per slot).
        self.dq_wgs = 1 if self.dq_single_wg else NUM_CONSUMER_WGS
        # Buffers (and barrier pairs) per such warpgroup, used in turn step by step (2: the
        # deterministic kernels up to d128 but the 80-row one, ``backward_dq_slots``).
        self.dq_slots = backward_dq_slots(
            self.head_dim, self.tile_m, self.tile_n, self.num_stages, deterministic
        )
        # Turns pass per step, so two slots need them, and one bulk addition per warpgroup and
        # step (``add_dq_two_slots`` adds pass 0 only; the wide kernels get one slot).
        assert self.dq_slots == 1 or deterministic, "two dQ slots are the deterministic kernel's"
        assert self.dq_slots == 1 or self.dq_passes == 1, "two dQ slots take one dQ pass"
        # The floats of one slot's buffers (every warpgroup's): the slot stride of sdQ.
        self.dq_slot_elems = self.dq_wgs * self.dq_buffer_rows * self.dq_row
        # The consumers' barrier around the dK / dV tiles in shared memory.
        self.epilogue_sync = functools.partial(
            cute.arch.barrier, barrier_id=int(BackwardBarrier.EPILOGUE),
            number_of_threads=self.num_consumer_threads,
        )

    def dq_chunk(self, wg: int, dq_pass: int) -> int:
        """The dq_accum chunk that warpgroup ``wg``'s pass ``dq_pass`` adds to."""
        return wg if self.dq_split_dim else 0

    def dq_blocks_shared(self, dq_pass: int) -> bool:
        """Whether both warpgroups add to the same block of dq_accum (split by keys; never
        where warpgroup 0 alone hands dQ over)."""
        if self.dq_single_wg:
            return False
        return not self.dq_split_rows and self.dq_chunk(0, dq_pass) == self.dq_chunk(1, dq_pass)

    def k_smem_layout(self):
        """K's buffer (tile_n, head_dim). Split by dim, each warpgroup's dQ reads its half of
        K^T as an MN-major operand, which must start on a swizzle atom: the atom is sized to
        half the dim (d64: 32 columns, 64-byte swizzle; d128: 64, 128-byte)."""
        atom_cols = self.head_dim // NUM_CONSUMER_WGS if self.dq_split_dim else None
        return smem_layout(self.dtype, self.tile_n, self.head_dim, atom_cols=atom_cols)

    def pds_layout(self):
        """The bf16 score-gradient buffers: dS^T (keys, queries), queries contiguous, read as
        dS (queries x keys), MN-major; two stages."""
        return smem_layout(self.dtype, self.tile_n, self.tile_m, DS_STAGES)

    def make_tiled_mmas(self):
        """(S / dP, dK / dV, dQ) tiled MMAs."""
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        # S^T = K Q^T, dP^T = V dO^T: (keys, queries), one warpgroup per 64 keys.
        tiled_mma_sdp = hopper.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, k_major, Float32,
            atom_layout_mnk=(NUM_CONSUMER_WGS, 1, 1), tiler_mn=(64, self.tile_m),
        )
        # dV += P^T dO, dK += dS^T Q: (keys, dim), A from registers, B MN-major.
        tiled_mma_dkv = hopper.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, mn_major, Float32,
            atom_layout_mnk=(NUM_CONSUMER_WGS, 1, 1), tiler_mn=(64, self.head_dim),
            a_source=warpgroup.OperandSource.RMEM,
        )
        # dQ = dS K (dQ^T = K^T dS^T where transposed): ``DqSplit.tiled_mma``.
        tiled_mma_dq = DqSplit(self.head_dim, self.tile_m).tiled_mma(self.dtype)
        return tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mK: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mV: cute.Tensor,
        mdO: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mLSE: cute.Tensor,  # (batch, heads_q, rows) fp32, log2 units
        mDpsum: cute.Tensor,  # (batch, heads_q, rows) fp32
        mdQaccum: cute.Tensor,  # (batch, heads_q, chunks, rows, chunk dim + pad) fp32
        mdK: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mdV: cute.Tensor,
        mSemaphore: cute.Tensor | None,  # turns or claims: (batch, heads_q, m_blocks) int32
        mCuSeqlensQ: cute.Tensor | None,  # varlen: (batch + 1,) int32 row offsets, else None
        mCuSeqlensK: cute.Tensor | None,
        mSequsedK: cute.Tensor | None,  # varlen: keys used per sequence, or None
        max_seqlen_k: Int32,  # varlen: the longest key sequence (bounds the grid), else unused
        softmax_scale: Float32,
        stream,
    ):
        check_same_dtype(q=mQ, k=mK, v=mV, dout=mdO, dk=mdK, dv=mdV)
        # Batch, heads and lengths of the flash-attn views, before the TMA views permute them.
        num_batches, num_heads_kv, num_key_tiles = (
            mK.shape[0], mK.shape[2], cute.ceil_div(mK.shape[1], self.tile_n)
        )
        grid = (num_key_tiles, num_heads_kv, num_batches)
        tile_counts = None
        if cutlass.const_expr(self.deterministic and not self.varlen):
            # Pairs take turns at each key tile within L2 sections (``turns``). A pair streams
            # the query rows of its group's query heads (GQA: group x seqlen_q).
            elem_bytes = self.dtype.width // 8
            tile_counts = turns.make_section_counts(
                seqlen_q=mQ.shape[1] * (mQ.shape[2] // num_heads_kv), seqlen_k=mK.shape[1],
                tile_n=self.tile_n,
                num_heads_kv=num_heads_kv, num_batches=num_batches,
                query_row_bytes=(self.head_dim + self.head_dim_v) * elem_bytes
                + self.head_dim * Float32.width // 8,
            )
            grid = LinearTileScheduler.grid_shape(tile_counts)
        if cutlass.const_expr(self.heaviest_first):
            # Causal: the pairs of a section take turns at each key tile, key tile 0 first.
            tile_counts = make_tail_section_counts(
                num_ranks=num_key_tiles, num_heads=num_heads_kv, num_batches=num_batches,
                group=mQ.shape[2] // num_heads_kv,
            )
            grid = LinearTileScheduler.grid_shape(tile_counts)
        if cutlass.const_expr(self.varlen):
            # Packed (1, total, heads, dim): a CTA per key tile of each sequence and KV head.
            tile_counts = make_varlen_tile_counts(
                total_rows=mK.shape[1], max_length=max_seqlen_k, tile=self.tile_n,
                num_heads=num_heads_kv, num_batches=mCuSeqlensQ.shape[0] - 1,
            )
            grid = VarlenTileScheduler.grid_shape(tile_counts)
        # TMA boxes tile the first two modes: (seqlen, dim, heads, batch); a packed batch's
        # (1, total, heads, dim) as ragged views (``ragged``: boxes stop at each sequence's end).
        if cutlass.const_expr(self.varlen):
            tQ, tK, tV, tdO, tdK, tdV = (
                packed_tma_view(t) for t in (mQ, mK, mV, mdO, mdK, mdV)
            )
        else:
            tQ, tK, tV, tdO, tdK, tdV = (
                permuted(t, [1, 3, 2, 0]) for t in (mQ, mK, mV, mdO, mdK, mdV)
            )

        sQ_layout = smem_layout(self.dtype, self.tile_m, self.head_dim, self.num_stages)
        sKV_layout = smem_layout(self.dtype, self.tile_n, self.head_dim)
        # dO and V: dim_v columns (the same layouts where dim_v == dim).
        sdO_layout = smem_layout(self.dtype, self.tile_m, self.head_dim_v, self.do_stages)
        sV_layout = smem_layout(self.dtype, self.tile_n, self.head_dim_v)
        sK_layout = self.k_smem_layout()
        sPdS_layout = self.pds_layout()
        # lse and dpsum of a step's queries, one per Q / dO stage.
        sRow_layout = cute.make_layout((self.tile_m, self.num_stages))
        sDpsum_layout = cute.make_layout((self.tile_m, self.do_stages))
        # A buffer per warpgroup that hands dQ over, (rows, (chunk cols, warpgroup)): the wide
        # kernels' padded rows (split by dim, the two buffers side by side are the
        # (tile_m, head_dim) tile of dQ); in fragment order the same bytes hold each buffer's
        # flat block. d96 (``dq_single_wg``): warpgroup 0's only.
        sdQ_layout = cute.make_layout(
            (self.dq_buffer_rows, (self.dq_chunk_cols, self.dq_wgs)),
            stride=(self.dq_row, (1, self.dq_buffer_rows * self.dq_row)),
        )
        # Wide kernels' whole padded rows: each bulk reduction reads its last row's pad too.
        sdQ_elems = self.dq_slot_elems
        if cutlass.const_expr(self.dq_slots > 1):
            # (rows, (chunk cols, warpgroup), slot)
            sdQ_layout = cute.make_layout(
                (self.dq_buffer_rows, (self.dq_chunk_cols, self.dq_wgs), self.dq_slots),
                stride=(self.dq_row, (1, self.dq_buffer_rows * self.dq_row), sdQ_elems),
            )
            sdQ_elems *= self.dq_slots

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            mbar_do: cute.struct.MemRange[cutlass.Int64, 2 * self.do_stages]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdO_layout)], 1024]
            sPdS: cute.struct.Align[
                cute.struct.MemRange[self.dtype, cute.cosize(sPdS_layout)], 1024
            ]
            sdQ: cute.struct.Align[
                cute.struct.MemRange[Float32, sdQ_elems], 1024
            ]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sRow_layout)], 16]
            sDpsum: cute.struct.Align[
                cute.struct.MemRange[Float32, cute.cosize(sDpsum_layout)], 16
            ]

        # The planner sizes plans by the family's model of this struct (``can_implement``).
        smem_model = backward_smem_bytes(
            self.head_dim, self.tile_m, self.tile_n, self.num_stages, self.dq_slots,
            self.head_dim_v,
        )
        assert SharedStorage.size_in_bytes() == smem_model, (
            f"SharedStorage {SharedStorage.size_in_bytes()} bytes, family model {smem_model}"
        )

        tma_load = cpasync.CopyBulkTensorTileG2SOp()
        q_stage_layout = cute.select(sQ_layout, mode=[0, 1])
        do_stage_layout = cute.select(sdO_layout, mode=[0, 1])
        tma_atom_q, tma_q = cpasync.make_tiled_tma_atom(
            tma_load, tQ, q_stage_layout, (self.tile_m, self.head_dim), 1
        )
        tma_atom_do, tma_do = cpasync.make_tiled_tma_atom(
            tma_load, tdO, do_stage_layout, (self.tile_m, self.head_dim_v), 1
        )
        tma_atom_k, tma_k = cpasync.make_tiled_tma_atom(
            tma_load, tK, sK_layout, (self.tile_n, self.head_dim)
        )
        tma_atom_v, tma_v = cpasync.make_tiled_tma_atom(
            tma_load, tV, sV_layout, (self.tile_n, self.head_dim_v)
        )
        # dK and dV leave through K's and V's buffers (TMA clips rows past seqlen_k).
        tma_store = cpasync.CopyBulkTensorTileS2GOp()
        tma_atom_dk, tma_dk = cpasync.make_tiled_tma_atom(
            tma_store, tdK, sK_layout, (self.tile_n, self.head_dim)
        )
        tma_atom_dv, tma_dv = cpasync.make_tiled_tma_atom(
            tma_store, tdV, sV_layout, (self.tile_n, self.head_dim_v)
        )
        # Q with its lse, dO with its dpsum; K and V on one barrier (varlen), else on the first
        # step's Q and dO barriers (``produce``): (K's, V's) bytes.
        q_tile_bytes = cute.size_in_bytes(self.dtype, q_stage_layout) + self.tile_m * 4
        do_tile_bytes = cute.size_in_bytes(self.dtype, do_stage_layout) + self.tile_m * 4
        kv_tile_bytes = (
            cute.size_in_bytes(self.dtype, sKV_layout), cute.size_in_bytes(self.dtype, sV_layout)
        )

        tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq = self.make_tiled_mmas()

        self.kernel(
            mQ, mK, mdO, mLSE, mDpsum, mdQaccum, mSemaphore,
            mCuSeqlensQ, mCuSeqlensK, mSequsedK, tile_counts,
            tma_q, tma_k, tma_v, tma_do, tma_dk, tma_dv,
            tma_atom_q, tma_atom_k, tma_atom_v, tma_atom_do, tma_atom_dk, tma_atom_dv,
            capping.exp2_scale(softmax_scale, self.softcap), softmax_scale,
            sQ_layout, sK_layout, sKV_layout, sPdS_layout, sdQ_layout,
            sRow_layout, sdO_layout, sV_layout,
            tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq,
            q_tile_bytes, do_tile_bytes, kv_tile_bytes, SharedStorage,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
            use_pdl=True,
        )

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,  # flash-attn views: lengths and heads
        mK: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mDpsum: cute.Tensor,
        mdQaccum: cute.Tensor,
        mSemaphore: cute.Tensor | None,
        mCuSeqlensQ: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
        mSequsedK: cute.Tensor | None,
        # varlen: the key tiles of the sequences; fixed-length deterministic: their sections;
        # causal otherwise: the tail sections (``make_tail_section_counts``)
        tile_counts: VarlenTileCounts | LinearTileCounts | None,
        tQ: cute.Tensor,  # TMA views, (seqlen, dim, heads, batch); varlen: ``packed_tma_view``
        tK: cute.Tensor,
        tV: cute.Tensor,
        tdO: cute.Tensor,
        tdK: cute.Tensor,
        tdV: cute.Tensor,
        tma_atom_q: cute.CopyAtom,
        tma_atom_k: cute.CopyAtom,
        tma_atom_v: cute.CopyAtom,
        tma_atom_do: cute.CopyAtom,
        tma_atom_dk: cute.CopyAtom,
        tma_atom_dv: cute.CopyAtom,
        scale_log2: Float32,
        softmax_scale: Float32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        sPdS_layout: cute.ComposedLayout,
        sdQ_layout: cute.Layout,
        sRow_layout: cute.Layout,
        sdO_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        tiled_mma_sdp: cute.TiledMma,
        tiled_mma_dkv: cute.TiledMma,
        tiled_mma_dq: cute.TiledMma,
        q_tile_bytes: cutlass.Constexpr[int],
        do_tile_bytes: cutlass.Constexpr[int],
        kv_tile_bytes: cutlass.Constexpr,  # (K's, V's)
        SharedStorage: cutlass.Constexpr,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        descending = self.deterministic and (self.causal or self.window is not None)
        if cutlass.const_expr(self.varlen):
            # Every warp decodes its CTA's key tile (the scan takes whole warps); in turn order
            # within each (sequence, KV head), as ``turns.section_work_tile`` below.
            # Key tiles that differ in work (causal, a window): a sequence's heads take turns.
            # The longest sequences first: the launch ends on short ones' tiles.
            work = VarlenTileScheduler.create(
                tile_counts, mCuSeqlensK, tile=self.tile_n, longest_first=descending,
                heads_fastest=self.causal or self.window is not None,
                sequences_longest_first=True,
            ).initial_work_tile()
            n_block, head_kv, batch = work.m_block, work.head, work.batch
        else:
            if cutlass.const_expr(self.deterministic):
                n_block, head_kv, batch = turns.section_work_tile(tile_counts, descending)
            elif cutlass.const_expr(self.heaviest_first):
                work = LinearTileScheduler.create(
                    tile_counts, longest_first=False
                ).initial_work_tile()
                n_block, head_kv, batch = work.m_block, work.head, work.batch
            else:
                n_block, head_kv, batch = cute.arch.block_idx()
            # Kept in a register: left to the compiler, every key-loop step that needs it
            # (the causal / window mask checks) reads %ctaid.x again (``computed_here``).
            n_block = computed_here(n_block)
        if warp_idx == 0:
            for atom in (
                tma_atom_q, tma_atom_k, tma_atom_v, tma_atom_do, tma_atom_dk, tma_atom_dv
            ):
                cpasync.prefetch_descriptor(atom)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        # K and V come on the first step's Q and dO barriers (``produce``).
        pipeline_q = self.tma_pipeline(storage.mbar_q.data_ptr(), self.num_stages, q_tile_bytes)
        pipeline_do = self.tma_pipeline(storage.mbar_do.data_ptr(), self.do_stages, do_tile_bytes)
        pipeline.pipeline_init_arrive()
        pipeline.pipeline_init_wait()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sPdS = storage.sPdS.get_tensor(sPdS_layout.outer, swizzle=sPdS_layout.inner)
        sdQ = storage.sdQ.get_tensor(sdQ_layout)
        sLSE = storage.sLSE.get_tensor(sRow_layout)
        sDpsum = storage.sDpsum.get_tensor(cute.make_layout((self.tile_m, self.do_stages)))

        if cutlass.const_expr(self.varlen):
            seqlen = SeqlenInfo.varlen(
                mCuSeqlensQ, mCuSeqlensK, mSequsedK, batch, rows_tile=self.tile_m
            )
        else:
            seqlen = SeqlenInfo.fixed(mQ, mK)
        group = mQ.shape[2] // mK.shape[2]
        block_info = self.block_info()
        m_block_min = block_info.m_block_min(seqlen, n_block)
        m_block_max = cute.ceil_div(seqlen.seqlen_q, self.tile_m)
        if cutlass.const_expr(self.window is not None):
            m_block_max = block_info.m_block_max(seqlen, n_block)
        num_m_blocks = cutlass.max(m_block_max - m_block_min, 0)
        if cutlass.const_expr(self.varlen):
            # A key tile past its sequence's keys (the grid's CTAs past the last key tile)
            # visits no query tile (deterministic: the turns count this sequence's tiles).
            if n_block * self.tile_n >= seqlen.seqlen_k:
                num_m_blocks = Int32(0)
        steps = dict(
            head_kv=head_kv, group=group, m_block_min=m_block_min, num_m_blocks=num_m_blocks
        )
        if cutlass.const_expr(self.claims and not self.causal):
            # Dense, every key tile would reach query tile m at its step m, together: one
            # claims it and the others wait for its store. Each starts at its own share of the
            # query tiles instead, so a query tile's first visit comes a step or more before
            # the next (causal: each key tile starts at its diagonal already).
            num_key_tiles = cute.ceil_div(seqlen.seqlen_k, self.tile_n)
            # In 64 bits: the product passes 2^31 from about 4M x 4M tokens.
            steps["rotation"] = Int32(
                cutlass.Int64(n_block) * cutlass.Int64(num_m_blocks) // cutlass.Int64(num_key_tiles)
            )

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.produce(
                    tQ, tK, tV, tdO, mLSE, mDpsum, sQ, sK, sV, sdO, sLSE, sDpsum, tma_atom_q,
                    tma_atom_k, tma_atom_v, tma_atom_do, pipeline_q, pipeline_do, n_block,
                    batch, steps, seqlen, kv_tile_bytes,
                )
            elif warp_idx == DQ_WRITER_WARP:
                if cutlass.const_expr(self.dq_slots > 1):
                    self.add_dq_two_slots(
                        mdQaccum, mSemaphore, sdQ, block_info, seqlen, n_block, batch, steps, 0
                    )
                else:
                    self.add_dq(
                        mdQaccum, mSemaphore, sdQ, block_info, seqlen, n_block, batch, steps
                    )
            if cutlass.const_expr(self.dq_slots > 1):
                if warp_idx == DQ_SECOND_WRITER_WARP:
                    self.add_dq_two_slots(
                        mdQaccum, mSemaphore, sdQ, block_info, seqlen, n_block, batch, steps, 1
                    )
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            dkv_out = dict(tdK=tdK, tdV=tdV, tma_atom_dk=tma_atom_dk, tma_atom_dv=tma_atom_dv)
            self.consume(
                dkv_out, sQ, sK, sV, sdO, sPdS, sdQ, sLSE, sDpsum,
                tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, pipeline_q, pipeline_do,
                scale_log2, softmax_scale, seqlen, n_block, batch, steps,
            )

    def tma_pipeline(self, barriers: cute.Pointer, num_stages: int, tile_bytes: int):
        return tma_pipeline(barriers, num_stages, tile_bytes, self.num_consumer_threads)

    def pipeline_states(self, user_type):
        """(Q's state, dO's or None) of a producer or consumer: None where dO's stages are Q's
        (Q's state serves both: ``do_state``). Not one object under two names: the DSL
        rebuilds each name's object after a dynamic branch, and a copy left behind would not
        advance. The loops advance them in their own bodies, so that the DSL carries both."""
        state = pipeline.make_pipeline_state(user_type, self.num_stages)
        if cutlass.const_expr(self.do_stages == self.num_stages):
            return state, None
        return state, pipeline.make_pipeline_state(user_type, self.do_stages)

    @staticmethod
    def do_state(state, state_do):
        """dO's pipeline state: its own, or Q's (``pipeline_states``)."""
        return state if state_do is None else state_do

    @staticmethod
    def step_tile(step: Int32, *, head_kv, group, m_block_min, num_m_blocks, rotation=None):
        """(query head, m_block) of loop step ``step``: the group's heads, then query tiles,
        from m_block_min + ``rotation`` (below num_m_blocks) round to it."""
        head = head_kv * group + step // num_m_blocks
        if cutlass.const_expr(rotation is None):
            return head, m_block_min + step % num_m_blocks
        tile_offset = step % num_m_blocks + rotation
        tile_offset = tile_offset - num_m_blocks * Int32(tile_offset >= num_m_blocks)
        return head, m_block_min + tile_offset

    # ---- Producer: TMA loads ------------------------------------------------------------------

    def tma_rows(self, tensor, head, batch, seqlen: SeqlenInfo, *, keys: bool):
        """The (seqlen, dim) TMA view of one head: of its batch, or varlen, of its sequence
        (``ragged.sequence_rows``). Either way TMA loads zeros past the sequence's rows (its
        queries, or its keys used) and stores stop there."""
        if cutlass.const_expr(not self.varlen):
            return tensor[None, None, head, batch]
        if cutlass.const_expr(keys):
            return sequence_rows(tensor, head, seqlen.offset_k, seqlen.seqlen_k)
        return sequence_rows(tensor, head, seqlen.offset_q, seqlen.seqlen_q)

    @cute.jit
    def produce(
        self, tQ, tK, tV, tdO, mLSE, mDpsum, sQ, sK, sV, sdO, sLSE, sDpsum, tma_atom_q,
        tma_atom_k, tma_atom_v, tma_atom_do, pipeline_q, pipeline_do, n_block: Int32,
        batch: Int32, steps: dict, seqlen: SeqlenInfo, kv_tile_bytes: cutlass.Constexpr,
    ):
        """K and V of this key tile once, then Q (+ lse) and dO (+ dpsum) of each step in the
        consumers' order. FlashAttention-4's order: K on the first step's Q barrier, issued
        before that Q, V on its dO barrier, before that dO, so that the first S^T = K Q^T
        waits for K and Q only (not for V too: 16 KB more at d64, 32 KB at d128; one CTA per
        SM, each CTA's first loads are exposed, and a causal 1k CTA runs 1-8 steps). Varlen
        alike (rows past the sequence's end load as zeros: ``tma_rows``)."""
        keys = dict(
            tK=tK, tV=tV, sK=sK, sV=sV, tma_atom_k=tma_atom_k, tma_atom_v=tma_atom_v,
            n_block=n_block, batch=batch, head_kv=steps["head_kv"], seqlen=seqlen,
        )
        rows = dict(
            tQ=tQ, tdO=tdO, mLSE=mLSE, mDpsum=mDpsum, sQ=sQ, sdO=sdO, sLSE=sLSE, sDpsum=sDpsum,
            tma_atom_q=tma_atom_q, tma_atom_do=tma_atom_do, pipeline_q=pipeline_q,
            pipeline_do=pipeline_do, batch=batch, steps=steps, seqlen=seqlen,
        )
        num_steps = steps["group"] * steps["num_m_blocks"]
        state, state_do = self.pipeline_states(pipeline.PipelineUserType.Producer)
        # A key tile that visits no query tile (a window; varlen, a tile past its sequence's
        # keys) loads nothing.
        if num_steps > 0:
            self.load_step(
                Int32(0), state, state_do, keys=keys, kv_tile_bytes=kv_tile_bytes, **rows
            )
        state.advance()  # (unused without steps)
        if cutlass.const_expr(state_do is not None):
            state_do.advance()
        for step in cutlass.range(1, num_steps, unroll=1):
            self.load_step(step, state, state_do, **rows)
            state.advance()
            if cutlass.const_expr(state_do is not None):
                state_do.advance()

    def load_step(
        self, step: Int32, state, state_do, *, tQ, tdO, mLSE, mDpsum, sQ, sdO, sLSE, sDpsum,
        tma_atom_q,
        tma_atom_do, pipeline_q, pipeline_do, batch: Int32, steps: dict, seqlen: SeqlenInfo,
        keys: dict | None = None, kv_tile_bytes=None,
    ):
        """Q (+ lse) and dO (+ dpsum) of one step into the stages of ``state`` and dO's state
        (``pipeline_states``); with ``keys``, K and
        V onto the same barriers (their bytes added to each barrier's expected count before
        any copy is issued, so that its phase cannot complete without them), and lse / dpsum
        only after K, Q, V and dO are issued and the preprocess has completed."""
        head, m_block = self.step_tile(step, **steps)
        stats = []
        for atom, smem, tensor, ring, ring_state, mRow, sRow, columns, operand in (
            (tma_atom_q, sQ, tQ, pipeline_q, state, mLSE, sLSE, self.head_dim, 0),
            (
                tma_atom_do, sdO, tdO, pipeline_do, self.do_state(state, state_do), mDpsum,
                sDpsum, self.head_dim_v, 1,
            ),
        ):
            t_smem, t_gmem = tma_tile(
                atom, smem, self.tma_rows(tensor, head, batch, seqlen, keys=False),
                (self.tile_m, columns), (m_block, 0),
            )
            ring.producer_acquire(ring_state)
            barrier = ring.producer_get_barrier(ring_state)
            if cutlass.const_expr(keys is not None):
                with cute.arch.elect_one():
                    cute.arch.mbarrier_expect_tx(barrier, kv_tile_bytes[operand])
                self.load_key_operand(operand, barrier, **keys)
            cute.copy(atom, t_gmem, t_smem[None, ring_state.index], tma_bar_ptr=barrier)
            if cutlass.const_expr(keys is None):
                self.load_row_stats(mRow, sRow, barrier, ring_state, head, m_block, batch, seqlen)
            else:
                stats.append((mRow, sRow, barrier, ring_state))
        if cutlass.const_expr(keys is not None):
            # Launched as the preprocess's dependent (programmatic dependent launch): K, Q, V
            # and dO (inputs) load while it finishes; lse_log2 and dpsum, its outputs, only
            # after it completes (each barrier's phase already expects their bytes). (Nothing
            # else here reads what it writes; without a preceding primary grid the wait
            # returns at once.)
            cute.arch.griddepcontrol_wait()
            for mRow, sRow, barrier, ring_state in stats:
                self.load_row_stats(mRow, sRow, barrier, ring_state, head, m_block, batch, seqlen)

    def load_row_stats(
        self, mRow, sRow, barrier, state, head, m_block, batch: Int32, seqlen: SeqlenInfo
    ):
        """A step's lse or dpsum (one fp32 per query row) into ``state``'s stage of ``sRow``,
        on ``barrier`` (its Q / dO stage's)."""
        # The per-row values live in buffers padded to whole query tiles.
        rows = seqlen.buffer_rows(mRow, batch, head, packed=self.varlen, rows_tile=self.tile_m)
        gRow = cute.local_tile(rows, (self.tile_m,), (m_block,))
        with cute.arch.elect_one():
            prims.cp_async_bulk_shared_cluster_global(
                sRow[None, state.index].iterator, gRow.iterator, barrier, self.tile_m * 4,
            )

    def load_key_operand(
        self, operand: int, barrier, *, tK, tV, sK, sV, tma_atom_k, tma_atom_v, n_block: Int32,
        batch: Int32, head_kv, seqlen: SeqlenInfo,
    ):
        """TMA this CTA's key tile of K (``operand`` 0) or V (1) onto ``barrier``."""
        atom, smem, tensor, columns = (
            (tma_atom_k, sK, tK, self.head_dim), (tma_atom_v, sV, tV, self.head_dim_v)
        )[operand]
        t_smem, t_gmem = tma_tile(
            atom, smem, self.tma_rows(tensor, head_kv, batch, seqlen, keys=True),
            (self.tile_n, columns), (n_block, 0),
        )
        cute.copy(atom, t_gmem, t_smem, tma_bar_ptr=barrier)

    # ---- dQ writer: bulk reductions from shared memory ----------------------------------------

    @cute.jit
    def add_dq_block(
        self, mdQaccum: cute.Tensor, sdQ_block: cute.Tensor, seqlen: SeqlenInfo, batch: Int32,
        head: Int32, m_block: Int32, wg: cutlass.Constexpr[int], chunk: cutlass.Constexpr[int],
        full_barrier: cutlass.Constexpr[int], first_turn=None,
    ):
        """Once warpgroup ``wg`` has filled ``sdQ_block`` (``full_barrier``), add it to its
        block of dq_accum (query tile ``m_block``, columns ``chunk``) by one bulk reduction,
        committed as a bulk group of its own. ``first_turn`` (the query tile's first addition:
        the deterministic first turn, or a claim): the block is stored instead, over whatever
        dq_accum held."""
        rows = seqlen.buffer_rows(
            mdQaccum[None, None, chunk, None, None], batch, head,
            packed=self.varlen, rows_tile=self.tile_m,
        )
        # Split by rows, warpgroup wg's block is the tile's wg-th half.
        row_block = m_block
        if cutlass.const_expr(self.dq_split_rows):
            row_block = m_block * NUM_CONSUMER_WGS + wg
        gdQ = cute.local_tile(rows, (self.dq_buffer_rows, self.dq_row), (row_block, 0))
        cute.arch.barrier(
            barrier_id=full_barrier,
            number_of_threads=THREADS_PER_WARPGROUP + cute.arch.WARP_SIZE,
        )
        block_bytes = self.dq_buffer_rows * self.dq_row * Float32.width // 8
        with cute.arch.elect_one():
            if cutlass.const_expr(first_turn is None):
                self.reduce_dq_block(gdQ, sdQ_block, block_bytes)
            else:
                if first_turn:
                    prims.cp_async_bulk_global_shared_cta(
                        gdQ.iterator, sdQ_block.iterator, block_bytes
                    )
                else:
                    self.reduce_dq_block(gdQ, sdQ_block, block_bytes)
        cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def reduce_dq_block(self, gdQ: cute.Tensor, sdQ_block: cute.Tensor, block_bytes: int):
        """One bulk reduction (fp32 add) of a dQ buffer into its block of dq_accum."""
        prims.cp_reduce_async_bulk_global_shared_cta(
            gdQ.iterator, sdQ_block.iterator, block_bytes,
            op=prims.CpReduceOp.ADD, type=prims.CpReduceType.F32,
        )

    @cute.jit
    def add_dq(
        self, mdQaccum: cute.Tensor, mSemaphore: cute.Tensor | None, sdQ: cute.Tensor,
        block_info: BlockInfo, seqlen: SeqlenInfo, n_block: Int32, batch: Int32, steps: dict,
    ):
        """Per step and consumer warpgroup that hands dQ over (d96: warpgroup 0 only): hand
        its dQ buffer back once the previous reduction has read it, wait until it is full, add
        it to its block of dq_accum.

        Deterministic: the additions to a query tile happen in turn order (``turns``), and
        where both warpgroups add to the same block (split by keys) the first one's addition
        completes before the second is issued. Claims (``self.claims``): the key tile that
        claims a query tile stores its blocks and passes the counter on once they are
        performed; the others add after that.
        """
        lane = cute.arch.lane_idx()
        for step in cutlass.range(steps["group"] * steps["num_m_blocks"], unroll=1):
            head, m_block = self.step_tile(step, **steps)
            for dq_pass in cutlass.range_constexpr(self.dq_passes):
                for wg in cutlass.range_constexpr(self.dq_wgs):
                    # Bulk groups complete in order: this warpgroup's last group is done
                    # reading once at most the later warpgroups' groups are in flight.
                    cute.arch.cp_async_bulk_wait_group(self.dq_wgs - 1 - wg, read=True)
                    cute.arch.barrier_arrive(
                        barrier_id=BackwardBarrier.DQ_EMPTY + wg,
                        number_of_threads=THREADS_PER_WARPGROUP + cute.arch.WARP_SIZE,
                    )
                if cutlass.const_expr(self.deterministic and dq_pass == 0):
                    # The consumers fill their buffers meanwhile.
                    counter, turn = self.take_dq_turn(
                        mSemaphore, block_info, seqlen, batch, head, m_block, n_block, lane
                    )
                if cutlass.const_expr(self.claims and dq_pass == 0):
                    counter, claimed = self.claim_dq_tile(mSemaphore, batch, head, m_block, lane)
                for wg in cutlass.range_constexpr(self.dq_wgs):
                    shared_block = self.dq_blocks_shared(dq_pass)
                    first_turn = None
                    if cutlass.const_expr(self.deterministic):
                        # Where both warpgroups add to one block, the first of them only.
                        first_turn = turn == 0 if wg == 0 or not shared_block else False
                    if cutlass.const_expr(self.claims):
                        first_turn = claimed if wg == 0 or not shared_block else False
                    self.add_dq_block(
                        mdQaccum, sdQ[None, (None, wg)], seqlen, batch, head, m_block, wg,
                        self.dq_chunk(wg, dq_pass), BackwardBarrier.DQ_FULL + wg, first_turn,
                    )
                    if cutlass.const_expr(self.deterministic and shared_block and wg == 0):
                        # Both warpgroups add to this block: a fixed order of the additions.
                        cute.arch.cp_async_bulk_wait_group(0, read=False)
                    if cutlass.const_expr(self.claims and shared_block and wg == 0):
                        if claimed:  # the second warpgroup adds to the block once it is stored
                            cute.arch.cp_async_bulk_wait_group(0, read=False)
            if cutlass.const_expr(self.deterministic):
                self.pass_dq_turn(counter, turn, lane)
            if cutlass.const_expr(self.claims):
                if claimed:
                    self.pass_dq_turn(counter, Int32(turns.CLAIMED), lane)
        cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def take_dq_turn(
        self, mSemaphore: cute.Tensor, block_info: BlockInfo, seqlen: SeqlenInfo, batch: Int32,
        head: Int32, m_block: Int32, n_block: Int32, lane: Int32,
    ):
        """Deterministic, the writer warp: wait until it is key tile ``n_block``'s turn to add
        to query tile (``head``, ``m_block``); the (counter, turn) that ``pass_dq_turn``
        takes."""
        counter = mSemaphore[batch, head, None].iterator + m_block
        turn = turns.turn_of(block_info, seqlen, m_block, n_block)
        if lane == 0:
            turns.wait_for_turn(counter, turn)
        cute.arch.sync_warp()
        return counter, turn

    @cute.jit
    def claim_dq_tile(
        self, mSemaphore: cute.Tensor, batch: Int32, head: Int32, m_block: Int32, lane: Int32
    ):
        """Not deterministic, the writer warp: claim query tile (``head``, ``m_block``)'s
        first addition (``turns.claim``); the counter and whether this key tile claimed it
        (it stores its dQ and passes the counter on: ``pass_dq_turn(counter, CLAIMED)``), else
        its store is performed and this one adds."""
        counter = mSemaphore[batch, head, None].iterator + m_block
        seen = Int32(turns.CLAIMED)
        if lane == 0:
            seen = turns.claim(counter)
        seen = cute.arch.shuffle_sync(seen, 0)
        cute.arch.sync_warp()
        # The claimer's store came through the async proxy, and so will this warp's additions:
        # ordered after the (generic) acquire.
        cute.arch.fence_proxy("async.global")
        return counter, seen == turns.CLAIM_FREE

    @cute.jit
    def pass_dq_turn(self, counter: cute.Pointer, turn: Int32, lane: Int32):
        """Deterministic, the writer warp after its additions to a query tile: they are
        performed (not only read) before the next key tile may add its own; their writes came
        through the async proxy, the turn goes through the generic one."""
        cute.arch.cp_async_bulk_wait_group(0, read=False)
        cute.arch.fence_proxy("async.global")
        cute.arch.sync_warp()  # the elected lane that issued them need not be lane 0
        if lane == 0:
            turns.pass_turn(counter, turn)

    def dq_barrier(self, base: int, wg, slot):
        """The hardware barrier id of ``base`` (DQ_EMPTY or DQ_FULL) for warpgroup ``wg``'s
        buffer ``slot`` (the second slots' pair sits DQ_SECOND_SLOT ids further). A constant
        slot 0 adds nothing, so one-slot kernels keep their ids free of arithmetic on a
        runtime ``wg``."""
        if cutlass.const_expr(isinstance(slot, int) and slot == 0):
            return base + wg
        return base + wg + slot * DQ_SECOND_SLOT

    @cute.jit
    def add_dq_two_slots(
        self, mdQaccum: cute.Tensor, mSemaphore: cute.Tensor, sdQ: cute.Tensor,
        block_info: BlockInfo, seqlen: SeqlenInfo, n_block: Int32, batch: Int32, steps: dict,
        slot: cutlass.Constexpr[int],
    ):
        """``add_dq`` for the deterministic kernel with two buffers per warpgroup
        (``dq_slots``), one writer warp per buffer (``slot``: warp 1 the even steps, warp 2 the
        odd ones): step s adds buffer s % 2 in its query tile's turn, waits until the additions
        are performed, passes the turn and only then hands that buffer back, for step s + 2.
        So step s + 1's additions (another query tile, another turn) are issued while step
        s's are still on their L2 round trip, and the consumers write step s + 1's dQ into the
        other buffer meanwhile. Each warp's bulk groups are its own."""
        lane = cute.arch.lane_idx()
        handover_threads = THREADS_PER_WARPGROUP + cute.arch.WARP_SIZE
        num_steps = steps["group"] * steps["num_m_blocks"]
        if num_steps > slot:
            for wg in cutlass.range_constexpr(self.dq_wgs):
                cute.arch.barrier_arrive(
                    barrier_id=self.dq_barrier(BackwardBarrier.DQ_EMPTY, wg, slot),
                    number_of_threads=handover_threads,
                )
        for step in cutlass.range(slot, num_steps, self.dq_slots, unroll=1):
            head, m_block = self.step_tile(step, **steps)
            counter, turn = self.take_dq_turn(
                mSemaphore, block_info, seqlen, batch, head, m_block, n_block, lane
            )
            for wg in cutlass.range_constexpr(self.dq_wgs):
                shared_block = self.dq_blocks_shared(0)
                self.add_dq_block(
                    mdQaccum, sdQ[None, (None, wg), slot], seqlen, batch, head, m_block, wg,
                    self.dq_chunk(wg, 0), self.dq_barrier(BackwardBarrier.DQ_FULL, wg, slot),
                    turn == 0 if wg == 0 or not shared_block else False,
                )
                if cutlass.const_expr(shared_block and wg == 0):
                    cute.arch.cp_async_bulk_wait_group(0, read=False)
            self.pass_dq_turn(counter, turn, lane)
            if step + self.dq_slots < num_steps:
                for wg in cutlass.range_constexpr(self.dq_wgs):
                    cute.arch.barrier_arrive(
                        barrier_id=self.dq_barrier(BackwardBarrier.DQ_EMPTY, wg, slot),
                        number_of_threads=handover_threads,
                    )

    # ---- Consumers ----------------------------------------------------------------------------

    @cute.jit
    def consume(
        self, dkv_out: dict, sQ, sK, sV, sdO, sdSt, sdQ, sLSE, sDpsum,
        tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, pipeline_q, pipeline_do,
        scale_log2: Float32, softmax_scale: Float32, seqlen: SeqlenInfo, n_block: Int32,
        batch: Int32, steps: dict,
    ):
        tidx, wg_idx, wg_tidx = consumer_thread()
        lane = cute.arch.lane_idx()
        tanh_scale = capping.tanh_scale(softmax_scale, self.softcap)
        thr_sdp = tiled_mma_sdp.get_slice(tidx)
        # Shared-memory operands are partitioned per warpgroup (WGMMA reads them as a whole).
        wg_sdp = tiled_mma_sdp.get_slice(wg_idx * THREADS_PER_WARPGROUP)
        wg_dkv = tiled_mma_dkv.get_slice(wg_idx * THREADS_PER_WARPGROUP)
        thr_dkv = tiled_mma_dkv.get_slice(tidx)
        if cutlass.const_expr(self.dq_split_dim):
            thr_dq = tiled_mma_dq.get_slice(tidx)
            wg_dq = tiled_mma_dq.get_slice(wg_idx * THREADS_PER_WARPGROUP)
            ds_threads, ds_ready = self.num_consumer_threads, BackwardBarrier.DS_READY
        else:
            thr_dq = tiled_mma_dq.get_slice(wg_tidx)
            wg_dq = tiled_mma_dq.get_slice(0)
            ds_threads, ds_ready = THREADS_PER_WARPGROUP, BackwardBarrier.DS_READY + wg_idx
            if cutlass.const_expr(self.dq_split_rows or self.dq_single_wg):
                # Its queries' dS spans both warpgroups' keys.
                ds_threads, ds_ready = self.num_consumer_threads, BackwardBarrier.DS_READY
        tile_st = (self.tile_n, self.tile_m)  # S^T: keys x queries
        tile_kv = (self.tile_n, self.head_dim)
        dq_tile = (self.dq_buffer_rows, self.head_dim)

        tSrK = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        tSrQ = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tdPrV = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        tdPrdO = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        # dV += P^T dO, dK += dS^T Q: B = dO^T / Q^T, (dim, queries) MN-major views.
        tdVrdOt = wg_dkv.make_fragment_B(wg_dkv.partition_B(transposed(sdO)))
        tdKrQt = wg_dkv.make_fragment_B(wg_dkv.partition_B(transposed(sQ)))
        tdVrPt = wg_dkv.make_fragment_A(wg_dkv.partition_shape_A((self.tile_n, self.tile_m)))
        tdKrdSt = wg_dkv.make_fragment_A(wg_dkv.partition_shape_A((self.tile_n, self.tile_m)))
        if cutlass.const_expr(self.dq_split_dim):
            # A = dS (queries x all keys), B = K^T (dim x all keys); the MMA splits dim.
            sdSt_dq, sK_dq = sdSt, sK
        elif cutlass.const_expr(self.dq_split_rows):
            # A = dS[this warpgroup's queries, :] (64 x all keys), B = K^T.
            queries = (self.tile_n, self.dq_buffer_rows)
            sdSt_dq = cute.flat_divide(sdSt, queries)[None, None, 0, wg_idx, None]
            sK_dq = sK
        elif cutlass.const_expr(self.dq_single_wg):
            # Warpgroup 0 only: A = dS (all queries x all keys, both warpgroups' dS^T), B = K^T.
            sdSt_dq, sK_dq = sdSt, sK
        else:
            # A = dS[:, this warpgroup's keys] (queries x 64), B = K[its keys]^T.
            keys = (KEYS_PER_WARPGROUP, self.tile_m)
            sdSt_dq = cute.flat_divide(sdSt, keys)[None, None, wg_idx, 0, None]
            sK_dq = cute.local_tile(sK, (KEYS_PER_WARPGROUP, self.head_dim), (wg_idx, 0))
        if cutlass.const_expr(self.dq_transposed):
            dq_tile = (self.head_dim, self.tile_m)
            tdQrK = wg_dq.make_fragment_A(wg_dq.partition_A(transposed(sK)))
            tdQrdS = wg_dq.make_fragment_B(wg_dq.partition_B(transposed(sdSt)))
        else:
            tdQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(transposed(sdSt_dq)))
            tdQrK = wg_dq.make_fragment_B(wg_dq.partition_B(transposed(sK_dq)))
        if cutlass.const_expr(self.hold_descriptors):
            tSrK, tdPrV, tdQrK = hold_base(tSrK), hold_base(tdPrV), hold_base(tdQrK)
            tSrQ, tdPrdO, tdQrdS = HeldStages(tSrQ), HeldStages(tdPrdO), HeldStages(tdQrdS)
            tdVrdOt, tdKrQt = HeldStages(tdVrdOt), HeldStages(tdKrQt)
        # This thread's places in its warpgroup's buffer (fragment order; d96: warpgroup 0's,
        # the only one).
        dq_values = cute.size(thr_dq.partition_shape_C(dq_tile))
        dq_buffer = 0 if self.dq_single_wg else wg_idx
        if cutlass.const_expr(self.dq_slots > 1):
            sdQ_own = sdQ[None, (None, dq_buffer), 0]  # the first slot's: hand_over_dq offsets
        else:
            sdQ_own = sdQ[None, (None, dq_buffer)]
        tdQsdQ = fragment_slots(sdQ_own, wg_tidx, dq_values)

        acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C(tile_kv), Float32)
        acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C(tile_kv), Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        st_coords = tile_coords(thr_sdp, tile_st)
        # Thread 0's (compile-time): the column pattern every thread's columns follow.
        st_coords_t0 = tile_coords(tiled_mma_sdp.get_slice(0), tile_st)
        stmatrix = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
        )
        store_dst = cute.make_tiled_copy_C(stmatrix, tiled_mma_sdp).get_slice(tidx)
        tdSsdSt = store_dst.partition_D(sdSt)
        # Keys past seqlen_k exist only in the last key tile. Computed here, once: left to
        # the compiler, it reads %ctaid.x and seqlen_k again on every step (``computed_here``).
        tile_past_seqlen_k = computed_here(
            Int32((n_block + 1) * self.tile_n > seqlen.seqlen_k)
        ) != 0

        assert self.do_stages == self.num_stages, "dO's stages are Q's here (one state)"
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        for step in cutlass.range(steps["group"] * steps["num_m_blocks"], unroll=1):
            head, m_block = self.step_tile(step, **steps)
            ds_stage = step % DS_STAGES

            # 1. S^T = K Q^T, dP^T = V dO^T; per-query lse of this thread's columns read while
            # they run.
            pipeline_q.consumer_wait(state, pipeline_q.consumer_try_wait(state))
            acc_St = cute.make_rmem_tensor(thr_sdp.partition_shape_C(tile_st), Float32)
            gemm(tiled_mma_sdp, acc_St, tSrK, operand_stage(tSrQ, state.index),
                 zero_init=True, wait_groups=-1)
            lse_cols = self.column_stats(sLSE, state.index, lane, st_coords)
            pipeline_do.consumer_wait(state, pipeline_do.consumer_try_wait(state))
            acc_dPt = cute.make_rmem_tensor(thr_sdp.partition_shape_C(tile_st), Float32)
            gemm(tiled_mma_sdp, acc_dPt, tdPrV, operand_stage(tdPrdO, state.index),
                 zero_init=True, wait_groups=1)

            # 2. soft-cap, mask (only tiles that hold a hidden key), P^T from the forward's lse
            capping.apply_softcap(acc_St, tanh_scale, self.softcap)
            needs_mask = self.tile_needs_mask(tile_past_seqlen_k, seqlen, m_block, n_block)
            scores = acc_as_rows_cols(acc_St)
            # Soft-capped, P^T goes to the dV GEMM from a tensor of its own and the scores
            # keep P^T (1 - t^2) for dS^T (a held tanh would cost 64 registers).
            probs = cute.make_fragment_like(acc_St) if self.softcap > 0 else acc_St
            probs_rc = acc_as_rows_cols(probs)
            if needs_mask:
                self.mask_keys_major(acc_St, st_coords, st_coords_t0, n_block, m_block, seqlen)
            lse_of = self.column_stat_reader(lse_cols, st_coords_t0, lane)
            for r, c in self.score_order(scores):
                lse_c = lse_of(c)
                score = scores[r, c]
                prob = cute.math.exp2(score * scale_log2 - lse_c, fastmath=True)
                probs_rc[r, c] = prob
                if cutlass.const_expr(self.softcap > 0):
                    scores[r, c] = capping.chain_score_grad(prob, score, self.softcap)
            if cutlass.const_expr(not self.dv_after_ds):
                convert_packed(probs, tdVrPt)
                # 3. dV += P^T dO (register A operand), issued before waiting for dP^T: the
                # exponentials above overlap the dP^T GEMM (ptxas cannot hoist the wait above a
                # WGMMA issue), and dV runs while dS^T is formed.
                # Only the first half of its k-blocks: the second goes out with dS^T (below),
                # in flight while the warpgroups meet before dQ.
                gemm(tiled_mma_dkv, acc_dV, tdVrPt, operand_stage(tdVrdOt, state.index),
                     zero_init=False, wait_groups=1, k_blocks=self.dv_first_k_blocks)
            else:
                if cutlass.const_expr(self.early_dpsum):
                    dpsum_cols = self.column_stats(sDpsum, state.index, lane, st_coords)
                warpgroup.wait_group(0)  # dP^T
            if cutlass.const_expr(not self.early_dpsum):
                dpsum_cols = self.column_stats(sDpsum, state.index, lane, st_coords)

            # dS^T = P^T (dP^T - dpsum)
            dscores = acc_as_rows_cols(acc_dPt)
            dpsum_of = self.column_stat_reader(dpsum_cols, st_coords_t0, lane)
            for r, c in self.score_order(dscores):
                dpsum_c = dpsum_of(c)
                dscores[r, c] = scores[r, c] * (dscores[r, c] - dpsum_c)
            if cutlass.const_expr(self.dv_after_ds):
                # 3'. Taller query tiles (FlashAttention-4's order): dV once dS^T is formed and
                # stored, so that P^T's bf16 copy is not live beside dP^T and dpsum (ptxas
                # would spill), and no register is written while dV reads its A operand (ptxas
                # would serialise every WGMMA of the kernel: C7512).
                convert_packed(probs, tdVrPt)
            convert_packed(acc_dPt, tdKrdSt)
            # 4a. dS^T to shared memory now: once the dK GEMM below is issued, its A registers
            # may not be read until it completes.
            cute.copy(stmatrix, store_dst.retile(as_accumulator(tdKrdSt, acc_dPt)),
                      tdSsdSt[None, None, None, ds_stage])
            if cutlass.const_expr(self.dv_after_ds):
                gemm(tiled_mma_dkv, acc_dV, tdVrPt, operand_stage(tdVrdOt, state.index),
                     zero_init=False, wait_groups=-1)
            elif cutlass.const_expr(self.dv_first_k_blocks is not None):
                gemm(tiled_mma_dkv, acc_dV, tdVrPt, operand_stage(tdVrdOt, state.index),
                     zero_init=False, wait_groups=-1,
                     k_blocks=tuple(range(len(self.dv_first_k_blocks), self.tile_m // 16)))

            # 4b. dQ = dS K once dS^T is complete in shared memory. Generic-proxy writes must
            # be visible to WGMMA (async proxy) before it reads them. The other dS^T buffer
            # is free: every thread finished last step's dQ GEMM before reaching this barrier
            # (d96: warpgroup 0's dQ GEMM reads both warpgroups' dS^T, and the barrier spans
            # both: warpgroup 1 rewrites this step's buffer two steps on, past the next step's
            # barrier, which warpgroup 0 reaches only once this step's dQ GEMM is complete).
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=ds_ready, number_of_threads=ds_threads)
            dq_step = dict(
                tdQrK=tdQrK, tdQrdS=tdQrdS, tdKrdSt=tdKrdSt, tdKrQt=tdKrQt, tdQsdQ=tdQsdQ,
                ds_stage=ds_stage, dq_tile=dq_tile,
                dq_slot=step % self.dq_slots if cutlass.const_expr(self.dq_slots > 1) else 0,
            )
            if cutlass.const_expr(not self.dq_single_wg):
                self.dq_and_dk(
                    tiled_mma_dq, tiled_mma_dkv, thr_dq, acc_dK, pipeline_do, state, wg_idx,
                    **dq_step,
                )
            else:
                # Warpgroup 0 computes dQ over all keys and hands it over; warpgroup 1 only
                # adds its dK (warp-uniform branch; both wait for all their WGMMAs inside).
                if wg_idx == 0:
                    self.dq_and_dk(
                        tiled_mma_dq, tiled_mma_dkv, thr_dq, acc_dK, pipeline_do, state, 0,
                        **dq_step,
                    )
                else:
                    # 3'. dK += dS^T Q; dV is done once at most dK is in flight.
                    gemm(tiled_mma_dkv, acc_dK, tdKrdSt, operand_stage(tdKrQt, state.index),
                         zero_init=False, wait_groups=1)
                    pipeline_do.consumer_release(state)
                    warpgroup.wait_group(0)
            pipeline_q.consumer_release(state)
            state.advance()

        # ---- Epilogue: dK, dV through K's and V's buffers, one TMA store each --------------------
        for i in cutlass.range_constexpr(cute.size(acc_dK)):
            acc_dK[i] = acc_dK[i] * softmax_scale
        self.store_dkv(
            acc_dK, acc_dV, sK, sV, tiled_mma_dkv, dkv_out, n_block, batch, steps, seqlen
        )

    def dq_and_dk(
        self, tiled_mma_dq, tiled_mma_dkv, thr_dq, acc_dK, pipeline_do, state, wg_idx, *,
        tdQrK, tdQrdS, tdKrdSt, tdKrQt, tdQsdQ, ds_stage, dq_tile, dq_slot,
    ):
        """A step's dQ GEMM, its dK GEMM, dO's release and dQ's hand-over to its writer warp;
        returns with every WGMMA of the step complete (traced inline: plain Python)."""
        acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C(dq_tile), Float32)
        if cutlass.const_expr(self.dq_transposed):
            gemm(tiled_mma_dq, acc_dQ, tdQrK, operand_stage(tdQrdS, ds_stage),
                 zero_init=True, wait_groups=-1)
        else:
            gemm(tiled_mma_dq, acc_dQ, operand_stage(tdQrdS, ds_stage), tdQrK,
                 zero_init=True, wait_groups=-1)
        # 3'. dK += dS^T Q (register A operand), in flight while dQ goes out.
        gemm(tiled_mma_dkv, acc_dK, tdKrdSt, operand_stage(tdKrQt, state.index),
             zero_init=False, wait_groups=1)
        # dV and dQ are done: dO of this stage is free, dQ goes to its writer warp's buffer.
        pipeline_do.consumer_release(state)
        self.hand_over_dq(fragment_vectors(acc_dQ), tdQsdQ, wg_idx, dq_slot)
        warpgroup.wait_group(0)

    @cute.jit
    def store_dkv(
        self, acc_dK, acc_dV, sK, sV, tiled_mma_dkv, dkv_out: dict, n_block: Int32,
        batch: Int32, steps: dict, seqlen: SeqlenInfo,
    ):
        """dK, dV (accumulators, dK already scaled) -> K's and V's buffers with stmatrix ->
        global with one TMA store each, clipped to seqlen_k (varlen: to the sequence's keys,
        ``tma_rows``); the first consumer warp issues them and waits until they have read
        shared memory."""
        tidx = cute.arch.thread_idx()[0] - THREADS_PER_WARPGROUP
        rdK = cute.make_fragment_like(acc_dK, self.dtype)
        rdK.store(acc_dK.load().to(self.dtype))
        rdV = cute.make_fragment_like(acc_dV, self.dtype)
        rdV.store(acc_dV.load().to(self.dtype))
        # Every consumer is past its last GEMM that reads K or V (the producer loaded them once).
        cute.arch.barrier(
            barrier_id=BackwardBarrier.EPILOGUE, number_of_threads=self.num_consumer_threads
        )
        stmatrix = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
        )
        store = cute.make_tiled_copy_C(stmatrix, tiled_mma_dkv).get_slice(tidx)
        cute.copy(stmatrix, store.retile(rdK), store.partition_D(sK))
        cute.copy(stmatrix, store.retile(rdV), store.partition_D(sV))
        # Generic-proxy writes must be visible to the TMA (async proxy) before it reads them.
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(
            barrier_id=BackwardBarrier.EPILOGUE, number_of_threads=self.num_consumer_threads
        )
        if tidx < cute.arch.WARP_SIZE:
            tile_kv = (self.tile_n, self.head_dim)
            for atom, smem, tensor in (
                (dkv_out["tma_atom_dk"], sK, dkv_out["tdK"]),
                (dkv_out["tma_atom_dv"], sV, dkv_out["tdV"]),
            ):
                rows = self.tma_rows(tensor, steps["head_kv"], batch, seqlen, keys=True)
                t_smem, t_gmem = tma_tile(atom, smem, rows, tile_kv, (n_block, 0))
                cute.copy(atom, t_smem, t_gmem)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def column_stats(self, sRow, stage, lane, st_coords):
        """A query tile's per-query statistic (lse or dpsum) in ``sRow[:, stage]`` as this
        thread needs it for its score columns: shuffled (``own_stats``) or one per column."""
        if cutlass.const_expr(self.shuffle_stats):
            return self.own_stats(sRow, stage, lane)
        num_cols = cute.size(st_coords, mode=[1])
        stats = cute.make_rmem_tensor(num_cols, Float32)
        for c in cutlass.range_constexpr(num_cols):
            stats[c] = sRow[st_coords[0, c][1], stage]
        return stats

    def column_stat_reader(self, stats, st_coords_t0, lane):
        """c -> the statistic of this thread's score column c (``column_stats``); a shuffled
        one is shuffled once, where the unrolled code first asks for it."""
        if cutlass.const_expr(not self.shuffle_stats):
            return lambda c: stats[c]
        shuffled = {}

        def read(c):
            if c not in shuffled:
                shuffled[c] = self.stat_of(stats, st_coords_t0[0, c][1], lane)
            return shuffled[c]

        return read

    def score_order(self, scores):
        """The (row, column) order in which the unrolled code visits a thread's scores:
        column by column where each column's statistic comes by a shuffle (the shuffle then
        feeds the exponentials right away), else row by row."""
        rows, cols = cute.size(scores, mode=[0]), cute.size(scores, mode=[1])
        if self.shuffle_stats:
            return [(r, c) for c in range(cols) for r in range(rows)]
        return [(r, c) for r in range(rows) for c in range(cols)]

    @cute.jit
    def own_stats(self, sRow, stage, lane):
        """This lane's share of a query tile's per-query statistic (lse or dpsum) in
        ``sRow[:, stage]``: the WGMMA accumulator puts column 8 j + 2 (lane % 4) + e (e in 0,
        1) in lanes with that lane % 4, so lane group g = lane // 4 keeps columns
        8 (g + 8 h) + 2 (lane % 4) + e and ``stat_of`` shuffles each column's value to the
        others (FlashAttention-4's way: 2 loads per 64 columns instead of one per column)."""
        groups = -(-self.tile_m // 64)
        own = cute.make_rmem_tensor(2 * groups, Float32)
        for h in cutlass.range_constexpr(groups):
            for e in cutlass.range_constexpr(2):
                column = 8 * (lane // 4 + 8 * h) + 2 * (lane % 4) + e
                if cutlass.const_expr(self.tile_m % 64 != 0):
                    column = cutlass.min(column, self.tile_m - 1)  # no such column: unused
                own[2 * h + e] = sRow[column, stage]
        return own

    def stat_of(self, own, col_t0, lane):
        """The statistic of this lane's column whose thread-0 column is ``col_t0``."""
        j, e = col_t0 // 8, col_t0 % 2
        return cute.arch.shuffle_sync(own[2 * (j // 8) + e], (j % 8) * 4 + lane % 4)

    @cute.jit
    def hand_over_dq(
        self, acc_dQ: cute.Tensor, tdQsdQ: cute.Tensor, wg_idx: Int32, dq_slot=0
    ):
        """Write a warpgroup's dQ share to its buffer (``dq_slot`` of ``dq_slots``) once the
        slot's writer warp has handed it back, then tell that warp it is full."""
        cute.arch.barrier(
            barrier_id=self.dq_barrier(BackwardBarrier.DQ_EMPTY, wg_idx, dq_slot),
            number_of_threads=THREADS_PER_WARPGROUP + cute.arch.WARP_SIZE,
        )
        if cutlass.const_expr(self.dq_slots > 1):
            tdQsdQ = cute.make_tensor(tdQsdQ.iterator + dq_slot * self.dq_slot_elems,
                                      tdQsdQ.layout)
        cute.autovec_copy(acc_dQ, tdQsdQ)
        # The bulk reductions read the buffer through the async proxy.
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(
            barrier_id=self.dq_barrier(BackwardBarrier.DQ_FULL, wg_idx, dq_slot),
            number_of_threads=THREADS_PER_WARPGROUP + cute.arch.WARP_SIZE,
        )

    @cute.jit
    def mask_keys_major(
        self, acc_St, st_coords, st_coords_t0, n_block: Int32, m_block: Int32, seqlen
    ):
        """-inf where key j (row) is past seqlen_k or, causal, above query i's (column)
        diagonal: j > i + seqlen_k - seqlen_q; a window: outside i's window,
        j > i + shift + right or j < i + shift - left. A key's visible queries are a range of
        the thread's columns: kept as a bit mask per row (``mask.keep_range``) where the
        columns run 0, 1, 8, 9, ... from the thread's first (the WGMMA layout)."""
        scores = acc_as_rows_cols(acc_St)
        num_cols = cute.size(scores, mode=[1])
        first_key = n_block * self.tile_n
        first_query = m_block * self.tile_m
        block_info = self.block_info()
        shift = seqlen.seqlen_k - seqlen.seqlen_q
        paired = mask.columns_in_pairs([st_coords_t0[0, c][1] for c in range(num_cols)])
        # This thread's first query column.
        thread_query = first_query + st_coords[0, 0][1]
        for r in cutlass.range_constexpr(cute.size(scores, mode=[0])):
            key = first_key + st_coords[r, 0][0]
            if cutlass.const_expr(paired):
                # Queries below key - shift (causal) or key - shift - right (window) and past
                # key - shift + left (window) are hidden: kept columns start .. end - 1.
                start = None
                limits = []
                if cutlass.const_expr(self.causal):
                    limits.append(key - shift - thread_query)
                if cutlass.const_expr(
                    self.window is not None and block_info.window_right is not None
                ):
                    limits.append(key - shift - block_info.window_right - thread_query)
                for limit in limits:
                    below = mask.paired_columns_below(limit, num_cols)
                    start = below if start is None else cutlass.max(start, below)
                end = num_cols
                if cutlass.const_expr(
                    self.window is not None and block_info.window_left is not None
                ):
                    end = mask.paired_columns_below(
                        key - shift + block_info.window_left + 1 - thread_query, num_cols
                    )
                # A key past seqlen_k: the whole row.
                end = 0 if key >= seqlen.seqlen_k else end
                mask.keep_range(scores, r, start, end)
            else:
                for c in cutlass.range_constexpr(num_cols):
                    hidden = key >= seqlen.seqlen_k
                    if cutlass.const_expr(self.causal):
                        query = first_query + st_coords[r, c][1]
                        hidden = hidden | (key > query + shift)
                    if cutlass.const_expr(self.window is not None):
                        diagonal = first_query + st_coords[r, c][1] + shift
                        if cutlass.const_expr(block_info.window_right is not None):
                            hidden = hidden | (key > diagonal + block_info.window_right)
                        if cutlass.const_expr(block_info.window_left is not None):
                            hidden = hidden | (key < diagonal - block_info.window_left)
                    scores[r, c] = -Float32.inf if hidden else scores[r, c]

    def tile_needs_mask(self, tile_past_seqlen_k, seqlen: SeqlenInfo, m_block, n_block):
        """Whether score tile (m_block, n_block) hides a key from one of its queries (traced
        inline): past seqlen_k (``tile_past_seqlen_k``, computed once per CTA), causal, or a
        window bound (``BlockInfo.needs_mask``'s test, written without its clamp and division)."""
        needs_mask = tile_past_seqlen_k
        if cutlass.const_expr(self.causal):
            # The tile's last key against its first query's diagonal.
            needs_mask = needs_mask | (
                (n_block + 1) * self.tile_n - 1
                > m_block * self.tile_m + seqlen.seqlen_k - seqlen.seqlen_q
            )
        if cutlass.const_expr(self.window is not None):
            needs_mask = needs_mask | self.block_info().hides_window_keys(
                seqlen, m_block, n_block
            )
        return needs_mask

    def block_info(self) -> BlockInfo:
        """The kernel's tiling and mask as a ``BlockInfo`` (plain Python: usable anywhere)."""
        return BlockInfo(
            tile_m=self.tile_m, tile_n=self.tile_n, causal=self.causal, window=self.window
        )


def consumer_thread() -> tuple:
    """This consumer thread's index among the consumers, its warpgroup (warp-uniform) and its
    index in the warpgroup (the producer warpgroup comes first)."""
    tidx = cute.arch.thread_idx()[0] - THREADS_PER_WARPGROUP
    wg_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
    return tidx, wg_idx, tidx % THREADS_PER_WARPGROUP


def as_accumulator(operand_a: cute.Tensor, acc: cute.Tensor) -> cute.Tensor:
    """A 16-bit register A operand of an m64nNk16 WGMMA seen in the layout of the m64nN
    accumulator it was converted from (the layouts share the thread -> element mapping and
    the register order), for stmatrix."""
    return cute.make_tensor(operand_a.iterator, acc.layout)
