"""TMA views of packed (varlen) tensors whose boxes stop at a sequence's end.

A packed tensor's rows run from one sequence into the next, so a TMA box at a sequence's last,
partial tile would load the next sequence's rows (and a store would overwrite them). Here the
rows mode of the (total, dim, heads) view becomes a fixed bound ``ROWS_BOUND``, and sequence b
(first row o, length L) is addressed from row coordinate ROWS_BOUND - L: its rows past L lie
past the bound, where TMA loads zeros and clips stores, exactly as past a fixed-length batch's
seqlen. Two extra modes bring the address back to row o: (ROWS_BOUND, o + L) with strides
(2^34 - row stride, row stride) add 2^30 * 2^34 = 2^64 elements (0 modulo the 64-bit address)
plus (o + L) rows, which with the rows mode's (ROWS_BOUND - L) rows lands on row o. The base
pointer stays the tensor's own (TMA loads need it inside mapped memory). Triton's
``tools/ragged_tma.py`` and quack's ``create_ragged_tensor_for_tma`` use the same arithmetic.
"""

import cutlass.cute as cute
from cutlass import Int32

from cuteattn.kernels.sm90.smem import permuted

ROWS_BOUND = 2**30  # > any sequence's length; the row coordinates stay below 2^31
EXTRA_MODE = 2**31 - 1  # the extra modes' extent (TMA coordinates are int32)
WRAP_STRIDE = 2**64 // ROWS_BOUND  # ROWS_BOUND times it is 2^64 elements: 0 in the address


def packed_tma_view(packed: cute.Tensor) -> cute.Tensor:
    """A packed batch's (1, total, heads, dim) tensor as (ROWS_BOUND, dim, heads, EXTRA_MODE,
    EXTRA_MODE), to build a TMA atom from; ``sequence_rows`` picks one sequence's rows of its
    TMA tensor."""
    rows = permuted(packed[0, None, None, None], [0, 2, 1])  # (total, dim, heads)
    row_stride = rows.stride[0]
    shape = (ROWS_BOUND,) + tuple(rows.shape[1:]) + (EXTRA_MODE, EXTRA_MODE)
    stride = (row_stride,) + tuple(rows.stride[1:]) + (WRAP_STRIDE - row_stride, row_stride)
    return cute.make_tensor(rows.iterator, cute.make_layout(shape, stride=stride))


def sequence_rows(view: cute.Tensor, head: Int32, offset: Int32, length: Int32) -> cute.Tensor:
    """The (rows, dim) TMA coordinates of ``head`` of the sequence of ``length`` rows from packed
    row ``offset``, in the TMA tensor of a ``ragged_tma_view``: its row r at coordinate
    ROWS_BOUND - length + r, so that boxes load zeros past its end and stores stop there."""
    sequence = view[None, None, head, ROWS_BOUND, offset + length]
    return cute.domain_offset((ROWS_BOUND - length, 0), sequence)
