"""Attention backward for the Ampere-class family: warp mma.sync (m16n8k16) + cp.async.

Inputs (flash-attn layouts): q, dout (batch, seqlen_q, heads_q, dim); k, v (batch, seqlen_k,
heads_kv, dim); from the preprocess (``cuteattn.kernels.bwd_prep``), per query row padded to a
multiple of tile_m: lse_log2 = lse * log2(e) (+inf where the forward saw no key, and on the
padding rows) and dpsum = rowsum(dout * out), both (batch, heads_q, seqlen_q_padded) fp32;
dq_accum (batch, heads_q, 1, seqlen_q_padded, dim) fp32, zeroed, each query tile in fragment order
(6. below). Outputs: dk, dv in k's layout;
dS K added to dq_accum (the postprocess scales and casts it).

One CTA owns one key tile (tile_n keys) of one KV head: it keeps dK and dV of the tile in
registers and visits every query tile of every query head that shares the KV head (GQA / MQA
need no atomics and no expanded buffers for dK, dV). For each (query head, m_block):
  1. cp.async Q and dO tiles (rows past seqlen_q zeroed); with two stages, the next step's
     tiles load into the other buffer while this step computes;
  2. S = Q K^T and dP = dO V^T (ldmatrix + mma.sync, operands in shared memory);
  3. soft-cap S (``kernels/common/softcap.py``, when on), mask it where the tile hides a key
     (seqlen_k bound, causal diagonal), P = exp2(S * scale_log2 - lse_log2), the probabilities
     of the forward without recomputing its statistics;
     dS = P * (dP - dpsum) (soft-capped: times 1 - tanh^2);
  4. P and dS (16-bit) to shared memory;
  5. dV += P^T dO, the transposed operands read with ldmatrix.trans;
  6. dQ = dS K, added to dq_accum with fp32 atomics (red.global.add) straight from the
     accumulator, before 7. so that they drain under its MMAs. dq_accum holds each query tile
     in the fragment order of this kernel's dQ MMA (thread t's i-th value at i * threads + t:
     a warp's 32 atomics cover 128 contiguous bytes, FlashAttention-2's order);
     ``kernels/sm80/dq_postprocess.py`` reads it back. Deterministic: the
     key tiles of a KV head add to one query tile in a fixed order, each waiting on a
     per-(batch, head, m_block) counter (``semaphore``, zeroed) for its turn
     (``kernels/common/turns.py``: ascending key tiles, descending when causal, and the CTAs
     dispatched in turn order so that the waits end), and passes the turn on at the next
     step's first barrier, once its additions have drained under 7. (one stage: at the
     step's closing barrier);
  7. dK += dS^T Q.
Then dK *= softmax_scale, and dK, dV go through shared memory (K's and V's buffers) to 128-bit
global stores; rows past seqlen_k are not written. Key tiles no query row can see (causal,
seqlen_q < seqlen_k... the rows above the diagonal) are skipped; a key tile that no query
sees writes dK = dV = 0.

K and V rows past seqlen_k are zeroed in shared memory: dQ = dS K must not pick up 0 * NaN.

Constraints: fp16/bf16; head_dim 64, 96, 128, 192, 256 (inputs of fewer columns, a multiple of
8, are padded: ``kernels/common/columns.py``); warps tile the three GEMMs as
``tiling.backward_warp_layouts`` says (tile_m, tile_n and dim multiples of its extents).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from cuteattn.kernels.common import softcap as capping
from cuteattn.kernels.common import turns
from cuteattn.kernels.common.block_info import BlockInfo
from cuteattn.kernels.common.columns import copy_row, zero_columns_past
from cuteattn.kernels.common.compile_args import check_same_dtype
from cuteattn.kernels.common.convert import convert_packed
from cuteattn.kernels.common.epilogue import store_o
from cuteattn.kernels.common.fragments import acc_as_rows_cols, tile_coords
from cuteattn.kernels.common.kernel_base import AttentionKernel
from cuteattn.kernels.common.mask import AttentionMask
from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.smem_tiles import gmem_row_copies, smem_tile_atom, transposed
from cuteattn.kernels.common.tile_scheduler import LinearTileCounts, LinearTileScheduler
from cuteattn.kernels.sm80 import tiling
from cuteattn.kernels.sm80.fragments import ldmatrix_atoms, warp_grid_mma
from cuteattn.kernels.sm80.warp_gemm import SmemOperand, gemm


def _smem_operand(copy_atom, tiled_copy_fn, tiled_mma, tidx, smem, regs) -> SmemOperand:
    thr_copy = tiled_copy_fn(copy_atom, tiled_mma).get_slice(tidx)
    return SmemOperand(thr_copy.partition_S(smem), thr_copy.retile(regs), thr_copy)


def _at_stage(operand: SmemOperand, stage) -> SmemOperand:
    """One stage of an operand partitioned over a staged buffer (stages the last mode)."""
    return SmemOperand(operand.smem[None, None, None, stage], operand.regs_view, operand.thr_copy)


class FlashBackwardSm80(AttentionKernel):
    def __init__(
        self, *, num_threads: int, num_stages: int = 1, deterministic: bool = False, **shape
    ):
        """num_stages: Q / dO buffers (2: the next query tile loads during this one); shape:
        ``AttentionKernel``'s fields."""
        super().__init__(**shape)
        self.num_stages = num_stages
        self.deterministic = deterministic
        self.num_threads = num_threads
        self.warps_sdp, self.warps_dkv, self.warps_dq = tiling.backward_warp_layouts(
            num_threads // 32, self.head_dim
        )

    can_implement = staticmethod(tiling.can_implement_backward)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mK: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mV: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mdO: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mLSE: cute.Tensor,  # (batch, heads_q, seqlen_q_padded) fp32, log2 units
        mDpsum: cute.Tensor,  # (batch, heads_q, seqlen_q_padded) fp32
        mdQaccum: cute.Tensor,  # (batch, heads_q, 1, seqlen_q_padded, dim) fp32
        mdK: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mdV: cute.Tensor,  # (batch, seqlen_k, heads_kv, dim)
        mSemaphore: cute.Tensor | None,  # deterministic: (batch, heads_q, m_blocks) int32, zeroed
        mCuSeqlensQ: cute.Tensor | None,  # varlen: (batch + 1,) int32 row offsets, else None
        mCuSeqlensK: cute.Tensor | None,
        mSequsedK: cute.Tensor | None,  # varlen: (batch,) int32 keys used, or None
        max_seqlen_k: Int32,  # varlen: the longest key sequence (the grid), else unused
        softmax_scale: Float32,
        stream,
    ):
        check_same_dtype(q=mQ, k=mK, v=mV, dout=mdO, dk=mdK, dv=mdV)

        tile_atom = smem_tile_atom(self.dtype, self.head_dim)
        sQ_layout = cute.tile_to_shape(
            tile_atom, (self.tile_m, self.head_dim, self.num_stages), (0, 1, 2)
        )
        sKV_layout = cute.tile_to_shape(tile_atom, (self.tile_n, self.head_dim), (0, 1))
        # dO and V: head_dim_v columns (the same swizzle-atom width: tiling.same_row_copies).
        tile_atom_v = smem_tile_atom(self.dtype, self.head_dim_v)
        sdO_layout = cute.tile_to_shape(
            tile_atom_v, (self.tile_m, self.head_dim_v, self.num_stages), (0, 1, 2)
        )
        sV_layout = cute.tile_to_shape(tile_atom_v, (self.tile_n, self.head_dim_v), (0, 1))
        sPdS_layout = cute.tile_to_shape(
            smem_tile_atom(self.dtype, self.tile_n), (self.tile_m, self.tile_n), (0, 1)
        )

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdO_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sPdS_layout)], 1024]
            sdS: cute.struct.Align[
                cute.struct.MemRange[self.dtype, cute.cosize(sPdS_layout)], 1024
            ]
            # lse and dpsum of each stage's query tile: (tile_m, 2, stages) fp32.
            sRows: cute.struct.Align[
                cute.struct.MemRange[Float32, self.tile_m * 2 * self.num_stages], 16
            ]

        # The planner sizes plans by this model (``can_implement_backward``): it must not
        # undercount the struct.
        smem_model = tiling.backward_smem_bytes(
            self.head_dim, self.tile_m, self.tile_n, self.num_stages, self.head_dim_v
        )
        assert SharedStorage.size_in_bytes() <= smem_model, (
            f"SharedStorage {SharedStorage.size_in_bytes()} bytes, tiling model {smem_model}"
        )

        gmem_copy_async, gmem_copy_store = gmem_row_copies(self.dtype, tile_atom, self.num_threads)

        grid = (cute.ceil_div(mK.shape[1], self.tile_n), mK.shape[2], mK.shape[0])
        tile_counts = None
        if cutlass.const_expr(self.deterministic and not self.varlen):
            # Pairs take turns at each key tile within L2 sections (``turns``).
            tile_counts = turns.make_section_counts(
                seqlen_q=mQ.shape[1], seqlen_k=mK.shape[1], tile_n=self.tile_n,
                num_heads_kv=mK.shape[2], num_batches=mK.shape[0],
                query_row_bytes=(self.head_dim + self.head_dim_v) * self.dtype.width // 8
                + self.head_dim * Float32.width // 8,
            )
            grid = LinearTileScheduler.grid_shape(tile_counts)
        if cutlass.const_expr(self.varlen):
            # Packed (1, total, heads, dim): a CTA per key tile of the longest sequence.
            grid = (
                cute.ceil_div(max_seqlen_k, self.tile_n), mK.shape[2], mCuSeqlensQ.shape[0] - 1
            )
        self.kernel(
            mQ, mK, mV, mdO, mLSE, mDpsum, mdQaccum, mdK, mdV, mSemaphore,
            mCuSeqlensQ, mCuSeqlensK, mSequsedK, tile_counts,
            capping.exp2_scale(softmax_scale, self.softcap), softmax_scale,
            sQ_layout, sdO_layout, sKV_layout, sV_layout, sPdS_layout, gmem_copy_async,
            gmem_copy_store,
            warp_grid_mma(self.dtype, self.warps_sdp),
            warp_grid_mma(self.dtype, self.warps_dkv),
            warp_grid_mma(self.dtype, self.warps_dq),
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
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mDpsum: cute.Tensor,
        mdQaccum: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        mSemaphore: cute.Tensor | None,
        mCuSeqlensQ: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
        mSequsedK: cute.Tensor | None,
        tile_counts: LinearTileCounts | None,  # fixed-length deterministic: the L2 sections
        scale_log2: Float32,
        softmax_scale: Float32,
        sQ_layout: cute.ComposedLayout,
        sdO_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sPdS_layout: cute.ComposedLayout,
        gmem_copy_async: cute.TiledCopy,
        gmem_copy_store: cute.TiledCopy,
        tiled_mma_sdp: cute.TiledMma,
        tiled_mma_dkv: cute.TiledMma,
        tiled_mma_dq: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        descending = self.deterministic and (self.causal or self.window is not None)
        if cutlass.const_expr(self.deterministic and not self.varlen):
            n_block, head_kv, batch = turns.section_work_tile(tile_counts, descending)
        else:
            block, head_kv, batch = cute.arch.block_idx()
            n_block = turns.key_tile_of_block(
                block, cute.arch.grid_dim()[0], descending=descending
            )
        tile_q = (self.tile_m, self.head_dim)
        tile_kv = (self.tile_n, self.head_dim)
        tile_v = (self.tile_n, self.head_dim_v)
        tile_mn = (self.tile_m, self.tile_n)
        if cutlass.const_expr(self.varlen):
            seqlen = SeqlenInfo.varlen(
                mCuSeqlensQ, mCuSeqlensK, mSequsedK, batch, rows_tile=self.tile_m
            )
        else:
            seqlen = SeqlenInfo.fixed(mQ, mK)
        group = mQ.shape[2] // mK.shape[2]
        tanh_scale = capping.tanh_scale(softmax_scale, self.softcap)

        # ---- Shared memory and its MMA views ------------------------------------------------------
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ_stages = storage.sQ.get_tensor(sQ_layout)
        sdO_stages = storage.sdO.get_tensor(sdO_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sV_layout)
        sP = storage.sP.get_tensor(sPdS_layout)
        sdS = storage.sdS.get_tensor(sPdS_layout)
        sRows = storage.sRows.get_tensor(cute.make_layout((self.tile_m, 2, self.num_stages)))
        sKt, sPt, sdSt = (transposed(t) for t in (sK, sP, sdS))
        # Register fragments come from stage 0; the ldmatrix partitions span every stage and a
        # step picks its own (``_at_stage``).
        sQ, sdO = sQ_stages[None, None, 0], sdO_stages[None, None, 0]
        sQt, sdOt = transposed(sQ), transposed(sdO)
        sQt_stages, sdOt_stages = transposed(sQ_stages), transposed(sdO_stages)

        thr_sdp = tiled_mma_sdp.get_slice(tidx)
        thr_dkv = tiled_mma_dkv.get_slice(tidx)
        thr_dq = tiled_mma_dq.get_slice(tidx)
        # S = Q K^T and dP = dO V^T: (tile_m, tile_n), k over dim.
        tSrQ = thr_sdp.make_fragment_A(thr_sdp.partition_A(sQ))
        tSrK = thr_sdp.make_fragment_B(thr_sdp.partition_B(sK))
        tdPrdO = thr_sdp.make_fragment_A(thr_sdp.partition_A(sdO))
        tdPrV = thr_sdp.make_fragment_B(thr_sdp.partition_B(sV))
        # dV += P^T dO and dK += dS^T Q: (tile_n, dim), k over tile_m.
        tdVrPt = thr_dkv.make_fragment_A(thr_dkv.partition_A(sPt))
        tdVrdOt = thr_dkv.make_fragment_B(thr_dkv.partition_B(sdOt))
        tdKrdSt = thr_dkv.make_fragment_A(thr_dkv.partition_A(sdSt))
        tdKrQt = thr_dkv.make_fragment_B(thr_dkv.partition_B(sQt))
        # dQ = dS K: (tile_m, dim), k over tile_n.
        tdQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS))
        tdQrKt = thr_dq.make_fragment_B(thr_dq.partition_B(sKt))

        ldmatrix, ldmatrix_t = ldmatrix_atoms(self.dtype)
        copy_a, copy_b = cute.make_tiled_copy_A, cute.make_tiled_copy_B
        q_operand = _smem_operand(ldmatrix, copy_a, tiled_mma_sdp, tidx, sQ_stages, tSrQ)
        k_operand = _smem_operand(ldmatrix, copy_b, tiled_mma_sdp, tidx, sK, tSrK)
        do_operand = _smem_operand(ldmatrix, copy_a, tiled_mma_sdp, tidx, sdO_stages, tdPrdO)
        v_operand = _smem_operand(ldmatrix, copy_b, tiled_mma_sdp, tidx, sV, tdPrV)
        pt_operand = _smem_operand(ldmatrix_t, copy_a, tiled_mma_dkv, tidx, sPt, tdVrPt)
        dot_operand = _smem_operand(
            ldmatrix_t, copy_b, tiled_mma_dkv, tidx, sdOt_stages, tdVrdOt
        )
        dst_operand = _smem_operand(ldmatrix_t, copy_a, tiled_mma_dkv, tidx, sdSt, tdKrdSt)
        qt_operand = _smem_operand(ldmatrix_t, copy_b, tiled_mma_dkv, tidx, sQt_stages, tdKrQt)
        ds_operand = _smem_operand(ldmatrix, copy_a, tiled_mma_dq, tidx, sdS, tdQrdS)
        kt_operand = _smem_operand(ldmatrix_t, copy_b, tiled_mma_dq, tidx, sKt, tdQrKt)
        # Registers -> shared memory for P and dS, two 16-bit values per store.
        store_pds = cute.make_tiled_copy_C(
            cute.make_copy_atom(
                cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=2 * self.dtype.width
            ),
            tiled_mma_sdp,
        ).get_slice(tidx)

        # ---- This CTA's key tile: K and V, rows past seqlen_k zeroed ------------------------------
        gmem_thr_copy = gmem_copy_async.get_slice(tidx)
        coords_kv = cute.make_identity_tensor(tile_kv)
        gK = cute.local_tile(
            seqlen.rows(mK, batch, head_kv, keys=True, packed=self.varlen), tile_kv, (n_block, 0)
        )
        gV = cute.local_tile(
            seqlen.rows(mV, batch, head_kv, keys=True, packed=self.varlen), tile_v, (n_block, 0)
        )
        kv_rows_left = seqlen.seqlen_k - n_block * self.tile_n
        if cutlass.const_expr(self.input_dim is not None):
            # A padded head dim: the columns no load writes hold zeros from here on.
            kv_coords = gmem_thr_copy.partition_S(coords_kv)
            q_coords = gmem_thr_copy.partition_S(cute.make_identity_tensor(tile_q))
            for smem in (sK, sV):
                zero_columns_past(gmem_thr_copy.partition_D(smem), kv_coords, self.input_dim)
            for stages in (sQ_stages, sdO_stages):
                for stage in cutlass.range_constexpr(self.num_stages):
                    zero_columns_past(
                        gmem_thr_copy.partition_D(stages[None, None, stage]), q_coords,
                        self.input_dim,
                    )
        self.load_rows(
            gmem_copy_async, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK),
            coords_kv, kv_rows_left,
        )
        self.load_rows(
            gmem_copy_async, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV),
            cute.make_identity_tensor(tile_v), kv_rows_left,
        )
        cute.arch.cp_async_commit_group()

        acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C(tile_kv), Float32)
        acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C(tile_v), Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        score_coords = tile_coords(thr_sdp, tile_mn)
        num_rows = cute.size(score_coords, mode=[0])

        # ---- Query tiles that see this key tile, for every query head of the group ---------------
        block_info = BlockInfo(
            tile_m=self.tile_m, tile_n=self.tile_n, causal=self.causal, window=self.window
        )
        m_block_min = block_info.m_block_min(seqlen, n_block)
        m_block_max = block_info.m_block_max(seqlen, n_block)
        num_m_blocks = cutlass.max(m_block_max - m_block_min, 0)
        if cutlass.const_expr(self.varlen):
            # A key tile past its sequence's keys (the grid covers the longest sequence) visits
            # no query tile: it would add nothing, and, deterministic, wait for a turn that
            # never comes (the turns count this sequence's key tiles only).
            if n_block * self.tile_n >= seqlen.seqlen_k:
                num_m_blocks = Int32(0)
        num_steps = group * num_m_blocks
        query_tiles = dict(
            mQ=mQ, mdO=mdO, sQ_stages=sQ_stages, sdO_stages=sdO_stages, mLSE=mLSE,
            mDpsum=mDpsum, sRows=sRows,
            gmem_copy_async=gmem_copy_async, batch=batch, head_kv=head_kv, group=group,
            m_block_min=m_block_min, num_m_blocks=num_m_blocks, seqlen=seqlen,
        )
        # Deterministic: a step's turn passes at the next step's first barrier (the last
        # step's at the epilogue's); with one stage, at the step's closing barrier.
        late_release = self.deterministic and self.num_stages > 1
        turn_args = dict(
            mSemaphore=mSemaphore, block_info=block_info, seqlen=seqlen, batch=batch,
            head_kv=head_kv, group=group, m_block_min=m_block_min, num_m_blocks=num_m_blocks,
            n_block=n_block, tidx=tidx,
        )
        if cutlass.const_expr(self.num_stages > 1):
            if num_steps > 0:
                self.load_query_tile(Int32(0), Int32(0), **query_tiles)
            cute.arch.cp_async_commit_group()
        for step in cutlass.range(num_steps, unroll=1):
            head = head_kv * group + step // num_m_blocks
            m_block = m_block_min + step % num_m_blocks
            stage = step % self.num_stages

            # 1. Q and dO of this query tile; with two stages, start the next tile's.
            if cutlass.const_expr(self.num_stages == 1):
                # The previous step's readers of the buffer passed its closing barrier.
                self.load_query_tile(step, stage, **query_tiles)
                cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            if cutlass.const_expr(late_release):
                # The previous step's dq additions are complete: they drained under its dK
                # GEMM, where waiting for them at once would hold the CTA (and the key tiles
                # queued behind it at that query tile) for their round trip to L2.
                cute.arch.fence_acq_rel_gpu()
            cute.arch.barrier()
            if cutlass.const_expr(late_release):
                if step > 0:
                    self.pass_turn_of_step(step - 1, **turn_args)
            if cutlass.const_expr(self.num_stages > 1):
                # The other buffer's readers (the previous step) passed the barrier above.
                if step + 1 < num_steps:
                    self.load_query_tile(step + 1, 1 - stage, **query_tiles)
                cute.arch.cp_async_commit_group()
            q_stage = _at_stage(q_operand, stage)
            do_stage = _at_stage(do_operand, stage)
            dot_stage = _at_stage(dot_operand, stage)
            qt_stage = _at_stage(qt_operand, stage)

            # Per-row lse and dpsum, loaded with Q and dO (no global round trip here).
            row_lse = cute.make_rmem_tensor(num_rows, Float32)
            row_dpsum = cute.make_rmem_tensor(num_rows, Float32)
            for r in cutlass.range_constexpr(num_rows):
                row_lse[r] = sRows[score_coords[r, 0][0], 0, stage]
                row_dpsum[r] = sRows[score_coords[r, 0][0], 1, stage]

            # 2. S = Q K^T, dP = dO V^T
            acc_S = cute.make_rmem_tensor(thr_sdp.partition_shape_C(tile_mn), Float32)
            acc_dP = cute.make_rmem_tensor(thr_sdp.partition_shape_C(tile_mn), Float32)
            acc_S.fill(0.0)
            acc_dP.fill(0.0)
            gemm(tiled_mma_sdp, acc_S, tSrQ, tSrK, k_operand, a_from_smem=q_stage)
            gemm(tiled_mma_sdp, acc_dP, tdPrdO, tdPrV, v_operand, a_from_smem=do_stage)

            # 3. P from the forward's lse; dS = P (dP - rowsum(dO O))
            capping.apply_softcap(acc_S, tanh_scale, self.softcap)
            # Only tiles that hide a key from some row (the last key tile, the diagonal's).
            if block_info.needs_mask(seqlen, m_block, n_block):
                mask = AttentionMask(
                    tile_m=self.tile_m, tile_n=self.tile_n, seqlen=seqlen, window=self.window
                )
                mask.apply(
                    acc_S, thr_sdp, m_block, n_block, mask_seqlen=True,
                    mask_causal=self.causal or self.window is not None,
                )
            scores = acc_as_rows_cols(acc_S)
            dscores = acc_as_rows_cols(acc_dP)
            for r in cutlass.range_constexpr(num_rows):
                lse_log2 = row_lse[r]
                dpsum = row_dpsum[r]
                for c in cutlass.range_constexpr(cute.size(scores, mode=[1])):
                    score = scores[r, c]
                    prob = cute.math.exp2(score * scale_log2 - lse_log2, fastmath=True)
                    scores[r, c] = prob
                    dscores[r, c] = capping.chain_score_grad(
                        prob * (dscores[r, c] - dpsum), score, self.softcap
                    )

            # 4. P and dS to shared memory
            rP = cute.make_fragment_like(acc_S, self.dtype)
            rdS = cute.make_fragment_like(acc_dP, self.dtype)
            convert_packed(acc_S, rP)
            convert_packed(acc_dP, rdS)
            cute.copy(store_pds, store_pds.retile(rP), store_pds.partition_D(sP))
            cute.copy(store_pds, store_pds.retile(rdS), store_pds.partition_D(sdS))
            cute.arch.barrier()

            # 5. dV += P^T dO
            gemm(tiled_mma_dkv, acc_dV, tdVrPt, tdVrdOt, dot_stage, a_from_smem=pt_operand)
            # 6. dQ = dS K, added from the registers before 7. dK += dS^T Q, so that the
            # atomics drain while dK's MMAs run.
            acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C(tile_q), Float32)
            acc_dQ.fill(0.0)
            gemm(tiled_mma_dq, acc_dQ, tdQrdS, tdQrKt, kt_operand, a_from_smem=ds_operand)
            self.add_dq(
                acc_dQ, mdQaccum, mSemaphore, seqlen, batch, head, m_block,
                turns.turn_of(block_info, seqlen, m_block, n_block), tidx,
            )
            gemm(tiled_mma_dkv, acc_dK, tdKrdSt, tdKrQt, qt_stage, a_from_smem=dst_operand)
            if cutlass.const_expr(self.num_stages == 1):
                # Every warp is done with this step's Q, dO, P and dS before the next load;
                # deterministic, the turn passes here (the next step's first barrier would
                # wait for its Q and dO loads too).
                if cutlass.const_expr(self.deterministic):
                    cute.arch.fence_acq_rel_gpu()
                cute.arch.barrier()
                if cutlass.const_expr(self.deterministic):
                    self.pass_turn_of_step(step, **turn_args)

        # ---- Epilogue: dK, dV through K's and V's buffers ---------------------------------------
        # K and V landed even where no query tile was visited (their buffers are reused).
        cute.arch.cp_async_wait_group(0)
        if cutlass.const_expr(late_release):
            cute.arch.fence_acq_rel_gpu()
        cute.arch.barrier()
        if cutlass.const_expr(late_release):
            if num_steps > 0:
                self.pass_turn_of_step(num_steps - 1, **turn_args)
        for i in cutlass.range_constexpr(cute.size(acc_dK)):
            acc_dK[i] = acc_dK[i] * softmax_scale
        for acc, smem, mgrad, tile in ((acc_dK, sK, mdK, tile_kv), (acc_dV, sV, mdV, tile_v)):
            store_o(
                acc,
                smem,
                cute.local_tile(
                    seqlen.rows(mgrad, batch, head_kv, keys=True, packed=self.varlen),
                    tile, (n_block, 0),
                ),
                kv_rows_left,
                tiled_mma=tiled_mma_dkv,
                gmem_tiled_copy=gmem_copy_store,
                tidx=tidx,
                sync=cute.arch.barrier,
                columns=self.input_dim,
            )

    @cute.jit
    def load_query_tile(
        self, step: Int32, stage: Int32, *, mQ, mdO, sQ_stages, sdO_stages, mLSE, mDpsum,
        sRows, gmem_copy_async, batch, head_kv, group, m_block_min, num_m_blocks, seqlen,
    ):
        """cp.async Q and dO of step ``step``'s (query head, m_block) into buffer ``stage``,
        and the tile's lse and dpsum (16 bytes per thread of the first tile_m / 2 threads; the
        per-row buffers are padded to whole query tiles)."""
        head = head_kv * group + step // num_m_blocks
        m_block = m_block_min + step % num_m_blocks
        thr_copy = gmem_copy_async.get_slice(cute.arch.thread_idx()[0])
        rows_left = seqlen.seqlen_q - m_block * self.tile_m
        for mX, sX, columns in (
            (mQ, sQ_stages, self.head_dim), (mdO, sdO_stages, self.head_dim_v)
        ):
            tile = (self.tile_m, columns)
            gX = cute.local_tile(
                seqlen.rows(mX, batch, head, keys=False, packed=self.varlen), tile, (m_block, 0)
            )
            self.load_rows(
                gmem_copy_async, thr_copy.partition_S(gX),
                thr_copy.partition_D(sX[None, None, stage]), cute.make_identity_tensor(tile),
                rows_left,
            )
        vectors_per_row = self.tile_m // 4
        tidx = cute.arch.thread_idx()[0]
        if tidx < 2 * vectors_per_row:
            which, vector = tidx // vectors_per_row, tidx % vectors_per_row
            copy_16b = cute.make_copy_atom(
                cpasync.CopyG2SOp(), Float32, num_bits_per_copy=128
            )
            for index, mX in ((0, mLSE), (1, mDpsum)):
                if which == index:
                    rows = seqlen.buffer_rows(
                        mX, batch, head, packed=self.varlen, rows_tile=self.tile_m
                    )
                    src = cute.local_tile(rows, (4,), (m_block * vectors_per_row + vector,))
                    dst = cute.local_tile(sRows[None, index, stage], (4,), (vector,))
                    cute.copy(copy_16b, src, dst)

    @cute.jit
    def add_dq(
        self, acc_dQ, mdQaccum, mSemaphore, seqlen, batch, head, m_block, turn, tidx,
    ):
        """This step's dQ accumulator into dq_accum's query tile with fp32 atomics
        (red.global.add), in fragment order (value i of thread t at i * threads + t), at this
        key tile's ``turn`` at the query tile when deterministic (passed on by the caller:
        ``pass_turn_of_step``)."""
        gdQ = cute.local_tile(
            seqlen.buffer_rows(
                mdQaccum[None, None, 0, None, None], batch, head, packed=self.varlen,
                rows_tile=self.tile_m,
            ),
            (self.tile_m, self.head_dim), (m_block, 0),
        )
        if cutlass.const_expr(self.deterministic):
            self.wait_for_turn(mSemaphore[batch, head, None].iterator + m_block, turn, tidx)
        for i in cutlass.range_constexpr(cute.size(acc_dQ)):
            cute.arch.atomic_add(gdQ.iterator + (i * self.num_threads + tidx), acc_dQ[i])

    @cute.jit
    def wait_for_turn(self, counter: cute.Pointer, turn: Int32, tidx: Int32):
        """Block until ``counter`` reaches ``turn`` (one thread polls; the CTA then proceeds)."""
        if tidx == 0:
            turns.wait_for_turn(counter, turn)
        cute.arch.barrier()

    @cute.jit
    def pass_turn_of_step(
        self, step: Int32, mSemaphore, block_info, seqlen, batch, head_kv, group, m_block_min,
        num_m_blocks, n_block, tidx: Int32,
    ):
        """Hand ``step``'s query tile to the next key tile (thread 0). The caller made every
        thread's additions there complete and visible first: each thread's
        ``fence.acq_rel.gpu``, then a CTA barrier."""
        head = head_kv * group + step // num_m_blocks
        m_block = m_block_min + step % num_m_blocks
        if tidx == 0:
            turns.pass_turn(
                mSemaphore[batch, head, None].iterator + m_block,
                turns.turn_of(block_info, seqlen, m_block, n_block),
            )

    @cute.jit
    def load_rows(
        self,
        tiled_copy: cute.TiledCopy,
        src: cute.Tensor,
        dst: cute.Tensor,
        coords: cute.Tensor,
        rows_left: Int32,
    ):
        """cp.async the rows of a tile below ``rows_left`` (a padded head dim: their input
        columns); zero the others (they feed MMAs whose results must stay finite). ``coords``:
        the tile's identity tensor."""
        thr_copy = tiled_copy.get_slice(cute.arch.thread_idx()[0])
        thread_coords = thr_copy.partition_S(coords)
        # Thread 0's rows are compile-time constants: compare them with one per-thread bound.
        coords_t0 = tiled_copy.get_slice(0).partition_S(coords)
        thread_rows_left = rows_left - thread_coords[0][0]
        for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            if coords_t0[0, m, 0][0] < thread_rows_left:
                copy_row(
                    tiled_copy, src[None, m, None], dst[None, m, None],
                    thread_coords[None, m, None], self.input_dim,
                )
            else:
                dst[None, m, None].fill(0)
