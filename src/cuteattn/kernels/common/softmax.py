"""Online softmax over score tiles held in mma accumulators (FlashAttention-2 style).

Each thread keeps, for every accumulator row it owns, the running maximum of the raw scores and
its partial sum of exponentials. Scores are exponentiated as ``exp2(s * scale_log2 - m *
scale_log2)``, one FFMA and one MUFU.EX2 per element. Row maxima are reduced across the four
threads of a quad at every tile; row sums only once, in ``finalize``.

Long context: O and the row sum are rescaled by exp2((max_prev - max_new) * scale_log2), the
difference taken first, so a tile that does not move the maximum rescales by exactly 1. (The
form max_prev * c - max_new * c was contracted by ptxas into an FMA that returns the rounding
error of max_new * c: every tile then scaled by the same 1 + 1e-8, and the lse drifted by 1e-2
over 2^24 keys while O, scaled alike, stayed right.) A plain fp32 running sum is then accurate:
the lse is within 1.2e-5 of the fp64 value at 2^24 keys in both families (docs/PERF.md); a
Kahan-compensated sum gained 1e-5 there and cost 1-3% of throughput, so it is not used.

Lazy rescale (``rescale_threshold`` > 0, log2 units): a row keeps its old max while the new
one exceeds it by at most the threshold, so its P values may reach 2^threshold (within 16-bit
range for 8) and O and the row sum are not rescaled; ``rescale_rows_where_needed`` then skips
the O multiply for a warp whose rows all kept their max, which after the first key tiles is
nearly every tile. The statistics stay consistent (the lse uses the max the row kept), so
the result is exact either way.

A row that has seen only masked (-inf) scores keeps max -inf and sum 0: its exponentials use 0
as the subtracted max (so -inf - 0 stays -inf -> 0, never NaN), and ``finalize`` turns it into
output 0 and LSE -inf.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from cuteattn.kernels.common.exp2_poly import exp2_poly
from cuteattn.kernels.common.fragments import acc_as_rows_cols

LN2 = math.log(2.0)
LOG2_E = math.log2(math.e)


@cute.jit
def quad_allreduce_max(value: Float32) -> Float32:
    for offset in cutlass.range_constexpr(2):
        other = cute.arch.shuffle_sync_bfly(value, offset=2 >> offset)
        value = cute.arch.fmax(value, other)
    return value


@cute.jit
def quad_allreduce_sum(value: Float32) -> Float32:
    for offset in cutlass.range_constexpr(2):
        value = value + cute.arch.shuffle_sync_bfly(value, offset=2 >> offset)
    return value


def row_reduce(
    values: cute.Tensor, combine, init: Float32 | None = None, *, chains: int = 4
) -> Float32:
    """combine() over a register row (and ``init``), in ``chains`` independent chains.

    One chain over a row is a sequence of dependent FMNMX / FADD, bound by their latency; four
    chains keep the pipes busy at the same instruction count, for a few more live registers.
    With several chains ``init`` heads the first one, so whatever produces it is needed early
    and gets scheduled early (the O rescale factor, for the running sum). Plain Python (traced
    inside the caller's jit): the loops unroll at trace time.
    """
    n = cute.size(values)
    chains = min(chains, n)
    partial = [values[i] for i in range(chains)]
    # With one chain, init is combined last: a running sum at the chain's head would absorb
    # every element one by one, and over 2^24 keys the lse drifts by 1.5e-3 (the tile's own
    # sum first keeps it at 1e-5).
    if init is not None and chains > 1:
        partial[0] = combine(init, partial[0])
    for i in range(chains, n):
        partial[i % chains] = combine(partial[i % chains], values[i])
    while len(partial) > 1:
        partial = [
            combine(partial[i], partial[i + 1]) if i + 1 < len(partial) else partial[i]
            for i in range(0, len(partial), 2)
        ]
    if init is not None and chains == 1:
        return combine(init, partial[0])
    return partial[0]


def _add(a, b):
    return a + b


class OnlineSoftmax:
    """Running row max / row sum for the rows of one thread's accumulator fragment."""

    def __init__(
        self, scale_log2: Float32, num_rows: int, *, reduce_chains: int = 4,
        rescale_threshold: float = 0.0, exp2_poly_every: int = 0,
    ):
        """reduce_chains: independent chains per row reduction (``row_reduce``). Four suit a
        warpgroup's two rows per thread; the sm80 kernel, four or more rows per thread at 255
        registers, spills with them (d128: 20 -> 55 spill instructions) and uses one.
        rescale_threshold: log2 units a row's max may lag behind (0: always the new max).
        exp2_poly_every: every that-many-th column's exponential on the FMA pipe
        (``exp2_poly``: soft-capping's tanh shares MUFU with exp2), 0 for none."""
        self.rescale_threshold = rescale_threshold
        self.exp2_poly_every = exp2_poly_every
        self.scale_log2 = scale_log2
        self.num_rows = num_rows
        self.reduce_chains = reduce_chains
        self.row_max = cute.make_rmem_tensor(num_rows, Float32)
        self.row_sum = cute.make_rmem_tensor(num_rows, Float32)
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def step(self, acc_S: cute.Tensor, *, is_first: cutlass.Constexpr[bool]) -> cute.Tensor:
        """Exponentiate acc_S in place (it becomes P) and return the factor to rescale O by."""
        scores = acc_as_rows_cols(acc_S)
        row_scale = cute.make_rmem_tensor(self.num_rows, Float32)
        for r in cutlass.range_constexpr(self.num_rows):
            row = scores[r, None].load()
            prev_max = self.row_max[r]
            new_max = quad_allreduce_max(
                row_reduce(scores[r, None], cute.arch.fmax, prev_max, chains=self.reduce_chains)
            )
            # A fully masked row so far: subtract 0 instead of -inf so exp2 yields 0, not NaN.
            safe_max = new_max if new_max != -Float32.inf else Float32(0.0)
            if cutlass.const_expr(not is_first and self.rescale_threshold > 0.0):
                # Keep the old max while the new one is within the threshold (lazy rescale).
                lag = (prev_max - safe_max) * self.scale_log2
                keep = lag >= Float32(-self.rescale_threshold)
                safe_max = prev_max if keep else safe_max
                new_max = prev_max if keep else new_max
            max_scaled = safe_max * self.scale_log2
            if cutlass.const_expr(self.exp2_poly_every > 0):
                every = self.exp2_poly_every
                for c in cutlass.range_constexpr(cute.size(scores, mode=[1])):
                    exponent = scores[r, c] * self.scale_log2 - max_scaled
                    if cutlass.const_expr(c % every == every - 1):
                        scores[r, c] = exp2_poly(exponent)
                    else:
                        scores[r, c] = cute.math.exp2(exponent, fastmath=True)
            else:
                probs = cute.math.exp2(row * self.scale_log2 - max_scaled, fastmath=True)
                scores[r, None] = probs
            if cutlass.const_expr(is_first):
                row_scale[r] = Float32(1.0)
                self.row_sum[r] = row_reduce(scores[r, None], _add, chains=self.reduce_chains)
            else:
                # The difference first: equal maxima rescale by exactly 1 (module docstring).
                scale = cute.math.exp2((prev_max - safe_max) * self.scale_log2, fastmath=True)
                row_scale[r] = scale
                self.row_sum[r] = row_reduce(
                    scores[r, None], _add, self.row_sum[r] * scale, chains=self.reduce_chains
                )
            self.row_max[r] = new_max
        return row_scale

    @cute.jit
    def finalize(self, lse: cute.Tensor, sink: cute.Tensor | None = None) -> cute.Tensor:
        """Return 1 / row_sum per row (0 for rows with no visible key) and fill lse (natural log).

        ``sink``: per row, a learnable sink's logit (natural log, the scores' units) that joins
        the denominator (``kernels/common/sink.py``), or None."""
        row_scale = cute.make_rmem_tensor(self.num_rows, Float32)
        for r in cutlass.range_constexpr(self.num_rows):
            total = quad_allreduce_sum(self.row_sum[r])
            if cutlass.const_expr(sink is None):
                is_empty = total == Float32(0.0)
                row_scale[r] = Float32(0.0) if is_empty else cute.arch.rcp_approx(total)
                lse[r] = (
                    -Float32.inf
                    if is_empty
                    else (self.row_max[r] * self.scale_log2 + cute.math.log2(total, fastmath=True))
                    * Float32(LN2)
                )
            else:
                # Both terms of the denominator relative to the larger of the row's max and
                # the sink; a row without keys (max -inf) keeps the sink alone.
                max_log2 = self.row_max[r] * self.scale_log2
                sink_log2 = sink[r] * Float32(LOG2_E)
                top = cute.arch.fmax(max_log2, sink_log2)
                top = top if top != -Float32.inf else Float32(0.0)
                kept = cute.math.exp2(max_log2 - top, fastmath=True)
                denom = total * kept + cute.math.exp2(sink_log2 - top, fastmath=True)
                is_empty = denom == Float32(0.0)
                row_scale[r] = Float32(0.0) if is_empty else kept * cute.arch.rcp_approx(denom)
                lse[r] = (
                    -Float32.inf
                    if is_empty
                    else (top + cute.math.log2(denom, fastmath=True)) * Float32(LN2)
                )
        return row_scale


@cute.jit
def rescale_rows(acc: cute.Tensor, row_scale: cute.Tensor):
    """Multiply each accumulator row by its factor."""
    acc_rc = acc_as_rows_cols(acc)
    for r in cutlass.range_constexpr(cute.size(row_scale)):
        acc_rc[r, None] = acc_rc[r, None].load() * row_scale[r]


@cute.jit
def rescale_rows_where_needed(acc: cute.Tensor, row_scale: cute.Tensor):
    """``rescale_rows``, skipped (a warp-uniform branch) when every row of the warp has factor
    1, as rows under a lazy rescale mostly do."""
    needed = row_scale[0] != Float32(1.0)
    for r in cutlass.range_constexpr(1, cute.size(row_scale)):
        needed = needed | (row_scale[r] != Float32(1.0))
    if cute.arch.vote_any_sync(needed):
        rescale_rows(acc, row_scale)
