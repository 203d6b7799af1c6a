"""What every attention kernel class of every family is built from."""

import cutlass


class AttentionKernel:
    """The element type, the head dim, the (tile_m queries, tile_n keys) tile of the attention
    matrix a CTA works on at a time, and whether the mask is causal. A family's kernel class adds
    its own settings (threads, stages, scheduling) and the ``cute.jit`` entry point.

    ``softcap`` > 0: the scores are soft-capped (``kernels/common/softcap.py``), a compile-time
    constant. ``window``: a local window's (left, right), -1 unbounded (``BlockInfo``), or
    None. ``varlen``: packed sequences of their own lengths (``SeqlenInfo.varlen``)."""

    def __init__(
        self,
        *,
        dtype: type[cutlass.Numeric],
        head_dim: int,
        tile_m: int,
        tile_n: int,
        causal: bool,
        softcap: float = 0.0,
        window: tuple[int, int] | None = None,
        varlen: bool = False,
    ):
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal
        self.softcap = softcap
        self.window = window
        self.varlen = varlen
