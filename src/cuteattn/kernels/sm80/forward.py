"""Attention forward for the Ampere-class family: warp mma.sync (m16n8k16) + cp.async.

Layouts (flash-attn's): q, out (batch, seqlen_q, heads_q, dim); k, v (batch, seqlen_k,
heads_kv, dim); lse (batch, heads_q, seqlen_q) fp32. The last mode is contiguous; every other
stride is a multiple of 8 elements (16 bytes) and may exceed 2^31 (64-bit offsets).
lse is None for a plan with ("lse", False) (a call that reads no lse): none is written.

One CTA computes one (tile_m x dim) tile of out for one (batch, head), given by the single-tile
scheduler (longest query tiles first when causal). Algorithm:
  1. cp.async Q tile and the last K tile into shared memory.
  2. For each key tile n_block, from the last visible one down to the first:
     a. wait for K; start the cp.async of V[n_block] (it lands while we compute S);
     b. S = Q K^T with ldmatrix + mma.sync, shared -> register loads pipelined over k;
     c. wait for V; start the cp.async of K[n_block - 1] (it lands during softmax and P V);
     d. mask S (seqlen bound on the first tile, the causal diagonal on crossing tiles);
     e. online softmax: P = exp2(S * scale_log2 - max), rescale the O accumulator;
     f. O += P V with P kept in registers as the A operand.
  3. O /= row_sum; LSE = max * scale + ln(row_sum); O goes through shared memory (reusing the
     Q buffer) to 128-bit global stores; rows past seqlen_q are not written.
A query tile that sees no key (causal with seqlen_q > seqlen_k) skips step 2 and writes O = 0,
LSE = -inf.

Constraints: fp16/bf16; head_dim a multiple of 32 (64, 96, 128, 192, 256), dim_v == dim or
a pair of ``Sm80Family.dim_v_pairs`` (V's and O's tiles then have dim_v columns);
tile_n a multiple of 16; shared memory of Q + K + V tiles within the arch's capacity.

Compile and run: ``cuteattn.flash_attn_func`` plans, compiles (once per plan) and launches it;
``cuteattn.api.forward(..., family="sm80")`` forces this family on any arch that has mma.sync;
tests/cpu/test_compile.py cross-compiles the variants for sm_80 / sm_90a / sm_120a on a CPU.
Profile with ``ncu --clock-control none python -m cuteattn.bench --backends cuteattn-sm80``.
"""

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warp

from cuteattn.kernels.common import softcap as capping
from cuteattn.kernels.common.block_info import BlockInfo
from cuteattn.kernels.common.columns import copy_row, zero_columns_past
from cuteattn.kernels.common.compile_args import check_operand_dtypes
from cuteattn.kernels.common.epilogue import store_lse, store_o
from cuteattn.kernels.common.fragments import tile_coords
from cuteattn.kernels.common.kernel_base import AttentionKernel
from cuteattn.kernels.common.mask import AttentionMask
from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.sink import row_sinks
from cuteattn.kernels.common.smem_tiles import gmem_row_copies, smem_tile_atom
from cuteattn.kernels.common.softmax import OnlineSoftmax, rescale_rows
from cuteattn.kernels.common.tile_scheduler import SingleTileScheduler, TileCounts
from cuteattn.kernels.sm80 import tiling
from cuteattn.kernels.sm80.fragments import acc_as_operand_a, ldmatrix_atoms
from cuteattn.kernels.sm80.warp_gemm import SmemOperand, gemm



class KVCopies(NamedTuple):
    """This thread's cp.async partitions of K and V (global tiles indexed by n_block) and the row
    coordinates that bound them by seqlen_k; thread 0's rows are compile-time constants."""

    tiled_copy: cute.TiledCopy
    gK: cute.Tensor
    sK: cute.Tensor
    gV: cute.Tensor
    sV: cute.Tensor
    coords: cute.Tensor
    coords_t0: cute.Tensor


class MmaOperands(NamedTuple):
    """This thread's MMA: register fragments of Q, K and V^T and their ldmatrix feeds."""

    tiled_mma: cute.TiledMma
    thr_mma: cute.ThrMma
    rQ: cute.Tensor
    rK: cute.Tensor
    rVt: cute.Tensor
    q_operand: SmemOperand
    k_operand: SmemOperand
    vt_operand: SmemOperand


class QueryTile(NamedTuple):
    """State of the query tile being computed: its index, lengths, O accumulator, softmax
    statistics and mask, the scores' tanh scale (soft-capping) and its first key tile."""

    m_block: Int32
    seqlen: SeqlenInfo
    acc_O: cute.Tensor
    softmax: OnlineSoftmax
    mask: AttentionMask
    tanh_scale: Float32
    n_block_min: Int32


class FlashForwardSm80(AttentionKernel):
    def __init__(self, *, num_threads: int, sink: bool = False, **shape):
        """sink: the kernel takes a learnable sink's logits (``kernels/common/sink.py``).
        shape: ``AttentionKernel``'s fields."""
        super().__init__(**shape)
        self.num_threads = num_threads
        self.sink = sink

    can_implement = staticmethod(tiling.can_implement)

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
        max_seqlen_q: Int32,  # varlen: the longest sequence (the grid), else unused
        softmax_scale: Float32,
        max_ctas: Int32,  # CTAs resident at once; unused: this kernel launches a CTA per tile
        mTileCounter: cute.Tensor | None,  # unused (None): no dynamic scheduling here
        stream,
    ):
        check_operand_dtypes(mQ, mK, mV, mO)

        # Shared memory: swizzled K-major tiles; O reuses the Q buffer in the epilogue.
        tile_atom = smem_tile_atom(self.dtype, self.head_dim)
        sQ_layout = cute.tile_to_shape(tile_atom, (self.tile_m, self.head_dim), (0, 1))
        sKV_layout = cute.tile_to_shape(tile_atom, (self.tile_n, self.head_dim), (0, 1))
        # V and O: head_dim_v columns (the same swizzle-atom width: tiling.same_row_copies).
        tile_atom_v = smem_tile_atom(self.dtype, self.head_dim_v)
        sV_layout = cute.tile_to_shape(tile_atom_v, (self.tile_n, self.head_dim_v), (0, 1))
        sO_layout = cute.tile_to_shape(tile_atom_v, (self.tile_m, self.head_dim_v), (0, 1))

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]

        # The planner sizes plans by this model (``tiling.can_implement``): it must not
        # undercount the struct.
        smem_model = tiling.smem_bytes(self.head_dim, self.tile_m, self.tile_n, self.head_dim_v)
        assert SharedStorage.size_in_bytes() <= smem_model, (
            f"SharedStorage {SharedStorage.size_in_bytes()} bytes, tiling model {smem_model}"
        )

        gmem_copy_async, gmem_copy_store = gmem_row_copies(self.dtype, tile_atom, self.num_threads)

        # Warps stack along M; each warp owns 16 * k rows of the query tile.
        num_warps = self.num_threads // 32
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)),
            (num_warps, 1, 1),
            permutation_mnk=(num_warps * 16, 16, 16),
        )

        if cutlass.const_expr(self.varlen):
            # Packed: (1, total, heads, dim); a CTA per query tile of the longest sequence.
            tile_counts = TileCounts.create(
                seqlen_q=max_seqlen_q, tile_m=self.tile_m, num_heads=mQ.shape[2],
                num_batches=mCuSeqlensQ.shape[0] - 1,
            )
        else:
            tile_counts = TileCounts.create(
                seqlen_q=mQ.shape[1], tile_m=self.tile_m, num_heads=mQ.shape[2],
                num_batches=mQ.shape[0],
            )
        self.kernel(
            mQ,
            mK,
            mV,
            mO,
            mLSE,
            mSink,
            mCuSeqlensQ,
            mCuSeqlensK,
            mSequsedK,
            capping.exp2_scale(softmax_scale, self.softcap),
            capping.tanh_scale(softmax_scale, self.softcap),
            tile_counts,
            sQ_layout,
            sKV_layout,
            sV_layout,
            sO_layout,
            gmem_copy_async,
            gmem_copy_store,
            tiled_mma,
            SharedStorage,
        ).launch(
            grid=SingleTileScheduler.grid_shape(tile_counts),
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor | None,
        mSink: cute.Tensor | None,
        mCuSeqlensQ: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
        mSequsedK: cute.Tensor | None,
        scale_log2: Float32,
        tanh_scale: Float32,
        tile_counts: TileCounts,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        gmem_copy_async: cute.TiledCopy,
        gmem_copy_store: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        tile_q = (self.tile_m, self.head_dim)
        tile_kv = (self.tile_n, self.head_dim)
        tile_v = (self.tile_n, self.head_dim_v)
        tile_o = (self.tile_m, self.head_dim_v)
        block_info = BlockInfo(
            tile_m=self.tile_m, tile_n=self.tile_n, causal=self.causal, window=self.window
        )

        # ---- Shared memory and the MMA's view of it (the same for every work tile) ---------------
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sV_layout)
        # V^T view (dim, tile_n): the B operand of O += P V.
        sVt = cute.composition(
            sV, cute.make_layout((self.head_dim_v, self.tile_n), stride=(self.tile_n, 1))
        )
        thr_mma = tiled_mma.get_slice(tidx)
        rQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        rK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        rVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
        ldmatrix, ldmatrix_t = ldmatrix_atoms(self.dtype)
        smem_thr_copy_Q = cute.make_tiled_copy_A(ldmatrix, tiled_mma).get_slice(tidx)
        smem_thr_copy_K = cute.make_tiled_copy_B(ldmatrix, tiled_mma).get_slice(tidx)
        smem_thr_copy_V = cute.make_tiled_copy_B(ldmatrix_t, tiled_mma).get_slice(tidx)
        mma = MmaOperands(
            tiled_mma=tiled_mma,
            thr_mma=thr_mma,
            rQ=rQ,
            rK=rK,
            rVt=rVt,
            q_operand=SmemOperand(
                smem_thr_copy_Q.partition_S(sQ), smem_thr_copy_Q.retile(rQ), smem_thr_copy_Q
            ),
            k_operand=SmemOperand(
                smem_thr_copy_K.partition_S(sK), smem_thr_copy_K.retile(rK), smem_thr_copy_K
            ),
            vt_operand=SmemOperand(
                smem_thr_copy_V.partition_S(sVt), smem_thr_copy_V.retile(rVt), smem_thr_copy_V
            ),
        )
        gmem_thr_copy = gmem_copy_async.get_slice(tidx)
        # Row coordinates of this thread's copies; thread 0's are compile-time constants.
        coords_q = cute.make_identity_tensor(tile_q)
        coords_kv = cute.make_identity_tensor(tile_kv)
        tQcQ = gmem_thr_copy.partition_S(coords_q)
        t0QcQ = gmem_copy_async.get_slice(0).partition_S(coords_q)
        tQsQ = gmem_thr_copy.partition_D(sQ)

        # One work tile per CTA, taken straight-line: the single-tile form of the scheduler loop
        # (`while work.is_valid: ...; work = scheduler.advance()`). That loop folds away, but it
        # still changes register allocation: at d128 it added spills to the main loop.
        scheduler = SingleTileScheduler.create(tile_counts, longest_first=self.causal)
        work = scheduler.initial_work_tile()
        m_block, head, batch = work.m_block, work.head, work.batch
        if cutlass.const_expr(self.varlen):
            seqlen = SeqlenInfo.varlen(mCuSeqlensQ, mCuSeqlensK, mSequsedK, batch)
        else:
            seqlen = SeqlenInfo.fixed(mQ, mK)
        head_kv = head // (mQ.shape[2] // mK.shape[2])
        n_block_min, n_block_max = block_info.n_block_min_max(seqlen, m_block)
        if cutlass.const_expr(self.varlen):
            # A query tile past its sequence's end (the grid covers the longest one) does no
            # work: no key tile, and its loads and stores are predicated off by row.
            if m_block * self.tile_m >= seqlen.seqlen_q:
                n_block_max = n_block_min

        # ---- Global tiles of this work tile and their copy partitions ----------------------------
        gQ = cute.local_tile(
            seqlen.rows(mQ, batch, head, keys=False, packed=self.varlen), tile_q, (m_block, 0)
        )
        gK = cute.local_tile(
            seqlen.rows(mK, batch, head_kv, keys=True, packed=self.varlen), tile_kv, (None, 0)
        )
        gV = cute.local_tile(
            seqlen.rows(mV, batch, head_kv, keys=True, packed=self.varlen), tile_v, (None, 0)
        )
        tQgQ = gmem_thr_copy.partition_S(gQ)
        kv = KVCopies(
            tiled_copy=gmem_copy_async,
            gK=gmem_thr_copy.partition_S(gK),
            sK=gmem_thr_copy.partition_D(sK),
            gV=gmem_thr_copy.partition_S(gV),
            sV=gmem_thr_copy.partition_D(sV),
            coords=gmem_thr_copy.partition_S(coords_kv),
            coords_t0=gmem_copy_async.get_slice(0).partition_S(coords_kv),
        )
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_o), Float32)
        acc_O.fill(0.0)
        rows_per_thread = cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1])
        query = QueryTile(
            m_block=m_block,
            seqlen=seqlen,
            acc_O=acc_O,
            softmax=OnlineSoftmax(scale_log2, rows_per_thread, reduce_chains=1),
            mask=AttentionMask(
                tile_m=self.tile_m, tile_n=self.tile_n, seqlen=seqlen, window=self.window
            ),
            tanh_scale=tanh_scale,
            n_block_min=n_block_min,
        )

        if cutlass.const_expr(self.input_dim is not None):
            # A padded head dim: the columns no load writes hold zeros from here on.
            zero_columns_past(tQsQ, tQcQ, self.input_dim)
            for smem in (kv.sK, kv.sV):
                zero_columns_past(smem, kv.coords, self.input_dim)

        # ---- Prologue: Q and the last visible K tile ---------------------------------------------
        q_rows_left = seqlen.seqlen_q - m_block * self.tile_m
        thread_q_rows_left = q_rows_left - tQcQ[0][0]
        for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
            if t0QcQ[0, m, 0][0] < thread_q_rows_left:
                copy_row(
                    gmem_copy_async, tQgQ[None, m, None], tQsQ[None, m, None],
                    tQcQ[None, m, None], self.input_dim,
                )
        if n_block_max > n_block_min:
            self.load_kv_tile(
                kv.gK, kv.sK, n_block_max - 1, kv=kv, seqlen_k=seqlen.seqlen_k,
                check_rows=True, zero_fill=False,
            )
        cute.arch.cp_async_commit_group()

        # ---- Main loop: key tiles from last to first ---------------------------------------------
        # The last tile is masked (seqlen bound, and the diagonal when causal); then the
        # tiles crossing the diagonal; then the fully visible ones, unmasked. A local window:
        # the tiles across its right bound, the unmasked ones, those across its left bound.
        num_causal_tiles = Int32(0)
        if cutlass.const_expr(self.causal):
            causal_start = block_info.n_block_causal_start(seqlen, m_block)
            num_causal_tiles = cutlass.max(n_block_max - 1 - causal_start, 0)
        n_block_unmasked_end = cutlass.max(n_block_max - 1 - num_causal_tiles, n_block_min)
        num_unmasked = n_block_unmasked_end - n_block_min
        num_left_masked = Int32(0)
        if cutlass.const_expr(self.window is not None):
            num_causal_tiles, num_unmasked, num_left_masked = block_info.window_tile_counts(
                seqlen, m_block, n_block_min, n_block_max
            )
            n_block_unmasked_end = n_block_max - 1 - num_causal_tiles
        masks_first = self.causal or self.window is not None
        if n_block_max > n_block_min:
            self.compute_tile(
                n_block_max - 1, kv=kv, mma=mma, query=query,
                is_first=True, mask_seqlen=True, mask_causal=masks_first,
            )
        for i in cutlass.range(num_causal_tiles, unroll=1):
            self.compute_tile(
                n_block_max - 2 - i, kv=kv, mma=mma, query=query,
                is_first=False, mask_seqlen=False, mask_causal=True,
            )
        for i in cutlass.range(num_unmasked, unroll=1):
            self.compute_tile(
                n_block_unmasked_end - 1 - i, kv=kv, mma=mma, query=query,
                is_first=False, mask_seqlen=False, mask_causal=False,
            )
        if cutlass.const_expr(self.window is not None):
            for i in cutlass.range(num_left_masked, unroll=1):
                self.compute_tile(
                    n_block_min + num_left_masked - 1 - i, kv=kv, mma=mma, query=query,
                    is_first=False, mask_seqlen=False, mask_causal=True,
                )

        # ---- Epilogue ----------------------------------------------------------------------------
        lse = cute.make_rmem_tensor(query.softmax.num_rows, Float32)
        score_tile = (self.tile_m, self.tile_n)
        sinks = None
        if cutlass.const_expr(self.sink):
            sinks = row_sinks(
                mSink, head, tile_coords(thr_mma, score_tile), query.softmax.num_rows, pack_gqa=1
            )
        row_scale = query.softmax.finalize(lse, sinks)
        rescale_rows(acc_O, row_scale)
        if cutlass.const_expr(mLSE is not None):
            store_lse(
                cute.local_tile(
                    seqlen.lse_row(mLSE, batch, head, packed=self.varlen), (self.tile_m,),
                    (m_block,),
                ),
                lse,
                tile_coords(thr_mma, score_tile),
                q_rows_left,
            )
        # O overwrites the Q buffer: the Q cp.async must have landed (a tile that saw no
        # key never waited for it) and every warp must be done reading Q and V.
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        sO = sQ
        if cutlass.const_expr(self.head_dim_v != self.head_dim):
            sO = storage.sQ.get_tensor(sO_layout)  # O (dim_v columns) in Q's buffer
        store_o(
            acc_O,
            sO,
            cute.local_tile(
                seqlen.rows(mO, batch, head, keys=False, packed=self.varlen), tile_o, (m_block, 0)
            ),
            q_rows_left,
            tiled_mma=tiled_mma,
            gmem_tiled_copy=gmem_copy_store,
            tidx=tidx,
            sync=cute.arch.barrier,
            columns=self.input_dim,
        )

    @cute.jit
    def compute_tile(
        self,
        n_block: Int32,
        *,
        kv: KVCopies,
        mma: MmaOperands,
        query: QueryTile,
        is_first: cutlass.Constexpr[bool],
        mask_seqlen: cutlass.Constexpr[bool],
        mask_causal: cutlass.Constexpr[bool],
    ):
        """Steps 2a-2f for one key tile."""
        acc_S = cute.make_rmem_tensor(
            mma.thr_mma.partition_shape_C((self.tile_m, self.tile_n)), Float32
        )
        acc_S.fill(0.0)
        # (a) K[n_block] (and Q) landed; every warp finished reading V of the previous tile.
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        self.load_kv_tile(
            kv.gV, kv.sV, n_block, kv=kv, seqlen_k=query.seqlen.seqlen_k,
            check_rows=is_first, zero_fill=True,
        )
        cute.arch.cp_async_commit_group()
        # (b) S = Q K^T
        gemm(mma.tiled_mma, acc_S, mma.rQ, mma.rK, mma.k_operand, a_from_smem=mma.q_operand)
        # (c) V[n_block] landed; every warp finished reading K[n_block].
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if n_block > query.n_block_min:
            self.load_kv_tile(
                kv.gK, kv.sK, n_block - 1, kv=kv, seqlen_k=query.seqlen.seqlen_k,
                check_rows=False, zero_fill=False,
            )
        cute.arch.cp_async_commit_group()
        # (d) soft-cap and mask, (e) online softmax
        capping.apply_softcap(acc_S, query.tanh_scale, self.softcap)
        if cutlass.const_expr(mask_seqlen or mask_causal):
            query.mask.apply(
                acc_S, mma.thr_mma, query.m_block, n_block,
                mask_seqlen=mask_seqlen, mask_causal=mask_causal,
            )
        row_scale = query.softmax.step(acc_S, is_first=is_first)
        if cutlass.const_expr(not is_first):
            rescale_rows(query.acc_O, row_scale)
        # (f) O += P V, P converted in registers to the A operand
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        gemm(mma.tiled_mma, query.acc_O, acc_as_operand_a(rP), mma.rVt, mma.vt_operand)

    @cute.jit
    def load_kv_tile(
        self,
        tXgX: cute.Tensor,
        tXsX: cute.Tensor,
        n_block: Int32,
        *,
        kv: KVCopies,
        seqlen_k: Int32,
        check_rows: cutlass.Constexpr[bool],
        zero_fill: cutlass.Constexpr[bool],
    ):
        """cp.async one K or V tile (kv.gK / kv.sK or kv.gV / kv.sV); rows past seqlen_k are
        skipped (zeroed for V, since P = 0 times an uninitialised NaN would still be NaN)."""
        if cutlass.const_expr(not check_rows and self.input_dim is None):
            cute.copy(kv.tiled_copy, tXgX[None, None, None, n_block], tXsX)
        elif cutlass.const_expr(not check_rows):
            for n in cutlass.range_constexpr(cute.size(tXsX, mode=[1])):
                copy_row(
                    kv.tiled_copy, tXgX[None, n, None, n_block], tXsX[None, n, None],
                    kv.coords[None, n, None], self.input_dim,
                )
        else:
            rows_left = seqlen_k - n_block * self.tile_n - kv.coords[0][0]
            for n in cutlass.range_constexpr(cute.size(tXsX, mode=[1])):
                if kv.coords_t0[0, n, 0][0] < rows_left:
                    copy_row(
                        kv.tiled_copy, tXgX[None, n, None, n_block], tXsX[None, n, None],
                        kv.coords[None, n, None], self.input_dim,
                    )
                else:
                    if cutlass.const_expr(zero_fill):
                        tXsX[None, n, None].fill(0)
