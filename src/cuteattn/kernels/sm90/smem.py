"""Shared-memory layouts and tile helpers of the sm90 kernels (forward and backward): the
swizzled K-major layouts WGMMA and TMA read, permuted views and TMA tiles (transposed views:
``kernels/common/smem_tiles.py``; packed batches' TMA views: ``ragged.py``)."""

import cutlass.cute as cute
import cutlass.utils.hopper_helpers as hopper
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum


def smem_layout(
    dtype, rows: int, cols: int, stages: int | None = None, atom_cols: int | None = None
):
    """Swizzled K-major (rows, cols[, stages]) layout that WGMMA and TMA both read; the
    swizzle atom sized for ``atom_cols`` columns (default: ``cols``), so that an operand read
    from a column offset that is a multiple of it starts on an atom."""
    atom = warpgroup.make_smem_layout_atom(
        hopper.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, atom_cols or cols), dtype
    )
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    return cute.tile_to_shape(atom, shape, (0, 1) if stages is None else (0, 1, 2))


def row_store_threads(rows: int, threads_per_row: int, num_threads: int) -> int:
    """How many of ``num_threads`` store a tile's rows so that their row blocks tile the rows
    exactly (a 48-row tile, 32 rows a pass, would be written past its end)."""
    rows_per_pass = num_threads // threads_per_row
    while rows % rows_per_pass:
        rows_per_pass //= 2
    return rows_per_pass * threads_per_row


def permuted(tensor: cute.Tensor, modes: list[int]) -> cute.Tensor:
    return cute.make_tensor(tensor.iterator, cute.select(tensor.layout, mode=modes))


def tma_partition(
    tma_atom: cute.CopyAtom, smem: cute.Tensor, gmem: cute.Tensor, tile_rank: int = 2
):
    """(smem, gmem) views for TMA: a tile's ``tile_rank`` modes grouped, stages / tiles after
    them."""
    return cpasync.tma_partition(
        tma_atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, tile_rank),
        cute.group_modes(gmem, 0, tile_rank),
    )


def tma_tile(tma_atom: cute.CopyAtom, smem: cute.Tensor, rows: cute.Tensor, tile_shape, coord):
    """``tma_partition`` of ``rows``' tile at ``coord`` (tiles of ``tile_shape``) and ``smem``."""
    return tma_partition(tma_atom, smem, cute.local_tile(rows, tile_shape, coord))
