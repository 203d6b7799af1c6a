"""The sm90 backward's dq postprocess: its dq_accum holds each consumer warpgroup's dQ share of
a query tile as one flat block in fragment order (``kernels/sm90/dq_fragments.py``). One CTA per
query tile, a warpgroup per block of the tile (two where the backward's warpgroups split the
tile's columns or rows, one where both add to the same block): each thread reads its values
with 16-byte loads, scales and casts them, puts them in their places of the (tile_m, dim) tile
in shared memory (the places the backward's dQ GEMM gave them), and the tile leaves as 16-byte
row stores. Everything else (grids, packed batches, the rows no sequence owns) is
``kernels/bwd_postprocess.py``'s."""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cuteattn.kernels.bwd_postprocess import DqPostprocess
from cuteattn.kernels.common.epilogue import store_rows
from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.smem_tiles import gmem_row_copies
from cuteattn.kernels.sm90.dq_fragments import (
    THREADS,
    DqSplit,
    fragment_slots,
    fragment_vectors,
)
from cuteattn.kernels.sm90.smem import row_store_threads


class FragmentDqPostprocess(DqPostprocess):
    """``tile_m``: the backward's query tile, which (with ``kernel_dim``) fixes the order."""

    stages_rows_in_smem = True

    def __init__(
        self, *, dtype: type[cutlass.Numeric], head_dim: int, kernel_dim: int, rows_tile: int,
        tile_m: int,
    ):
        self.split = DqSplit(kernel_dim, tile_m)
        self.threads = THREADS * self.split.blocks
        self.rows_per_cta = tile_m
        chunks = 2 if self.split.by_dim else 1
        super().__init__(
            dtype=dtype, head_dim=head_dim, kernel_dim=kernel_dim, chunks=chunks,
            rows_tile=rows_tile,
        )

    @cute.jit
    def scale_rows(
        self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, seqlen: SeqlenInfo, row_block: Int32,
        head: Int32, batch: Int32, softmax_scale: Float32, tidx: Int32,
    ):
        """Query tile ``row_block`` of (batch, head): its blocks' values, scaled, cast and
        stored as dq's rows (those before seqlen_q, dq's columns)."""
        split = self.split
        packed = self.rows_tile > 0
        block_idx = tidx // THREADS
        chunk = block_idx if split.by_dim else 0
        accum_rows = seqlen.buffer_rows(
            mdQaccum[None, None, chunk, None, None], batch, head, packed=packed,
            rows_tile=self.rows_tile,
        )
        row_block_of_buffer = row_block
        if cutlass.const_expr(split.by_rows):
            row_block_of_buffer = row_block * 2 + block_idx
        block = cute.local_tile(
            accum_rows, (split.buffer_rows, split.chunk_cols), (row_block_of_buffer, 0)
        )

        tiled_mma = split.tiled_mma(self.dtype)
        acc_dQ = cute.make_rmem_tensor(
            split.thread_slice(tiled_mma, tidx).partition_shape_C(split.tile()), Float32
        )
        cute.autovec_copy(
            fragment_slots(block, tidx % THREADS, cute.size(acc_dQ)), fragment_vectors(acc_dQ)
        )
        rdQ = cute.make_fragment_like(acc_dQ, self.dtype)
        rdQ.store((acc_dQ.load() * softmax_scale).to(self.dtype))

        tile = (self.rows_per_cta, self.kernel_dim)
        sdQ, tile_atom = self.smem_tile(swizzled_pointer=True)
        cute.autovec_copy(rdQ, split.places(tiled_mma, sdQ, tidx))
        cute.arch.barrier()

        # Row stores by the threads whose row passes tile the tile's rows (80: 128 of 256).
        elems_per_store = 128 // self.dtype.width
        store_threads = row_store_threads(
            self.rows_per_cta, tile_atom.outer.shape[1] // elems_per_store, self.threads
        )
        if tidx < store_threads:
            dq_rows = seqlen.rows(mdQ, batch, head, keys=False, packed=packed)
            store_rows(
                sdQ,
                cute.local_tile(dq_rows, tile, (row_block, 0)),
                seqlen.seqlen_q - row_block * self.rows_per_cta,
                gmem_tiled_copy=gmem_row_copies(self.dtype, tile_atom, store_threads)[1],
                tidx=tidx,
                columns=self.head_dim if self.head_dim != self.kernel_dim else None,
            )
