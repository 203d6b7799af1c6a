"""Backward preprocess, shared by every family: per query row, dpsum = rowsum(dout * out) in
fp32 and the forward's lse in log2 units, both padded to whole query tiles.

The backward recomputes P = exp2(S * scale_log2 - lse_log2) and needs dS = P (dP - dpsum). Rows
whose forward saw no key (lse = -inf) get lse_log2 = +inf, so their P is 0, not inf; padding rows
(past seqlen_q, up to the padded length) get dpsum 0 and lse_log2 +inf, so the main kernel
reads whole query tiles without bounds checks.

One CTA of 128 threads covers 64 rows of one (batch, head): 8 threads per row, each reading a
contiguous dim / 8 slice of dout and out (vector loads), the partial dot products summed
across the 8 lanes with shuffles. Reads both tensors once (the PyTorch form it replaces made
fp32 copies of both).

Varlen (``varlen_rows_tile`` > 0, the main kernel's tile_m): out and dout are packed (1, total,
heads, dim), lse (1, heads, total); sequence b's rows go to the buffers from
``padded_rows_start`` on, padded to whole tiles of ``varlen_rows_tile`` rows.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cuteattn.kernels.common.seqlen_info import SeqlenInfo

LOG2_E = math.log2(math.e)
THREADS = 128
THREADS_PER_ROW = 8
ROWS_PER_CTA = 64


class BackwardPreprocess:
    def __init__(
        self, *, dtype: type[cutlass.Numeric], head_dim: int, varlen_rows_tile: int = 0,
        launches_dependents: bool = False,
    ):
        """launches_dependents (sm_90 and later): let a kernel launched as this one's
        dependent (programmatic dependent launch: the sm90 backward) start early."""
        if head_dim % THREADS_PER_ROW:
            raise ValueError(f"head_dim must be a multiple of {THREADS_PER_ROW}, got {head_dim}")
        self.dtype = dtype
        self.head_dim = head_dim
        self.varlen_rows_tile = varlen_rows_tile
        self.launches_dependents = launches_dependents

    @cute.jit
    def __call__(
        self,
        mO: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mdO: cute.Tensor,  # (batch, seqlen_q, heads_q, dim)
        mLSE: cute.Tensor,  # (batch, heads_q, seqlen_q) fp32, natural log
        mLSElog2: cute.Tensor,  # (batch, heads_q, rows) fp32, rows >= seqlen_q
        mDpsum: cute.Tensor,  # (batch, heads_q, rows) fp32
        mCuSeqlensQ: cute.Tensor | None,  # varlen: (batch + 1,) int32, else None
        max_seqlen_q: Int32,  # varlen: the longest sequence, else unused
        stream,
    ):
        if cutlass.const_expr(mO.element_type != mdO.element_type):
            raise TypeError("dout must have the dtype of out")
        if cutlass.const_expr(self.varlen_rows_tile > 0):
            longest = cute.ceil_div(max_seqlen_q, self.varlen_rows_tile) * self.varlen_rows_tile
            grid = (
                cute.ceil_div(longest, ROWS_PER_CTA), mDpsum.shape[1], mCuSeqlensQ.shape[0] - 1
            )
        else:
            grid = (
                cute.ceil_div(mDpsum.shape[2], ROWS_PER_CTA), mDpsum.shape[1], mDpsum.shape[0]
            )
        self.kernel(mO, mdO, mLSE, mLSElog2, mDpsum, mCuSeqlensQ).launch(
            grid=grid, block=[THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mO: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mLSElog2: cute.Tensor,
        mDpsum: cute.Tensor,
        mCuSeqlensQ: cute.Tensor | None,
    ):
        if cutlass.const_expr(self.launches_dependents):
            # The main kernel (launched as this one's dependent) may start once every CTA
            # here has started: its CTAs load K and V, then wait for this grid to complete.
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        row_block, head, batch = cute.arch.block_idx()
        seqlen_q = mO.shape[1]
        rows = mDpsum.shape[2]
        if cutlass.const_expr(self.varlen_rows_tile > 0):
            # This sequence's rows, as views at its offsets (packed tensors: batch 0).
            seqlen = SeqlenInfo.varlen(
                mCuSeqlensQ, mCuSeqlensQ, None, batch, rows_tile=self.varlen_rows_tile
            )
            seqlen_q = seqlen.seqlen_q
            rows = cute.ceil_div(seqlen_q, self.varlen_rows_tile) * self.varlen_rows_tile
            mO = cute.domain_offset((0, seqlen.offset_q, 0, 0), mO)
            mdO = cute.domain_offset((0, seqlen.offset_q, 0, 0), mdO)
            mLSE = cute.domain_offset((0, 0, seqlen.offset_q), mLSE)
            mLSElog2 = cute.domain_offset((0, 0, seqlen.offset_rows), mLSElog2)
            mDpsum = cute.domain_offset((0, 0, seqlen.offset_rows), mDpsum)
            batch = Int32(0)
        slice_elems = self.head_dim // THREADS_PER_ROW
        lane_in_row = tidx % THREADS_PER_ROW
        rows_per_pass = THREADS // THREADS_PER_ROW
        for p in cutlass.range_constexpr(ROWS_PER_CTA // rows_per_pass):
            row = row_block * ROWS_PER_CTA + p * rows_per_pass + tidx // THREADS_PER_ROW
            partial = Float32(0.0)
            if row < seqlen_q:
                o = cute.local_tile(mO[batch, row, head, None], (slice_elems,), (lane_in_row,))
                do = cute.local_tile(
                    mdO[batch, row, head, None], (slice_elems,), (lane_in_row,)
                )
                products = o.load().to(Float32) * do.load().to(Float32)
                partial = products.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            for offset in cutlass.range_constexpr(int(math.log2(THREADS_PER_ROW))):
                partial = partial + cute.arch.shuffle_sync_bfly(
                    partial, offset=THREADS_PER_ROW >> (offset + 1)
                )
            if lane_in_row == 0 and row < rows:
                lse_log2 = Float32.inf
                if row < seqlen_q:
                    lse = mLSE[batch, head, row]
                    if lse != -Float32.inf:
                        lse_log2 = lse * Float32(LOG2_E)
                mLSElog2[batch, head, row] = lse_log2
                mDpsum[batch, head, row] = partial


def preprocess_fake_args(
    dtype: type[cutlass.Numeric], head_dim: int, varlen: bool = False
) -> tuple:
    """(out, dout, lse, lse_log2, dpsum, cu_seqlens_q, max_seqlen_q): fake tensors with
    symbolic sizes and strides; the cumulative lengths None unless ``varlen``."""
    from cutlass.cute.runtime import make_fake_tensor

    batch, seqlen_q, heads_q, rows = (cute.sym_int() for _ in range(4))
    elems_16b = 128 // dtype.width

    def bshd():
        strides = tuple(cute.sym_int64(divisibility=elems_16b) for _ in range(3)) + (1,)
        return make_fake_tensor(
            dtype, (batch, seqlen_q, heads_q, head_dim), strides, assumed_align=16
        )

    def per_row(length):
        return make_fake_tensor(
            Float32, (batch, heads_q, length), (cute.sym_int64(), cute.sym_int64(), 1),
            assumed_align=4,
        )

    cu_seqlens_q = None
    if varlen:
        cu_seqlens_q = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4)
    return (
        bshd(), bshd(), per_row(seqlen_q), per_row(rows), per_row(rows), cu_seqlens_q,
        Int32(0),
    )

