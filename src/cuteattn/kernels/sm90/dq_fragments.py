"""dQ in fragment order, as the sm90 backward adds it to dq_accum and its postprocess reads it
back (FlashAttention-4's layout).

A consumer warpgroup's dQ share of a query tile is one flat fp32 block: thread t (of the
warpgroup's 128) keeps values 4i..4i+3 of its dQ accumulator (register order) at floats
(128 i + t) * 4 ... + 3. A warp's 16-byte stores then cover 512 contiguous bytes (four
wavefronts, no bank conflict, no row padding), and one bulk reduction adds the whole block.
"""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as hopper
from cutlass import Float32, Int32

from cuteattn.kernels.common.smem_tiles import transposed
from cuteattn.kernels.sm90.family import backward_dq_chunks, backward_dq_splits_rows

VECTOR = 4  # floats per 16-byte access
THREADS = 128  # a warpgroup


def fragment_slots(block: cute.Tensor, thread: Int32, count: int) -> cute.Tensor:
    """Thread ``thread``'s ``count`` places in a flat block (whatever its layout: only its
    iterator is used), as (VECTOR, count / VECTOR): ``fragment_vectors``'s shape."""
    assert count % VECTOR == 0, f"{count} accumulator values are no whole 16-byte vectors"
    layout = cute.make_layout(
        (VECTOR, count // VECTOR, THREADS), stride=(1, VECTOR * THREADS, VECTOR)
    )
    return cute.make_tensor(block.iterator, layout)[None, None, thread]


def fragment_vectors(acc: cute.Tensor) -> cute.Tensor:
    """A compact register fragment seen as (VECTOR, size / VECTOR), register order."""
    return cute.make_tensor(acc.iterator, cute.make_layout((VECTOR, cute.size(acc) // VECTOR)))


class DqSplit:
    """How the two consumer warpgroups share dQ of a (tile_m, head_dim) query tile (see
    ``kernels/sm90/backward.py``): by columns (``by_dim``: d64 / d128 in 64-row tiles), by rows
    (``by_rows``: d64's 128-row tile, each its 64 queries), or not at all (d96: warpgroup 0
    alone, over all keys, family.py ``backward_dq_single_wg``; the fallback, by keys, has each
    warpgroup add its keys' share of the whole tile to the same block); ``transposed``: a
    tile_m that is no multiple of 64 (dQ^T = K^T dS^T, dim along M, split by dim)."""

    def __init__(self, head_dim: int, tile_m: int):
        chunks, _ = backward_dq_chunks(head_dim, tile_m)
        self.head_dim, self.tile_m = head_dim, tile_m
        self.by_rows = backward_dq_splits_rows(head_dim, tile_m)
        self.by_dim = chunks == 2
        self.transposed = tile_m % 64 != 0
        self.chunk_cols = head_dim // chunks
        self.buffer_rows = tile_m // 2 if self.by_rows else tile_m
        # Blocks (warpgroup buffers) that make up a query tile: d96, one (warpgroup 0's; the
        # fallback by keys: both warpgroups add to one).
        self.blocks = 2 if (self.by_dim or self.by_rows) else 1

    def tile(self) -> tuple[int, int]:
        """The tile the dQ GEMM's accumulator covers: (dim, queries) transposed, else
        (a warpgroup's rows, dim)."""
        if self.transposed:
            return (self.head_dim, self.tile_m)
        return (self.buffer_rows, self.head_dim)

    def tiled_mma(self, dtype: type[cutlass.Numeric]) -> cute.TiledMma:
        """dQ = dS K with A = dS and B = K^T, both MN-major from shared memory: split by dim,
        the warpgroups take a chunk of columns each (k over all keys), else one warpgroup's
        (64 queries, dim) (k over all keys: split by rows, or d96's warpgroup 0 alone; the
        fallback by keys, over its own). The accumulator's layout (the fragment order) does
        not depend on k. Transposed: A = K^T
        (dim x keys), B = dS (queries x keys), each warpgroup its chunk of dim along M."""
        mn_major = cute.nvgpu.OperandMajorMode.MN
        if self.transposed:
            return hopper.make_trivial_tiled_mma(
                dtype, dtype, mn_major, mn_major, Float32,
                atom_layout_mnk=(2, 1, 1), tiler_mn=(64, self.tile_m),
            )
        return hopper.make_trivial_tiled_mma(
            dtype, dtype, mn_major, mn_major, Float32,
            atom_layout_mnk=(1, 2 if self.by_dim else 1, 1), tiler_mn=(64, self.chunk_cols),
        )

    def thread_slice(self, tiled_mma: cute.TiledMma, tidx: Int32):
        """Consumer thread ``tidx``'s (0 .. 255) slice of ``tiled_mma``: split by dim (and
        transposed) both warpgroups form one MMA, else each its own."""
        if cutlass.const_expr(self.by_dim):
            return tiled_mma.get_slice(tidx)
        return tiled_mma.get_slice(tidx % THREADS)

    def places(self, tiled_mma: cute.TiledMma, tile: cute.Tensor, tidx: Int32) -> cute.Tensor:
        """Where consumer thread ``tidx``'s dQ accumulator values (register order) belong in
        the query tile ``tile`` (tile_m, head_dim): its partition of the tile as the backward's
        dQ GEMM sees it."""
        thr = self.thread_slice(tiled_mma, tidx)
        if cutlass.const_expr(self.transposed):
            return thr.partition_C(transposed(tile))
        if cutlass.const_expr(self.by_rows):
            return thr.partition_C(
                cute.local_tile(tile, (self.buffer_rows, self.head_dim), (tidx // THREADS, 0))
            )
        return thr.partition_C(tile)
