"""Sequence lengths and offsets of the work tile a CTA is computing.

Fixed-length batches: every sequence has the lengths of the (batch, seqlen, heads, dim) q and k
tensors. Varlen batches (``cu_seqlens_q/k``: per-sequence offsets into packed tensors, which
the kernels see as (1, total, heads, dim), lse as (1, heads, total_q)): sequence b owns rows
cu_seqlens[b] .. cu_seqlens[b + 1]; ``seqused_k`` (optional) caps the keys it uses. Kernels,
masks and block ranges take lengths only from this record, and address a sequence's rows
through ``rows`` / ``lse_row``, so they read fixed and varlen batches alike.
"""

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32


class SeqlenInfo(NamedTuple):
    """A frozen record the DSL carries through loops (a NamedTuple of DSL values). ``offset_q``
    / ``offset_k``: the sequence's first row in a packed (varlen) tensor, else 0. Whether the
    tensors are packed is the kernel's compile-time flag, passed to ``rows`` & co. as
    ``packed`` (a field would become a runtime value once the record crosses a jit call)."""

    seqlen_q: Int32
    seqlen_k: Int32
    offset_q: Int32 | int = 0
    offset_k: Int32 | int = 0
    # The backward's per-row buffers (lse, dpsum, dq_accum) of a packed batch: the sequence's
    # first row there (``padded_rows_start``), so each one starts on a whole query tile.
    offset_rows: Int32 | int = 0

    @staticmethod
    def fixed(mQ: cute.Tensor, mK: cute.Tensor) -> "SeqlenInfo":
        """Lengths of (batch, seqlen, heads, dim) q and k tensors: one for every sequence."""
        return SeqlenInfo(seqlen_q=mQ.shape[1], seqlen_k=mK.shape[1])

    @staticmethod
    def varlen(
        mCuSeqlensQ: cute.Tensor, mCuSeqlensK: cute.Tensor, mSequsedK: cute.Tensor | None,
        batch: Int32, rows_tile: int = 0,
    ) -> "SeqlenInfo":
        """Sequence ``batch`` of a packed batch: its rows from the cumulative lengths (int32,
        batch + 1), its keys capped by ``seqused_k[batch]`` when given; ``rows_tile`` (the
        backward's tile_m) places it in the per-row buffers (``padded_rows_start``)."""
        offset_q = mCuSeqlensQ[batch]
        offset_k = mCuSeqlensK[batch]
        seqlen_k = mCuSeqlensK[batch + 1] - offset_k
        if cutlass.const_expr(mSequsedK is not None):
            seqlen_k = mSequsedK[batch]
        offset_rows = 0
        if cutlass.const_expr(rows_tile > 0):
            offset_rows = padded_rows_start(offset_q, batch, rows_tile)
        return SeqlenInfo(
            seqlen_q=mCuSeqlensQ[batch + 1] - offset_q, seqlen_k=seqlen_k,
            offset_q=offset_q, offset_k=offset_k, offset_rows=offset_rows,
        )

    def rows(
        self, mX: cute.Tensor, batch: Int32, head: Int32, *, keys: bool, packed: bool
    ) -> cute.Tensor:
        """The (seqlen, dim) rows of this sequence and ``head`` in a (batch, seqlen, heads, dim)
        tensor: queries (q, out) or ``keys`` (k, v). Packed: batch 0 from the sequence's first
        row (64-bit addressing: the offset scales the tensor's 64-bit stride)."""
        if cutlass.const_expr(not packed):
            return mX[batch, None, head, None]
        offset = self.offset_k if cutlass.const_expr(keys) else self.offset_q
        return cute.domain_offset((offset, 0), mX[0, None, head, None])

    def lse_row(self, mLSE: cute.Tensor, batch: Int32, head: Int32, *, packed: bool) -> cute.Tensor:
        """This sequence's lse entries of ``head`` in a (batch, heads, seqlen_q) tensor."""
        if cutlass.const_expr(not packed):
            return mLSE[batch, head, None]
        return cute.domain_offset((self.offset_q,), mLSE[0, head, None])

    def buffer_rows(
        self, mX: cute.Tensor, batch: Int32, head: Int32, *, packed: bool, rows_tile: int
    ) -> cute.Tensor:
        """This sequence's rows of ``head`` in a backward per-row buffer (batch, heads, rows,
        ...): lse_log2, dpsum (rows), or a dq_accum chunk (rows, cols) given as mX[.., chunk].
        Packed: batch 0 from ``offset_rows``, a multiple of ``rows_tile`` (said to the compiler,
        which then keeps the 16-byte alignment of the buffers' rows)."""
        if cutlass.const_expr(not packed):
            return mX[(batch, head) + (None,) * (cute.rank(mX) - 2)]
        view = mX[(0, head) + (None,) * (cute.rank(mX) - 2)]
        start = cute.assume(self.offset_rows, divby=rows_tile)
        return cute.domain_offset((start,) + (0,) * (cute.rank(view) - 1), view)


def padded_rows_start(offset_q, batch, rows_tile: int):
    """Sequence ``batch``'s first row in a packed batch's per-row buffers: its first packed
    row plus ``batch`` tiles of slack, rounded down to a whole tile. Every sequence then has its
    length rounded up to whole tiles before the next one starts; the buffers hold
    total_q + batch * rows_tile rows (``cuteattn.ops``'s ``padded_rows``)."""
    return (offset_q + batch * rows_tile) // rows_tile * rows_tile
