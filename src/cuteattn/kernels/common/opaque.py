"""Values the compiler must compute once, where they are written.

LLVM treats special-register reads (``%ctaid``) and kernel parameters as free to recompute and
sinks a loop-invariant computed from them into the loop that uses it (the sm90 backward read
``%ctaid.x`` and seqlen_k and compared them on every key-loop step; ptxas then waited for the
S2UR in the middle of the dP^T WGMMAs). A ``mov`` in inline assembly with side effects is not
moved or duplicated: the value is computed before the loop and kept in a register.

``opaque_u64`` is the same move for a 64-bit value without side effects: its result cannot be
folded into the expression it came from (the sm90 kernels' held shared-memory descriptors,
``warpgroup.HeldStages``, which the compiler would otherwise rebuild at every use), yet it
may be dropped where unused.
"""

from cutlass import Int32, Int64
from cutlass.cutlass_dsl import dsl_user_op

from cuteattn.kernels.common.inline_ptx import inline_ptx


@dsl_user_op
def computed_here(value: Int32, *, loc=None, ip=None) -> Int32:
    """``value``, computed at this point of the program (not rematerialised later)."""
    return inline_ptx(Int32, [Int32(value)], "mov.b32 $0, $1;", "=r,r", side_effects=True,
                      loc=loc, ip=ip)


@dsl_user_op
def opaque_u64(value: Int64, *, loc=None, ip=None) -> Int64:
    """``value`` behind a move no compiler pass looks through (see the module's docstring)."""
    return inline_ptx(Int64, [value], "mov.b64 $0, $1;", "=l,l", side_effects=False,
                      loc=loc, ip=ip)
