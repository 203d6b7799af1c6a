"""Backward postprocess, shared by every family: dq = softmax_scale * the fp32 accumulator,
cast to dq's dtype, in one pass.

The main kernel adds dQ into dq_accum (batch, heads_q, chunks, rows, chunk_dim + row_pad): column
chunks one after the other, rows padded to whole query tiles. Fixed-length batches read each
(batch, head)'s first seqlen_q rows. Packed (varlen) batches (dq_accum's batch 1, dq (1, total_q,
heads_q, dim)): sequence b's rows start on a whole query tile there (``padded_rows_start``), and
the packed rows past cu_seqlens_q[-1] belong to no sequence: they get zeros; so do dk's and dv's
rows past cu_seqlens_k[-1] when they are given (the main kernel writes all the others unless
seqused_k leaves some out).

One CTA of 128 threads covers 64 rows of one (batch or sequence, head): threads per row one per 8
of dq's columns (rounded up to a power of two), each scaling 8 contiguous columns (two 16-byte
loads, one 16-byte store). Varlen: the extra grid slice z = num_seqs zeroes the packed rows past
the last sequence, striding over them. Dq may have any 16-byte multiple strides (the caller's
buffer).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.smem_tiles import smem_tile_atom

THREADS = 128
COLUMNS_PER_THREAD = 8
ROWS_PER_CTA = 64


class DqPostprocess:
    """``head_dim``: dq's; ``kernel_dim``: the main kernel's (>= head_dim, its padded columns
    dropped); ``chunks``: dq_accum's column chunks (``KernelFamily.dq_accum_chunks``);
    ``rows_tile``: varlen: the main kernel's tile_m (the per-row buffers' sequence alignment),
    0: a fixed-length batch."""

    threads = THREADS
    rows_per_cta = ROWS_PER_CTA

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
        self.kernel_dim = kernel_dim
        self.chunk_dim = chunk_dim
        self.rows_tile = rows_tile
        # Threads per row: one per 8 of dq's columns, rounded up to a power of two that divides
        # the CTA (the threads past dq's columns idle), at least threads / rows: a pass then
        # covers at most the CTA's rows (head_dim 8 would otherwise get no pass at all).
        threads_per_row = 1
        while (
            threads_per_row * self.rows_per_cta < self.threads
            or threads_per_row * COLUMNS_PER_THREAD < head_dim
        ):
            threads_per_row *= 2
        self.threads_per_row = threads_per_row

    @cute.jit
    def __call__(
        self,
        mdQaccum: cute.Tensor,  # (batch, heads_q, chunks, rows, chunk_dim + row_pad) fp32
        mdQ: cute.Tensor,  # (batch, seqlen_q, heads_q, head_dim); varlen: (1, total_q, ...)
        mCuSeqlensQ: cute.Tensor | None,  # varlen: (num_seqs + 1,) int32, else None
        max_seqlen_q: Int32,  # varlen: the longest sequence, else unused
        softmax_scale: Float32,
        mdK: cute.Tensor | None,  # varlen, optional: (1, total_k, heads_kv, head_dim)
        mdV: cute.Tensor | None,  # with mdK: (1, total_k, heads_kv, dim_v)
        mCuSeqlensK: cute.Tensor | None,  # with mdK: (num_seqs + 1,) int32
        stream,
    ):
        if cutlass.const_expr(self.rows_tile > 0):
            # z = num_seqs: the rows past the last sequence.
            num_seqs = mCuSeqlensQ.shape[0] - 1
            grid = (
                cute.ceil_div(max_seqlen_q, self.rows_per_cta), mdQ.shape[2], num_seqs + 1
            )
        else:
            grid = (cute.ceil_div(mdQ.shape[1], self.rows_per_cta), mdQ.shape[2], mdQ.shape[0])
        self.kernel(mdQaccum, mdQ, mCuSeqlensQ, softmax_scale, mdK, mdV, mCuSeqlensK).launch(
            grid=grid, block=[self.threads, 1, 1], smem=self.smem_bytes(), stream=stream
        )

    # Subclasses that stage dq's rows in shared memory (``smem_tile``) set this.
    stages_rows_in_smem = False

    def smem_bytes(self) -> int:
        """The dynamic shared memory of a CTA: ``smem_tile``'s tile (128-byte aligned) where
        the subclass stages rows there, else none."""
        if not self.stages_rows_in_smem:
            return 0
        return self.rows_per_cta * self.kernel_dim * self.dtype.width // 8 + 128

    def smem_tile(self, swizzled_pointer: bool = False) -> tuple:
        """(tile, atom): a (rows_per_cta, kernel_dim) tile of dq's dtype in shared memory,
        swizzled for 16-byte row copies (``smem_tile_atom``), for the subclasses that stage dq
        there (``smem_bytes`` must cover it). ``swizzled_pointer``: the swizzle carried by the
        pointer and a plain layout (views such as a transposed one compose only with that)."""
        atom = smem_tile_atom(self.dtype, self.kernel_dim)
        layout = cute.tile_to_shape(atom, (self.rows_per_cta, self.kernel_dim), (0, 1))

        @cute.struct
        class SharedStorage:
            tile: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(layout)], 128]

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        if swizzled_pointer:
            return storage.tile.get_tensor(layout.outer, swizzle=layout.inner), atom
        return storage.tile.get_tensor(layout), atom

    @cute.kernel
    def kernel(
        self,
        mdQaccum: cute.Tensor,
        mdQ: cute.Tensor,
        mCuSeqlensQ: cute.Tensor | None,
        softmax_scale: Float32,
        mdK: cute.Tensor | None,
        mdV: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        row_block, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.rows_tile > 0):
            num_seqs = mCuSeqlensQ.shape[0] - 1
            if batch < num_seqs:
                seqlen = SeqlenInfo.varlen(
                    mCuSeqlensQ, mCuSeqlensQ, None, batch, rows_tile=self.rows_tile
                )
                # The grid covers the longest sequence; past this one's rows a tile reads
                # nothing (the whole-tile readers, past the last sequence, would read past the
                # accumulator).
                if row_block * self.rows_per_cta < seqlen.seqlen_q:
                    self.scale_rows(
                        mdQaccum, mdQ, seqlen, row_block, head, batch, softmax_scale, tidx
                    )
            else:
                self.zero_packed_tail(mdQ, mCuSeqlensQ[num_seqs], row_block, head, tidx)
                if cutlass.const_expr(mdK is not None):
                    # The main kernel writes every key row of every sequence (zeros where no
                    # query sees it) but none past the last sequence.
                    if head < mdK.shape[2]:
                        first_key = mCuSeqlensK[num_seqs]
                        self.zero_packed_tail(mdK, first_key, row_block, head, tidx)
                        self.zero_packed_tail(mdV, first_key, row_block, head, tidx)
        else:
            seqlen = SeqlenInfo.fixed(mdQ, mdQ)
            self.scale_rows(mdQaccum, mdQ, seqlen, row_block, head, batch, softmax_scale, tidx)

    def thread_columns(self, tidx):
        """(lane in its row, row within a pass, rows per pass): this thread's 8 columns of a
        row are lane * 8 ..."""
        return (
            tidx % self.threads_per_row, tidx // self.threads_per_row,
            self.threads // self.threads_per_row,
        )

    @cute.jit
    def scale_rows(
        self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, seqlen: SeqlenInfo, row_block: Int32,
        head: Int32, batch: Int32, softmax_scale: Float32, tidx: Int32,
    ):
        """dq's rows row_block * rows_per_cta ... of (batch, head) from the accumulator, scaled
        and cast."""
        lane_in_row, row_in_pass, rows_per_pass = self.thread_columns(tidx)
        column = lane_in_row * COLUMNS_PER_THREAD
        chunk = column // self.chunk_dim
        chunk_slice = (column % self.chunk_dim) // COLUMNS_PER_THREAD
        packed = self.rows_tile > 0
        accum = seqlen.buffer_rows(
            mdQaccum[None, None, chunk, None, None], batch, head, packed=packed,
            rows_tile=self.rows_tile,
        )
        dq_rows = seqlen.rows(mdQ, batch, head, keys=False, packed=packed)
        for p in cutlass.range_constexpr(self.rows_per_cta // rows_per_pass):
            row = row_block * self.rows_per_cta + p * rows_per_pass + row_in_pass
            if row < seqlen.seqlen_q and column < self.head_dim:
                src = cute.local_tile(accum[row, None], (COLUMNS_PER_THREAD,), (chunk_slice,))
                dst = cute.local_tile(dq_rows[row, None], (COLUMNS_PER_THREAD,), (lane_in_row,))
                dst.store((src.load() * softmax_scale).to(self.dtype))

    @cute.jit
    def zero_packed_tail(
        self, mX: cute.Tensor, first_row: Int32, row_block: Int32, head: Int32, tidx: Int32
    ):
        """Packed rows no sequence owns (first_row = the cumulative lengths' last on) of
        ``head`` in mX (1, total, heads, dim): zeros, so a gradient never holds uninitialised
        memory; the CTAs of this grid slice stride over them."""
        lane_in_row, row_in_pass, rows_per_pass = self.thread_columns(tidx)
        grid_rows, _, _ = cute.arch.grid_dim()
        zeros = cute.make_rmem_tensor(COLUMNS_PER_THREAD, self.dtype)
        zeros.fill(0.0)
        row_columns = self.threads_per_row * COLUMNS_PER_THREAD
        dim = cute.size(mX, mode=[3])
        first = first_row + row_block * rows_per_pass + row_in_pass
        for row in cutlass.range(first, mX.shape[1], grid_rows * rows_per_pass):
            for part in cutlass.range_constexpr(-(-dim // row_columns)):
                if part * row_columns + lane_in_row * COLUMNS_PER_THREAD < dim:
                    dst = cute.local_tile(
                        mX[0, row, head, None], (COLUMNS_PER_THREAD,),
                        (part * self.threads_per_row + lane_in_row,),
                    )
                    dst.store(zeros.load())


def postprocess_fake_args(
    dtype: type[cutlass.Numeric], head_dim: int, kernel_dim: int, chunks: int, row_pad: int,
    varlen: bool = False, zero_kv_dims: tuple[int, int] | None = None,
) -> tuple:
    """(dq_accum, dq, cu_seqlens_q, max_seqlen_q, softmax_scale, dk, dv, cu_seqlens_k): fake
    tensors with symbolic sizes and strides (dq_accum's rows 16-byte aligned, as
    ``cuteattn.ops.new_dq_accum`` makes them); the cumulative lengths None unless ``varlen``;
    dk, dv and cu_seqlens_k None unless ``zero_kv_dims`` (their (head_dim, dim_v))."""
    from cutlass.cute.runtime import make_fake_tensor

    batch, heads_q, rows, seqlen_q = (cute.sym_int() for _ in range(4))
    elems_16b = 128 // dtype.width
    accum_row = kernel_dim // chunks + row_pad
    dq_accum = make_fake_tensor(
        Float32, (batch, heads_q, chunks, rows, accum_row),
        (cute.sym_int64(divisibility=4), cute.sym_int64(divisibility=4),
         cute.sym_int64(divisibility=4), accum_row, 1),
        assumed_align=16,
    )
    dq = make_fake_tensor(
        dtype, (batch, seqlen_q, heads_q, head_dim),
        tuple(cute.sym_int64(divisibility=elems_16b) for _ in range(3)) + (1,),
        assumed_align=16,
    )
    def packed(dim, total, heads):
        strides = tuple(cute.sym_int64(divisibility=elems_16b) for _ in range(3)) + (1,)
        return make_fake_tensor(dtype, (1, total, heads, dim), strides, assumed_align=16)

    def cumulative():
        return make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4)

    cu_seqlens_q = cumulative() if varlen else None
    kv = (None, None, None)
    if zero_kv_dims is not None:
        total_k, heads_kv = cute.sym_int(), cute.sym_int()
        kv = (
            packed(zero_kv_dims[0], total_k, heads_kv), packed(zero_kv_dims[1], total_k, heads_kv),
            cumulative(),
        )
    return (dq_accum, dq, cu_seqlens_q, Int32(0), Float32(1.0), *kv)
