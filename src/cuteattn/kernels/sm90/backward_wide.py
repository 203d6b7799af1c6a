"""Attention backward for the Hopper family at head dims 192 and 256 (sm_90a).

The narrow kernel (``backward.py``) keeps 64 keys x head_dim of dK and of dV per consumer
warpgroup in registers; at d192 / d256 that is 192 / 256 registers per thread for dK and dV
alone. This variant turns the GEMMs around (as FlashAttention-3 does for large head dims):

  - S = Q K^T and dP = dO V^T with queries along M: (tile_m queries, tile_n keys), the two
    consumer warpgroups splitting the keys; P, dS per query row (lse, dpsum per row).
  - P and dS go to shared memory (one buffer each), and dV^T += dO^T P, dK^T += Q^T dS run with
    head_dim along M, every operand in shared memory: d256 splits head_dim between the
    warpgroups (64-row blocks taken in turn: 0-63 and 128-191, 64-127 and 192-255, over all the
    tile's keys), d192 (96 is not whole 64-row WGMMA atoms) splits the keys (half each, over
    all 192 dims).
  - dQ = dS K over all the tile's keys, the warpgroups splitting its columns into chunks
    (``family.WIDE_DQ_CHUNK``: d256 two of 64 each, passes handed to warp 1's bulk reductions
    one at a time; d192 one of 96 each), so each dQ element is added to dq_accum once per
    step.

Everything else (producer, dQ writer warp, dq_accum layout, deterministic turns) is the narrow
kernel's. Tiles (``family.BACKWARD_TILES``): d256 64 x 48 (K, V, two Q and dO stages, P, dS
and the dQ buffers fill 227 KB) or 64 x 64 with one Q and dO stage, d192 64 x 96 with one
(or 64 x 64 with two).
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as hopper
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from cuteattn.kernels.common import softcap as capping
from cuteattn.kernels.common.convert import convert_packed
from cuteattn.kernels.common.fragments import acc_as_rows_cols, tile_coords
from cuteattn.kernels.common.mask import AttentionMask
from cuteattn.kernels.common.opaque import computed_here
from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.smem_tiles import transposed
from cuteattn.kernels.sm90.backward import (
    NUM_CONSUMER_WGS,
    BackwardBarrier,
    FlashBackwardSm90,
    consumer_thread,
)
from cuteattn.kernels.sm90.family import WIDE_BACKWARD_SPLIT_DIM
from cuteattn.kernels.sm90.smem import smem_layout, tma_tile
from cuteattn.kernels.sm90.warpgroup import (
    THREADS_PER_WARPGROUP,
    HeldStages,
    gemm,
    hold_base,
    operand_stage,
)

# P and dS, one buffer each (stage 0: P, stage 1: dS).
P_BUFFER, DS_BUFFER = 0, 1


class FlashBackwardSm90Wide(FlashBackwardSm90):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # dK^T / dV^T: split head_dim (d256: 128 rows per warpgroup) or the keys (d192: every
        # row, half the keys). dQ: each warpgroup its chunks, over all the keys.
        self.split_dim = WIDE_BACKWARD_SPLIT_DIM[self.head_dim]
        self.dq_passes = self.head_dim // self.dq_chunk_cols // NUM_CONSUMER_WGS

    def dq_key_operand(self, wg_dq, sKt_dq, wg_idx, dq_pass: int):
        """dQ's B operand for ``dq_pass``: that pass's chunk of K^T's columns (traced inline)."""
        sKt_chunk = cute.local_tile(
            sKt_dq, (self.dq_chunk_cols, cute.size(sKt_dq, mode=[1])),
            (self.dq_chunk(wg_idx, dq_pass), 0),
        )
        return wg_dq.make_fragment_B(wg_dq.partition_B(sKt_chunk))

    def dq_chunk(self, wg, dq_pass: int):
        return wg * self.dq_passes + dq_pass

    def k_smem_layout(self):
        """K's buffer (tile_n, head_dim), its swizzle atom one dQ chunk wide or narrower, so
        that each warpgroup's chunk of K^T (dQ's MN-major B operand) starts on an atom: d192's
        96 columns take the 64-byte swizzle (32 columns)."""
        return smem_layout(self.dtype, self.tile_n, self.head_dim, atom_cols=self.dq_chunk_cols)

    def pds_layout(self):
        """P and dS, (queries, keys), keys contiguous: dS is dQ's K-major A operand, and both
        are read as (keys, queries) MN-major B operands of dV^T and dK^T, a warpgroup's keys at
        a time where the keys are split. The swizzle atom is sized to one warpgroup's keys so
        that its share starts on an atom: 32 keys (the 64-key tiles), 64-byte swizzle; 48 (d192's
        96-key tile), 32-byte; 24 (d256's 48-key tile: not a whole 16-key 32-byte atom), no
        swizzle (8-column interleaved atoms)."""
        return smem_layout(
            self.dtype, self.tile_m, self.tile_n, 2, atom_cols=self.tile_n // NUM_CONSUMER_WGS
        )

    def make_tiled_mmas(self):
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        # S = Q K^T, dP = dO V^T: (queries, keys), the warpgroups split the keys.
        tiled_mma_sdp = hopper.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, k_major, Float32,
            atom_layout_mnk=(1, NUM_CONSUMER_WGS, 1),
            tiler_mn=(64, self.tile_n // NUM_CONSUMER_WGS),
        )
        # dV^T += dO^T P, dK^T += Q^T dS: (dim, keys), A = dO^T / Q^T and B = P^T / dS^T, both
        # MN-major views of shared memory.
        if self.split_dim:
            atom_layout, tiler = (NUM_CONSUMER_WGS, 1, 1), (64, self.tile_n)
        else:
            atom_layout, tiler = (1, NUM_CONSUMER_WGS, 1), (64, self.tile_n // NUM_CONSUMER_WGS)
        tiled_mma_dkv = hopper.make_trivial_tiled_mma(
            self.dtype, self.dtype, mn_major, mn_major, Float32,
            atom_layout_mnk=atom_layout, tiler_mn=tiler,
        )
        # dQ chunk = dS K[:, chunk]: one warpgroup, A = dS K-major, B = K^T MN-major.
        tiled_mma_dq = hopper.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, mn_major, Float32,
            atom_layout_mnk=(1, 1, 1), tiler_mn=(64, self.dq_chunk_cols),
        )
        return tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq

    @cute.jit
    def consume(
        self, dkv_out: dict, sQ, sK, sV, sdO, sPdS, sdQ, sLSE, sDpsum,
        tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, pipeline_q, pipeline_do,
        scale_log2: Float32, softmax_scale: Float32, seqlen: SeqlenInfo, n_block: Int32,
        batch: Int32, steps: dict,
    ):
        tidx, wg_idx, wg_tidx = consumer_thread()
        tanh_scale = capping.tanh_scale(softmax_scale, self.softcap)
        thr_sdp = tiled_mma_sdp.get_slice(tidx)
        thr_dkv = tiled_mma_dkv.get_slice(tidx)
        thr_dq = tiled_mma_dq.get_slice(wg_tidx)
        # Shared-memory operands are partitioned per warpgroup (WGMMA reads them as a whole).
        wg_sdp = tiled_mma_sdp.get_slice(wg_idx * THREADS_PER_WARPGROUP)
        wg_dkv = tiled_mma_dkv.get_slice(wg_idx * THREADS_PER_WARPGROUP)
        wg_dq = tiled_mma_dq.get_slice(0)
        # Both warpgroups read every key of dS (dQ), and d256's every key of P.
        pds_threads, pds_ready, pds_free = (
            self.num_consumer_threads, BackwardBarrier.DS_READY, BackwardBarrier.PDS_FREE
        )
        tile_s = (self.tile_m, self.tile_n)
        tile_kvt = (self.head_dim, self.tile_n)  # dK^T
        tile_vt = (self.head_dim_v, self.tile_n)  # dV^T (dim_v rows)
        sP, sdS = sPdS[None, None, P_BUFFER], sPdS[None, None, DS_BUFFER]

        tSrQ = wg_sdp.make_fragment_A(wg_sdp.partition_A(sQ))
        tSrK = wg_sdp.make_fragment_B(wg_sdp.partition_B(sK))
        tdPrdO = wg_sdp.make_fragment_A(wg_sdp.partition_A(sdO))
        tdPrV = wg_sdp.make_fragment_B(wg_sdp.partition_B(sV))
        tdVrdOt = wg_dkv.make_fragment_A(wg_dkv.partition_A(transposed(sdO)))
        tdVrPt = wg_dkv.make_fragment_B(wg_dkv.partition_B(transposed(sP)))
        tdKrQt = wg_dkv.make_fragment_A(wg_dkv.partition_A(transposed(sQ)))
        tdKrdSt = wg_dkv.make_fragment_B(wg_dkv.partition_B(transposed(sdS)))
        # dQ: A = dS over all the tile's keys, B = K^T (dim, keys), this warpgroup's chunk of
        # its columns per pass.
        sKt_dq = transposed(sK)
        tdQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(sdS))
        tdQsdQ = thr_dq.partition_C(sdQ[None, (None, wg_idx)])
        tdQrK_held = None
        if cutlass.const_expr(self.hold_descriptors):
            tSrQ, tdPrdO = HeldStages(tSrQ), HeldStages(tdPrdO)
            tdVrdOt, tdKrQt = HeldStages(tdVrdOt), HeldStages(tdKrQt)
            tSrK, tdPrV, tdVrPt = hold_base(tSrK), hold_base(tdPrV), hold_base(tdVrPt)
            tdKrdSt, tdQrdS = hold_base(tdKrdSt), hold_base(tdQrdS)
            tdQrK_held = [
                hold_base(self.dq_key_operand(wg_dq, sKt_dq, wg_idx, dq_pass))
                for dq_pass in range(self.dq_passes)
            ]

        acc_dKt = cute.make_rmem_tensor(thr_dkv.partition_shape_C(tile_kvt), Float32)
        acc_dVt = cute.make_rmem_tensor(thr_dkv.partition_shape_C(tile_vt), Float32)
        acc_dKt.fill(0.0)
        acc_dVt.fill(0.0)
        s_coords = tile_coords(thr_sdp, tile_s)
        num_rows = cute.size(s_coords, mode=[0])
        tPsP, tdSsdS = thr_sdp.partition_C(sP), thr_sdp.partition_C(sdS)
        # Keys past seqlen_k exist only in the last key tile (computed once: ``computed_here``).
        tile_past_seqlen_k = computed_here(
            Int32((n_block + 1) * self.tile_n > seqlen.seqlen_k)
        ) != 0

        state, state_do = self.pipeline_states(pipeline.PipelineUserType.Consumer)
        for step in cutlass.range(steps["group"] * steps["num_m_blocks"], unroll=1):
            head, m_block = self.step_tile(step, **steps)
            do_state = self.do_state(state, state_do)  # advanced with Q's, or its own

            # 1. S = Q K^T, dP = dO V^T; lse of this thread's rows read while they run.
            pipeline_q.consumer_wait(state, pipeline_q.consumer_try_wait(state))
            acc_S = cute.make_rmem_tensor(thr_sdp.partition_shape_C(tile_s), Float32)
            gemm(tiled_mma_sdp, acc_S, operand_stage(tSrQ, state.index), tSrK,
                 zero_init=True, wait_groups=-1)
            row_lse = cute.make_rmem_tensor(num_rows, Float32)
            for r in cutlass.range_constexpr(num_rows):
                row_lse[r] = sLSE[s_coords[r, 0][0], state.index]
            pipeline_do.consumer_wait(do_state, pipeline_do.consumer_try_wait(do_state))
            acc_dP = cute.make_rmem_tensor(thr_sdp.partition_shape_C(tile_s), Float32)
            gemm(tiled_mma_sdp, acc_dP, operand_stage(tdPrdO, do_state.index), tdPrV,
                 zero_init=True, wait_groups=1)

            # 2. soft-cap, mask (only tiles that hold a hidden key), P from the forward's lse
            capping.apply_softcap(acc_S, tanh_scale, self.softcap)
            needs_mask = self.tile_needs_mask(tile_past_seqlen_k, seqlen, m_block, n_block)
            if needs_mask:
                mask = AttentionMask(
                    tile_m=self.tile_m, tile_n=self.tile_n, seqlen=seqlen, window=self.window
                )
                mask.apply(acc_S, thr_sdp, m_block, n_block, mask_seqlen=True,
                           mask_causal=self.causal or self.window is not None)
            scores = acc_as_rows_cols(acc_S)
            # Soft-capped, P goes to shared memory from a tensor of its own and the scores
            # keep P (1 - t^2) for dS.
            probs = cute.make_fragment_like(acc_S) if self.softcap > 0 else acc_S
            probs_rc = acc_as_rows_cols(probs)
            for r in cutlass.range_constexpr(num_rows):
                for c in cutlass.range_constexpr(cute.size(scores, mode=[1])):
                    score = scores[r, c]
                    prob = cute.math.exp2(score * scale_log2 - row_lse[r], fastmath=True)
                    probs_rc[r, c] = prob
                    if cutlass.const_expr(self.softcap > 0):
                        scores[r, c] = capping.chain_score_grad(prob, score, self.softcap)
            rP = cute.make_fragment_like(acc_S, self.dtype)
            convert_packed(probs, rP)
            # The buffers are single: every GEMM of the last step that read them is done
            # (each thread waited for its own before this barrier).
            cute.arch.barrier(barrier_id=pds_free, number_of_threads=pds_threads)
            self.store_pds(rP, tPsP, tiled_mma_sdp, sP, tidx)

            # 3. dS = P (dP - dpsum)
            row_dpsum = cute.make_rmem_tensor(num_rows, Float32)
            for r in cutlass.range_constexpr(num_rows):
                row_dpsum[r] = sDpsum[s_coords[r, 0][0], do_state.index]
            warpgroup.wait_group(0)
            dscores = acc_as_rows_cols(acc_dP)
            for r in cutlass.range_constexpr(num_rows):
                for c in cutlass.range_constexpr(cute.size(dscores, mode=[1])):
                    dscores[r, c] = scores[r, c] * (dscores[r, c] - row_dpsum[r])
            rdS = cute.make_fragment_like(acc_dP, self.dtype)
            convert_packed(acc_dP, rdS)
            self.store_pds(rdS, tdSsdS, tiled_mma_sdp, sdS, tidx)
            # Generic-proxy writes must be visible to WGMMA (async proxy) before it reads them.
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=pds_ready, number_of_threads=pds_threads)

            # 4. dV^T += dO^T P, dK^T += Q^T dS
            gemm(tiled_mma_dkv, acc_dVt, operand_stage(tdVrdOt, do_state.index), tdVrPt,
                 zero_init=False, wait_groups=-1)
            gemm(tiled_mma_dkv, acc_dKt, operand_stage(tdKrQt, state.index), tdKrdSt,
                 zero_init=False, wait_groups=-1)

            # 5. dQ, a chunk per pass, each handed to warp 1 as it completes.
            for dq_pass in cutlass.range_constexpr(self.dq_passes):
                if cutlass.const_expr(tdQrK_held is None):
                    tdQrK = self.dq_key_operand(wg_dq, sKt_dq, wg_idx, dq_pass)
                else:
                    tdQrK = tdQrK_held[dq_pass]
                acc_dQ = cute.make_rmem_tensor(
                    thr_dq.partition_shape_C((self.tile_m, self.dq_chunk_cols)), Float32
                )
                gemm(tiled_mma_dq, acc_dQ, tdQrdS, tdQrK, zero_init=True, wait_groups=0)
                if cutlass.const_expr(dq_pass == 0):
                    # dV and dK (issued before) are done: Q and dO of this stage are free.
                    pipeline_do.consumer_release(do_state)
                    pipeline_q.consumer_release(state)
                self.hand_over_dq(acc_dQ, tdQsdQ, wg_idx)
            state.advance()
            if cutlass.const_expr(state_do is not None):
                state_do.advance()

        # ---- Epilogue: dK, dV from the transposed accumulators --------------------------------
        for i in cutlass.range_constexpr(cute.size(acc_dKt)):
            acc_dKt[i] = acc_dKt[i] * softmax_scale
        self.store_dkv_transposed(acc_dKt, acc_dVt, sK, sV, thr_dkv, dkv_out, n_block, batch,
                                  steps, seqlen)

    @cute.jit
    def store_dkv_transposed(
        self, acc_dKt, acc_dVt, sK, sV, thr_dkv, dkv_out: dict, n_block: Int32, batch: Int32,
        steps: dict, seqlen: SeqlenInfo,
    ):
        """dK^T, dV^T (accumulators, dK^T scaled) -> K's and V's buffers through their
        transposed (dim, keys) views -> global with one TMA store each (clipped to seqlen_k and
        to the inputs' columns); the first consumer warp issues them and waits until they have
        read shared memory. A CTA's dK / dV leave in two bulk copies instead of a 2-byte
        global store per element and thread (a tenth of a short row's time at 1k)."""
        tidx = cute.arch.thread_idx()[0] - THREADS_PER_WARPGROUP
        # Every consumer is past its last GEMM that reads K or V (the producer loaded them once).
        self.epilogue_sync()
        for acc, smem in ((acc_dKt, sK), (acc_dVt, sV)):
            values = cute.make_fragment_like(acc, self.dtype)
            values.store(acc.load().to(self.dtype))
            cute.autovec_copy(values, thr_dkv.partition_C(transposed(smem)))
        # Generic-proxy writes must be visible to the TMA (async proxy) before it reads them.
        cute.arch.fence_view_async_shared()
        self.epilogue_sync()
        if tidx < cute.arch.WARP_SIZE:
            for atom, smem, tensor, columns in (
                (dkv_out["tma_atom_dk"], sK, dkv_out["tdK"], self.head_dim),
                (dkv_out["tma_atom_dv"], sV, dkv_out["tdV"], self.head_dim_v),
            ):
                rows = self.tma_rows(tensor, steps["head_kv"], batch, seqlen, keys=True)
                t_smem, t_gmem = tma_tile(atom, smem, rows, (self.tile_n, columns), (n_block, 0))
                cute.copy(atom, t_smem, t_gmem)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def store_pds(self, values, dst_partition, tiled_mma_sdp, buffer, tidx: Int32):
        """P or dS (bf16, the S accumulator's layout) to its buffer: stmatrix where a
        warpgroup's keys are whole pairs of 8x8 matrices (32, 48), else 32-bit stores of
        the accumulator's column pairs (d256: 24 keys)."""
        if cutlass.const_expr((self.tile_n // NUM_CONSUMER_WGS) % 16 == 0):
            stmatrix = cute.make_copy_atom(
                cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
            )
            store = cute.make_tiled_copy_C(stmatrix, tiled_mma_sdp).get_slice(tidx)
            cute.copy(stmatrix, store.retile(values), store.partition_D(buffer))
        else:
            cute.autovec_copy(values, dst_partition)
