"""2^x on the FMA pipe, for a share of the softmax's exponentials where the special-function
unit (MUFU) is the bottleneck: soft-capping puts a tanh on it next to every exp2, so a forward
with softcap issues two MUFU operations per score.

x = n + f with n = round(x) and f in [-0.5, 0.5]; 2^f is a cubic (minimax for the relative
error: at most 7.5e-5, below fp16's half ulp, 2.4e-4, and bf16's) and n goes into the exponent
field by an integer add. Rounding uses the 1.5 * 2^23 shifter: x + 1.5 * 2^23 holds round(x) in
its low mantissa bits (inline PTX, so the compiler cannot fold the add and the subtraction
back into x). Inputs at or below -126 give exactly 0 (a masked score's -inf included: a row
that sees no key keeps a zero sum), inputs above 127 are not expected (the softmax's exponents
are at most its rescale threshold).
"""

import cutlass
from cutlass import Float32
from cutlass.cutlass_dsl import dsl_user_op

from cuteattn.kernels.common.inline_ptx import inline_ptx

# Remez (relative error) coefficients of 2^f on [-0.5, 0.5], float32.
EXP2_CUBIC = (0.9999280571937561, 0.6932609677314758, 0.2426111251115799, 0.0551716685295105)
SHIFTER = 12582912.0  # 1.5 * 2^23
LOWEST = -126.0


@dsl_user_op
def _round_shifted(x: Float32, *, loc=None, ip=None) -> Float32:
    """x + 1.5 * 2^23, rounded to nearest: round(x) sits in the low mantissa bits."""
    return inline_ptx(Float32, [Float32(x)], "add.rn.f32 $0, $1, 0f4B400000;", "=f,f",
                      side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def _scale_by_exponent(
    x: Float32, shifted: Float32, mantissa: Float32, *, loc=None, ip=None
) -> Float32:
    """mantissa * 2^round(x) (round(x) from ``shifted``'s low bits, added to the exponent
    field); 0 where x <= LOWEST."""
    return inline_ptx(
        Float32,
        [Float32(x), Float32(shifted), Float32(mantissa)],
        "{\n\t"
        ".reg .b32 exponent, bits;\n\t"
        ".reg .pred underflow;\n\t"
        "mov.b32 exponent, $2;\n\t"
        "shl.b32 exponent, exponent, 23;\n\t"
        "mov.b32 bits, $3;\n\t"
        "add.s32 bits, bits, exponent;\n\t"
        "setp.le.f32 underflow, $1, 0fC2FC0000;\n\t"
        "selp.b32 $0, 0, bits, underflow;\n\t"
        "}",
        "=f,f,f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


def exp2_poly(x: Float32) -> Float32:
    """2^x without MUFU (module docstring). Plain Python, traced inside the caller's jit."""
    clamped = cutlass.max(x, Float32(LOWEST))
    shifted = _round_shifted(clamped)
    fraction = clamped - (shifted - Float32(SHIFTER))
    c0, c1, c2, c3 = (Float32(c) for c in EXP2_CUBIC)
    mantissa = ((c3 * fraction + c2) * fraction + c1) * fraction + c0
    return _scale_by_exponent(x, shifted, mantissa)


def exp2_poly_reference(x):
    """The same steps on float32 torch tensors (CPU tests): 2^x as the kernels compute it."""
    import torch

    x = torch.as_tensor(x, dtype=torch.float32)
    clamped = torch.clamp(x, min=LOWEST)
    shifted = clamped + SHIFTER
    fraction = clamped - (shifted - SHIFTER)
    c0, c1, c2, c3 = EXP2_CUBIC
    mantissa = ((c3 * fraction + c2) * fraction + c1) * fraction + c0
    # The exponent add in 64 bits, wrapped to 32 as the kernels' integer add wraps.
    bits = (mantissa.view(torch.int32).long() + (shifted.view(torch.int32).long() << 23))
    bits = (bits + 2**31) % 2**32 - 2**31
    result = bits.to(torch.int32).view(torch.float32)
    return torch.where(x <= LOWEST, torch.zeros_like(result), result)
