"""Sequence lengths of the work tile a CTA is computing.

Today every sequence of a batch has the lengths of the q and k tensors (seqlen_q, seqlen_k are
launch-wide runtime values). Varlen batches (``cu_seqlens_q/k``: per-sequence offsets into packed
tensors) and ``seqused_k`` (keys actually used per sequence) will read per-batch offsets and
lengths here, once per work tile; kernels, masks and block ranges take lengths only from this
record, so they will not change when it grows.
"""

from typing import NamedTuple

import cutlass.cute as cute
from cutlass import Int32


class SeqlenInfo(NamedTuple):
    """A frozen record the DSL carries through loops (a NamedTuple of DSL values)."""

    seqlen_q: Int32
    seqlen_k: Int32

    @staticmethod
    def fixed(mQ: cute.Tensor, mK: cute.Tensor) -> "SeqlenInfo":
        """Lengths of (batch, seqlen, heads, dim) q and k tensors: one for every sequence."""
        return SeqlenInfo(seqlen_q=mQ.shape[1], seqlen_k=mK.shape[1])
