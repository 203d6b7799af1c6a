"""Logit soft-capping (Gemma 2): scores become softcap * tanh(scores / softcap), before masking.

With x = q . k and s = softcap * tanh(x * softmax_scale / softcap), the kernels keep
t = tanh(x * softmax_scale / softcap) in the score accumulator and fold softcap into the
exponent's scale: P = exp2(t * softcap * log2(e) - m). The forward's lse is that of s. The
backward recomputes t from the S GEMM and scales the score gradient by
ds / d(x * softmax_scale) = 1 - t^2 (dQ and dK still get softmax_scale where they would
without soft-capping).

``softcap`` is a compile-time value (a plan option); 0 is off and emits no instruction. These
are plain functions: they run while a kernel is traced, so their Python ``if`` on ``softcap``
decides what is emitted.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LOG2_E = math.log2(math.e)


def exp2_scale(softmax_scale: Float32, softcap: float):
    """The scale of the scores inside exp2: softmax_scale * log2(e), or softcap * log2(e) when
    the scores hold tanh values."""
    if softcap > 0:
        return Float32(softcap * LOG2_E)
    return softmax_scale * LOG2_E


def tanh_scale(softmax_scale: Float32, softcap: float):
    """The multiplier of x inside the tanh (softmax_scale / softcap); 1 when off (unused)."""
    if softcap > 0:
        return softmax_scale * (1.0 / softcap)
    return Float32(1.0)


def apply_softcap(acc_S: cute.Tensor, tanh_scale: Float32, softcap: float):
    """Scores x -> tanh(x * tanh_scale) in place (MUFU.TANH); nothing when off."""
    if softcap > 0:
        for i in range(cute.size(acc_S)):
            acc_S[i] = cute.math.tanh(acc_S[i] * tanh_scale, fastmath=True)


def _tanh_grad(t: Float32):
    # 0 where the mask set t to -inf: its probability is 0, and 0 * inf would be NaN.
    return cutlass.max(1.0 - t * t, Float32(0.0))


def chain_score_grad(dscore: Float32, t: Float32, softcap: float):
    """The gradient w.r.t. the softmax input s -> w.r.t. x * softmax_scale, at a score holding
    t = tanh(...): times 1 - t^2. Unchanged when off."""
    if softcap > 0:
        dscore = dscore * _tanh_grad(t)
    return dscore
