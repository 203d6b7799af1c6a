"""The sm80 backward's dq postprocess: its dq_accum holds each query tile in the fragment order
of the backward's dQ MMA (``kernels/sm80/backward.py``, step 6: thread t's i-th accumulator
value at i * threads + t, so that every warp's atomics cover 128 contiguous bytes). One CTA of
the backward's thread count per query tile reads its values back into the same fragments
(coalesced loads again), scales them, and stores dq through shared memory with 16-byte row
stores: FlashAttention-2's convert_dQ. Everything else (grids, packed batches, the rows no
sequence owns) is ``kernels/bwd_postprocess.py``'s."""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cuteattn.kernels.bwd_postprocess import DqPostprocess
from cuteattn.kernels.common.epilogue import store_o
from cuteattn.kernels.common.seqlen_info import SeqlenInfo
from cuteattn.kernels.common.smem_tiles import gmem_row_copies
from cuteattn.kernels.sm80.fragments import warp_grid_mma


class FragmentDqPostprocess(DqPostprocess):
    """``tile_m``, ``threads`` and ``warps_dq`` (warps along the query rows, along dim): the
    backward's query tile, thread count and dQ warp grid, which fix the fragment order."""

    stages_rows_in_smem = True

    def __init__(
        self, *, dtype: type[cutlass.Numeric], head_dim: int, kernel_dim: int, rows_tile: int,
        tile_m: int, threads: int, warps_dq: tuple[int, int],
    ):
        self.threads = threads
        self.rows_per_cta = tile_m
        super().__init__(
            dtype=dtype, head_dim=head_dim, kernel_dim=kernel_dim, chunks=1, rows_tile=rows_tile
        )
        self.warps_dq = warps_dq

    @cute.jit
    def scale_rows(
        self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, seqlen: SeqlenInfo, row_block: Int32,
        head: Int32, batch: Int32, softmax_scale: Float32, tidx: Int32,
    ):
        """Query tile ``row_block`` of (batch, head): its fragments from the accumulator,
        scaled, cast and stored as dq's rows (those before seqlen_q, dq's columns)."""
        packed = self.rows_tile > 0
        tile = (self.rows_per_cta, self.kernel_dim)
        accum_tile = cute.local_tile(
            seqlen.buffer_rows(
                mdQaccum[None, None, 0, None, None], batch, head, packed=packed,
                rows_tile=self.rows_tile,
            ),
            tile, (row_block, 0),
        )
        accum = cute.make_tensor(accum_tile.iterator, cute.make_layout(cute.size(tile)))
        tiled_mma = warp_grid_mma(self.dtype, self.warps_dq)
        acc_dQ = cute.make_rmem_tensor(tiled_mma.get_slice(tidx).partition_shape_C(tile), Float32)
        for i in cutlass.range_constexpr(cute.size(acc_dQ)):
            acc_dQ[i] = accum[i * self.threads + tidx] * softmax_scale

        sdQ, tile_atom = self.smem_tile()
        dq_rows = seqlen.rows(mdQ, batch, head, keys=False, packed=packed)
        store_o(
            acc_dQ,
            sdQ,
            cute.local_tile(dq_rows, tile, (row_block, 0)),
            seqlen.seqlen_q - row_block * self.rows_per_cta,
            tiled_mma=tiled_mma,
            gmem_tiled_copy=gmem_row_copies(self.dtype, tile_atom, self.threads)[1],
            tidx=tidx,
            sync=cute.arch.barrier,
            columns=self.head_dim if self.head_dim != self.kernel_dim else None,
        )
