"""PTX the DSL does not offer, as LLVM inline assembly on DSL scalars (one place for the
boilerplate of ``llvm.inline_asm``)."""

from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

_IR_TYPES = {Int32: T.i32, Float32: T.f32, Int64: T.i64}


def inline_ptx(result_type, operands, text: str, constraints: str, *, side_effects: bool,
               loc=None, ip=None):
    """``text`` (operands $1.. after the result $0) on ``operands`` (DSL scalars of the types
    the constraints name), its result as ``result_type`` (Int32 or Float32). ``side_effects``:
    the compiler may neither move, duplicate nor drop it. Call inside a ``dsl_user_op``."""
    return result_type(
        llvm.inline_asm(
            _IR_TYPES[result_type](),
            [operand.ir_value(loc=loc, ip=ip) for operand in operands],
            text,
            constraints,
            has_side_effects=side_effects,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )
