"""What every attention kernel class of every family is built from."""

import cutlass


class AttentionKernel:
    """The element type, the head dim, the (tile_m queries, tile_n keys) tile of the attention
    matrix a CTA works on at a time, and whether the mask is causal. A family's kernel class adds
    its own settings (threads, stages, scheduling) and the ``cute.jit`` entry point.

    ``softcap`` > 0: the scores are soft-capped (``kernels/common/softcap.py``), a compile-time
    constant. ``window``: a local window's (left, right), -1 unbounded (``BlockInfo``), or
    None. ``varlen``: packed sequences of their own lengths (``SeqlenInfo.varlen``).
    ``input_dim``: the inputs' head dim where the kernel pads it to ``head_dim`` (a family that
    copies rows chunk by chunk: ``kernels/common/columns.py``), else None. ``head_dim_v``: the
    columns of v and out where they differ from q's and k's (None: the same)."""

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
        input_dim: int | None = None,
        head_dim_v: int | None = None,
    ):
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal
        self.softcap = softcap
        self.window = window
        self.varlen = varlen
        self.input_dim = input_dim
        self.head_dim_v = head_dim_v or head_dim
