"""Varlen backward postprocess, shared by every family: dq = softmax_scale * the fp32
accumulator, cast to dq's dtype, from each sequence's rows of the per-row buffers into its
packed rows.

The main kernel adds dQ into dq_accum (1, heads_q, chunks, rows, chunk_dim + row_pad), where
sequence b's rows start on a whole query tile (``padded_rows_start``), so the packed dq cannot
be one strided view of it. One pass here reads each accumulator row once and writes dq's row
(the PyTorch form it replaces gathered an fp32 copy first, then scaled it: three times the
traffic). Packed rows past cu_seqlens_q[-1] belong to no sequence: they get zeros.

One CTA of 128 threads covers 64 rows of one (sequence, head): head_dim / 8 threads per row,
each scaling 8 contiguous columns (two 16-byte loads, one 16-byte store). The extra grid slice
z = num_seqs zeroes the packed rows past the last sequence, striding over them.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cuteattn.kernels.common.seqlen_info import SeqlenInfo

THREADS = 128
COLUMNS_PER_THREAD = 8
ROWS_PER_CTA = 64


class VarlenDqPostprocess:
    """``head_dim``: dq's; ``kernel_dim``: the main kernel's (>= head_dim, its padded columns
    dropped); ``chunks``: dq_accum's column chunks (``KernelFamily.dq_accum_chunks``);
    ``rows_tile``: the main kernel's tile_m (the per-row buffers' sequence alignment)."""

    def __init__(
        self, *, dtype: type[cutlass.Numeric], head_dim: int, kernel_dim: int, chunks: int,
        rows_tile: int,
    ):
        chunk_dim = kernel_dim // chunks
        if head_dim % COLUMNS_PER_THREAD or chunk_dim % COLUMNS_PER_THREAD:
            raise ValueError(
                f"head_dim ({head_dim}) and the accumulator's chunk ({chunk_dim} columns) must be "
                f"multiples of {COLUMNS_PER_THREAD}"
            )
        if kernel_dim < head_dim or kernel_dim % chunks:
            raise ValueError(
                f"kernel_dim {kernel_dim} cannot hold head_dim {head_dim} in {chunks} chunks"
            )
        self.dtype = dtype
        self.head_dim = head_dim
        self.chunk_dim = chunk_dim
        self.rows_tile = rows_tile
        # Threads per row: one per 8 of dq's columns, rounded up to a power of two that divides
        # the CTA (the threads past dq's columns idle), at least two: a pass then covers at
        # most the CTA's 64 rows (head_dim 8 would otherwise get no pass at all).
        threads_per_row = THREADS // ROWS_PER_CTA
        while threads_per_row * COLUMNS_PER_THREAD < head_dim:
            threads_per_row *= 2
        self.threads_per_row = threads_per_row

    @cute.jit
    def __call__(
        self,
        mdQaccum: cute.Tensor,  # (1, heads_q, chunks, rows, chunk_dim + row_pad) fp32
        mdQ: cute.Tensor,  # (1, total_q, heads_q, head_dim)
        mCuSeqlensQ: cute.Tensor,  # (num_seqs + 1,) int32
        max_seqlen_q: Int32,
        softmax_scale: Float32,
        stream,
    ):
        num_seqs = mCuSeqlensQ.shape[0] - 1
        # z = num_seqs: the rows past the last sequence.
        grid = (cute.ceil_div(max_seqlen_q, ROWS_PER_CTA), mdQ.shape[2], num_seqs + 1)
        self.kernel(mdQaccum, mdQ, mCuSeqlensQ, softmax_scale).launch(
            grid=grid, block=[THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mdQaccum: cute.Tensor,
        mdQ: cute.Tensor,
        mCuSeqlensQ: cute.Tensor,
        softmax_scale: Float32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        row_block, head, batch = cute.arch.block_idx()
        grid_rows, _, _ = cute.arch.grid_dim()
        num_seqs = mCuSeqlensQ.shape[0] - 1
        lane_in_row = tidx % self.threads_per_row
        row_in_pass = tidx // self.threads_per_row
        rows_per_pass = THREADS // self.threads_per_row
        column = lane_in_row * COLUMNS_PER_THREAD
        chunk = column // self.chunk_dim
        chunk_slice = (column % self.chunk_dim) // COLUMNS_PER_THREAD
        if batch < num_seqs:
            seqlen = SeqlenInfo.varlen(
                mCuSeqlensQ, mCuSeqlensQ, None, batch, rows_tile=self.rows_tile
            )
            accum = seqlen.buffer_rows(
                mdQaccum[None, None, chunk, None, None], batch, head, packed=True,
                rows_tile=self.rows_tile,
            )
            dq_rows = seqlen.rows(mdQ, batch, head, keys=False, packed=True)
            for p in cutlass.range_constexpr(ROWS_PER_CTA // rows_per_pass):
                row = row_block * ROWS_PER_CTA + p * rows_per_pass + row_in_pass
                if row < seqlen.seqlen_q and column < self.head_dim:
                    src = cute.local_tile(
                        accum[row, None], (COLUMNS_PER_THREAD,), (chunk_slice,)
                    )
                    dst = cute.local_tile(
                        dq_rows[row, None], (COLUMNS_PER_THREAD,), (lane_in_row,)
                    )
                    dst.store((src.load() * softmax_scale).to(self.dtype))
        else:
            # Packed rows no sequence owns: zeros, so dq never holds uninitialised memory.
            first = mCuSeqlensQ[num_seqs] + row_block * rows_per_pass + row_in_pass
            stride = grid_rows * rows_per_pass
            zeros = cute.make_rmem_tensor(COLUMNS_PER_THREAD, self.dtype)
            zeros.fill(0.0)
            if column < self.head_dim:
                for row in cutlass.range(first, mdQ.shape[1], stride):
                    dst = cute.local_tile(
                        mdQ[0, row, head, None], (COLUMNS_PER_THREAD,), (lane_in_row,)
                    )
                    dst.store(zeros.load())


def postprocess_fake_args(
    dtype: type[cutlass.Numeric], head_dim: int, kernel_dim: int, chunks: int, row_pad: int
) -> tuple:
    """(dq_accum, dq, cu_seqlens_q, max_seqlen_q, softmax_scale): fake tensors with symbolic
    sizes and strides (dq_accum's rows 16-byte aligned, as ``cuteattn.ops.new_dq_accum`` makes
    them)."""
    from cutlass.cute.runtime import make_fake_tensor

    heads_q, rows, total_q = (cute.sym_int() for _ in range(3))
    elems_16b = 128 // dtype.width
    accum_row = kernel_dim // chunks + row_pad
    dq_accum = make_fake_tensor(
        Float32, (1, heads_q, chunks, rows, accum_row),
        (cute.sym_int64(divisibility=4), cute.sym_int64(divisibility=4),
         cute.sym_int64(divisibility=4), accum_row, 1),
        assumed_align=16,
    )
    dq = make_fake_tensor(
        dtype, (1, total_q, heads_q, head_dim),
        tuple(cute.sym_int64(divisibility=elems_16b) for _ in range(3)) + (1,),
        assumed_align=16,
    )
    cu_seqlens_q = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4)
    return dq_accum, dq, cu_seqlens_q, Int32(0), Float32(1.0)
