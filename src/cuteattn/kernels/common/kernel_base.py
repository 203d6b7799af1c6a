"""What every attention kernel class of every family is built from."""

import cutlass


class AttentionKernel:
    """The element type, the head dim, the (tile_m queries, tile_n keys) tile of the attention
    matrix a CTA works on at a time, and whether the mask is causal. A family's kernel class adds
    its own settings (threads, stages, scheduling) and the ``cute.jit`` entry point."""

    def __init__(
        self,
        *,
        dtype: type[cutlass.Numeric],
        head_dim: int,
        tile_m: int,
        tile_n: int,
        causal: bool,
    ):
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal
