"""Attention forward for the Ampere-class family: warp mma.sync (m16n8k16) + cp.async.

Layouts (flash-attn's): q, out (batch, seqlen_q, heads_q, dim); k, v (batch, seqlen_k,
heads_kv, dim); lse (batch, heads_q, seqlen_q) fp32. The last mode is contiguous; every other
stride is a multiple of 8 elements (16 bytes) and may exceed 2^31 (64-bit offsets).

One CTA computes one (tile_m x dim) tile of out for one (batch, head). Algorithm:
  1. cp.async Q tile and the last K tile into shared memory.
  2. For each key tile n_block, from the last visible one down to 0:
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

Constraints: fp16/bf16; head_dim a multiple of 32 (64, 96, 128, 192, 256), dim_v == dim;
tile_n a multiple of 16; shared memory of Q + K + V tiles within the arch's capacity.

Compile and run: ``cuteattn.flash_attn_func`` plans, compiles (once per plan) and launches it;
tests/cpu/test_compile.py cross-compiles every variant for sm_80 / sm_90a / sm_120a on a CPU.
Profile with ``ncu --clock-control none python -m cuteattn.bench --dims 128``.
"""

import math
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warp

from cuteattn.kernels.common.block_range import BlockRange
from cuteattn.kernels.common.fragments import (
    acc_as_operand_a,
    acc_as_rows_cols,
    smem_tile_atom,
)
from cuteattn.kernels.common.mask import AttentionMask
from cuteattn.kernels.common.softmax import OnlineSoftmax, rescale_rows
from cuteattn.kernels.sm80 import tiling
from cuteattn.kernels.sm80.warp_gemm import SmemOperand, gemm

LOG2_E = math.log2(math.e)


class FlashForwardSm80:
    def __init__(
        self,
        *,
        dtype: type[cutlass.Numeric],
        head_dim: int,
        tile_m: int,
        tile_n: int,
        num_threads: int,
        causal: bool,
    ):
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.num_threads = num_threads
        self.causal = causal

    can_implement = staticmethod(tiling.can_implement)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mK: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mV: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mO: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mLSE: cute.Tensor,  # (batch, heads_q, seqlen_q) fp32
        softmax_scale: Float32,
        stream,
    ):
        if cutlass.const_expr(not (mQ.element_type == mK.element_type == mV.element_type)):
            raise TypeError("q, k and v must share one dtype")
        if cutlass.const_expr(mO.element_type != mQ.element_type):
            raise TypeError("out must have the dtype of q")

        # Shared memory: swizzled K-major tiles; O reuses the Q buffer in the epilogue.
        tile_atom = smem_tile_atom(self.dtype, self.head_dim)
        sQ_layout = cute.tile_to_shape(tile_atom, (self.tile_m, self.head_dim), (0, 1))
        sKV_layout = cute.tile_to_shape(tile_atom, (self.tile_n, self.head_dim), (0, 1))

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]

        # Global <-> shared copies: 16 bytes per thread per access, rows of the swizzle atom.
        elems_per_copy = 128 // self.dtype.width
        threads_per_row = tile_atom.outer.shape[1] // elems_per_copy
        thread_layout = cute.make_layout(
            (self.num_threads // threads_per_row, threads_per_row), stride=(threads_per_row, 1)
        )
        value_layout = cute.make_layout((1, elems_per_copy))
        gmem_copy_async = cute.make_tiled_copy_tv(
            cute.make_copy_atom(
                cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                self.dtype,
                num_bits_per_copy=128,
            ),
            thread_layout,
            value_layout,
        )
        gmem_copy_store = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128),
            thread_layout,
            value_layout,
        )

        # Warps stack along M; each warp owns 16 * k rows of the query tile.
        num_warps = self.num_threads // 32
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)),
            (num_warps, 1, 1),
            permutation_mnk=(num_warps * 16, 16, 16),
        )

        num_m_blocks = cute.ceil_div(mQ.shape[1], self.tile_m)
        grid = (num_m_blocks, cute.size(mQ.shape[2]), cute.size(mQ.shape[0]))
        self.kernel(
            mQ,
            mK,
            mV,
            mO,
            mLSE,
            softmax_scale * LOG2_E,
            sQ_layout,
            sKV_layout,
            gmem_copy_async,
            gmem_copy_store,
            tiled_mma,
            SharedStorage,
        ).launch(
            grid=grid,
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
        mLSE: cute.Tensor,
        scale_log2: Float32,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        gmem_copy_async: cute.TiledCopy,
        gmem_copy_store: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block_idx, head, batch = cute.arch.block_idx()
        seqlen_q = mQ.shape[1]
        seqlen_k = mK.shape[1]
        m_block = m_block_idx
        if cutlass.const_expr(self.causal):
            # Longest rows (most key tiles) first, so short ones fill the tail of the grid.
            m_block = cute.ceil_div(seqlen_q, self.tile_m) - 1 - m_block_idx
        head_kv = head // (mQ.shape[2] // mK.shape[2])

        block_range = BlockRange(self.tile_m, self.tile_n, self.causal, seqlen_q, seqlen_k)
        n_block_max = block_range.n_block_max(m_block)

        # ---- Tiles of this CTA -------------------------------------------------------------
        tile_q = (self.tile_m, self.head_dim)
        tile_kv = (self.tile_n, self.head_dim)
        gQ = cute.local_tile(mQ[batch, None, head, None], tile_q, (m_block, 0))
        gK = cute.local_tile(mK[batch, None, head_kv, None], tile_kv, (None, 0))
        gV = cute.local_tile(mV[batch, None, head_kv, None], tile_kv, (None, 0))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sKV_layout)
        # V^T view (dim, tile_n): the B operand of O += P V.
        sVt = cute.composition(
            sV, cute.make_layout((self.head_dim, self.tile_n), stride=(self.tile_n, 1))
        )

        # ---- Global -> shared copy partitions ----------------------------------------------
        gmem_thr_copy = gmem_copy_async.get_slice(tidx)
        tQgQ = gmem_thr_copy.partition_S(gQ)
        tQsQ = gmem_thr_copy.partition_D(sQ)
        tKgK = gmem_thr_copy.partition_S(gK)
        tKsK = gmem_thr_copy.partition_D(sK)
        tVgV = gmem_thr_copy.partition_S(gV)
        tVsV = gmem_thr_copy.partition_D(sV)
        # Row coordinates of this thread's copies; thread 0's are compile-time constants.
        coords_q = cute.make_identity_tensor(tile_q)
        coords_kv = cute.make_identity_tensor(tile_kv)
        tQcQ = gmem_thr_copy.partition_S(coords_q)
        t0QcQ = gmem_copy_async.get_slice(0).partition_S(coords_q)
        tKVcKV = gmem_thr_copy.partition_S(coords_kv)
        t0KVcKV = gmem_copy_async.get_slice(0).partition_S(coords_kv)

        # ---- MMA partitions and shared -> register copies ----------------------------------
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.tile_m, self.head_dim)), Float32
        )
        acc_O.fill(0.0)

        ldmatrix = cute.make_copy_atom(
            warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
        )
        ldmatrix_t = cute.make_copy_atom(
            warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype
        )
        smem_thr_copy_Q = cute.make_tiled_copy_A(ldmatrix, tiled_mma).get_slice(tidx)
        smem_thr_copy_K = cute.make_tiled_copy_B(ldmatrix, tiled_mma).get_slice(tidx)
        smem_thr_copy_V = cute.make_tiled_copy_B(ldmatrix_t, tiled_mma).get_slice(tidx)
        q_operand = SmemOperand(
            smem_thr_copy_Q.partition_S(sQ), smem_thr_copy_Q.retile(tSrQ), smem_thr_copy_Q
        )
        k_operand = SmemOperand(
            smem_thr_copy_K.partition_S(sK), smem_thr_copy_K.retile(tSrK), smem_thr_copy_K
        )
        vt_operand = SmemOperand(
            smem_thr_copy_V.partition_S(sVt), smem_thr_copy_V.retile(tOrVt), smem_thr_copy_V
        )

        rows_per_thread = cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1])
        softmax = OnlineSoftmax(scale_log2, rows_per_thread)
        mask = AttentionMask(self.tile_m, self.tile_n, seqlen_q, seqlen_k)

        # ---- Prologue: Q and the last visible K tile ---------------------------------------
        q_rows_left = seqlen_q - m_block * self.tile_m - tQcQ[0][0]
        for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
            if t0QcQ[0, m, 0][0] < q_rows_left:
                cute.copy(gmem_copy_async, tQgQ[None, m, None], tQsQ[None, m, None])
        if n_block_max > 0:
            self.load_kv_tile(
                gmem_copy_async, tKgK, tKsK, tKVcKV, t0KVcKV, n_block_max - 1, seqlen_k, True, False
            )
        cute.arch.cp_async_commit_group()

        # ---- Main loop: key tiles from last to first ----------------------------------------
        ctx = SimpleNamespace(
            m_block=m_block, seqlen_k=seqlen_k, thr_mma=thr_mma, tiled_mma=tiled_mma,
            gmem_copy=gmem_copy_async, tKgK=tKgK, tKsK=tKsK, tVgV=tVgV, tVsV=tVsV,
            tKVcKV=tKVcKV, t0KVcKV=t0KVcKV, tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt,
            q_operand=q_operand, k_operand=k_operand, vt_operand=vt_operand, acc_O=acc_O,
            softmax=softmax, mask=mask,
        )
        num_causal_tiles = Int32(0)
        if cutlass.const_expr(self.causal):
            causal_start = block_range.n_block_causal_start(m_block)
            num_causal_tiles = cutlass.max(n_block_max - 1 - causal_start, 0)
        n_block_unmasked_end = cutlass.max(n_block_max - 1 - num_causal_tiles, 0)
        if n_block_max > 0:
            self.compute_tile(ctx, n_block_max - 1, True, True, self.causal)
        for i in cutlass.range(num_causal_tiles, unroll=1):
            self.compute_tile(ctx, n_block_max - 2 - i, False, False, True)
        for i in cutlass.range(n_block_unmasked_end, unroll=1):
            self.compute_tile(ctx, n_block_unmasked_end - 1 - i, False, False, False)

        # ---- Epilogue ------------------------------------------------------------------------
        lse = cute.make_rmem_tensor(softmax.num_rows, Float32)
        row_scale = softmax.finalize(lse)
        rescale_rows(acc_O, row_scale)
        self.store_lse(mLSE, lse, thr_mma, batch, head, m_block, seqlen_q)

        rO = cute.make_fragment_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        sO = sQ  # O takes over the Q buffer (same tile shape and swizzle)
        # O overwrites the Q buffer: the Q cp.async must have landed (a tile that saw no key
        # never waited for it) and every warp must be done reading Q and V.
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        smem_store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype)
        smem_thr_store = cute.make_tiled_copy_C(smem_store_atom, tiled_mma).get_slice(tidx)
        cute.copy(smem_store_atom, smem_thr_store.retile(rO), smem_thr_store.partition_D(sO))
        cute.arch.barrier()

        gO = cute.local_tile(mO[batch, None, head, None], tile_q, (m_block, 0))
        gmem_thr_store = gmem_copy_store.get_slice(tidx)
        tOsO = gmem_thr_store.partition_S(sO)
        tOgO = gmem_thr_store.partition_D(gO)
        tOrO = cute.make_fragment_like(tOgO, self.dtype)
        cute.autovec_copy(tOsO, tOrO)
        for m in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
            if t0QcQ[0, m, 0][0] < q_rows_left:
                cute.copy(gmem_copy_store, tOrO[None, m, None], tOgO[None, m, None])

    @cute.jit
    def compute_tile(
        self,
        ctx: SimpleNamespace,
        n_block: Int32,
        is_first: cutlass.Constexpr[bool],
        mask_seqlen: cutlass.Constexpr[bool],
        mask_causal: cutlass.Constexpr[bool],
    ):
        """Steps 2a-2f for one key tile."""
        acc_S = cute.make_rmem_tensor(
            ctx.thr_mma.partition_shape_C((self.tile_m, self.tile_n)), Float32
        )
        acc_S.fill(0.0)
        # (a) K[n_block] (and Q) landed; every warp finished reading V of the previous tile.
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        self.load_kv_tile(
            ctx.gmem_copy, ctx.tVgV, ctx.tVsV, ctx.tKVcKV, ctx.t0KVcKV, n_block, ctx.seqlen_k,
            is_first, True,
        )
        cute.arch.cp_async_commit_group()
        # (b) S = Q K^T
        gemm(ctx.tiled_mma, acc_S, ctx.tSrQ, ctx.tSrK, ctx.k_operand, a_from_smem=ctx.q_operand)
        # (c) V[n_block] landed; every warp finished reading K[n_block].
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if n_block > 0:
            self.load_kv_tile(
                ctx.gmem_copy, ctx.tKgK, ctx.tKsK, ctx.tKVcKV, ctx.t0KVcKV, n_block - 1,
                ctx.seqlen_k, False, False,
            )
        cute.arch.cp_async_commit_group()
        # (d) mask, (e) online softmax
        if cutlass.const_expr(mask_seqlen or mask_causal):
            ctx.mask.apply(acc_S, ctx.thr_mma, ctx.m_block, n_block, mask_seqlen, mask_causal)
        row_scale = ctx.softmax.step(acc_S, is_first)
        if cutlass.const_expr(not is_first):
            rescale_rows(ctx.acc_O, row_scale)
        # (f) O += P V, P converted in registers to the A operand
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        gemm(ctx.tiled_mma, ctx.acc_O, acc_as_operand_a(rP), ctx.tOrVt, ctx.vt_operand)

    @cute.jit
    def load_kv_tile(
        self,
        gmem_copy: cute.TiledCopy,
        tXgX: cute.Tensor,
        tXsX: cute.Tensor,
        tXcX: cute.Tensor,
        t0XcX: cute.Tensor,
        n_block: Int32,
        seqlen_k: Int32,
        check_rows: cutlass.Constexpr[bool],
        zero_fill: cutlass.Constexpr[bool],
    ):
        """cp.async one K or V tile; rows past seqlen_k are skipped (zeroed for V, since
        P = 0 times an uninitialised NaN would still be NaN)."""
        if cutlass.const_expr(not check_rows):
            cute.copy(gmem_copy, tXgX[None, None, None, n_block], tXsX)
        else:
            rows_left = seqlen_k - n_block * self.tile_n - tXcX[0][0]
            for n in cutlass.range_constexpr(cute.size(tXsX, mode=[1])):
                if t0XcX[0, n, 0][0] < rows_left:
                    cute.copy(gmem_copy, tXgX[None, n, None, n_block], tXsX[None, n, None])
                else:
                    if cutlass.const_expr(zero_fill):
                        tXsX[None, n, None].fill(0)

    @cute.jit
    def store_lse(
        self,
        mLSE: cute.Tensor,
        lse: cute.Tensor,
        thr_mma: cute.ThrMma,
        batch: Int32,
        head: Int32,
        m_block: Int32,
        seqlen_q: Int32,
    ):
        """The thread holding column 0 of a row writes that row's LSE."""
        coords = acc_as_rows_cols(
            thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
        )
        if coords[0, 0][1] == 0:
            gLSE = cute.local_tile(mLSE[batch, head, None], (self.tile_m,), (m_block,))
            rows_left = seqlen_q - m_block * self.tile_m
            for r in cutlass.range_constexpr(cute.size(lse)):
                row = coords[r, 0][0]
                if row < rows_left:
                    gLSE[row] = lse[r]
