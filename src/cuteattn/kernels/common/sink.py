"""Learnable sink (gpt-oss, FlashAttention-4): one extra logit per query head that joins every
row's softmax denominator and has no value row.

The forward folds it in when it finalises a row (``OnlineSoftmax.finalize``): with the row's
running max m and sum l (scores in log2 units), and the sink s2 = sink * log2(e) in the same
units, out = O / (l + 2^(s2 - m)) and lse = log(l 2^m + 2^s2). A row that sees no key gets
out = 0 and lse = sink. The backward needs nothing more: its probabilities come from that lse,
and dsink = -sum_rows exp(sink - lse) * rowsum(dO * O) is a reduction over the preprocess's
rows (``cuteattn.ops``).
"""

import cutlass.cute as cute
from cutlass import Float32, Int32


def row_sinks(mSink: cute.Tensor, head: Int32, coords: cute.Tensor, num_rows: int, pack_gqa: int):
    """The sink logit of each of this thread's rows: ``head``'s, or, with packed GQA (``head``
    then the KV head), that of the query head of the row (row i of a tile is query head
    i % pack_gqa of the group). ``coords``: the score tile's coordinates (``tile_coords``)."""
    sinks = cute.make_rmem_tensor(num_rows, Float32)
    for r in range(num_rows):
        if pack_gqa == 1:
            sinks[r] = mSink[head]
        else:
            sinks[r] = mSink[head * pack_gqa + coords[r, 0][0] % pack_gqa]
    return sinks
