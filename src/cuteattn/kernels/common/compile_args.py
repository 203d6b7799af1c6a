"""Host-side arguments for compiling any family's forward kernel: DSL dtypes and fake tensors.

Sizes (batch, sequence lengths, heads) and strides are symbolic, so one compiled kernel serves
every shape of a plan; strides are 64-bit and known to be multiples of 16 bytes, which is what
validation guarantees before a launch.
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from cuteattn.plan import KernelPlan

_DSL_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}


def dsl_dtype(name: str) -> type[cutlass.Numeric]:
    return _DSL_DTYPES[name]


def fake_forward_args(plan: KernelPlan) -> tuple:
    """(q, k, v, out, lse) fake tensors in the flash-attn layout, last mode contiguous."""
    dtype = dsl_dtype(plan.dtype)
    elems_16b = 128 // dtype.width

    def bshd(batch, seqlen, heads):
        strides = tuple(cute.sym_int64(divisibility=elems_16b) for _ in range(3)) + (1,)
        return make_fake_tensor(
            dtype, (batch, seqlen, heads, plan.head_dim), strides, assumed_align=16
        )

    batch, seqlen_q, seqlen_k = cute.sym_int(), cute.sym_int(), cute.sym_int()
    heads_q, heads_kv = cute.sym_int(), cute.sym_int()
    q = bshd(batch, seqlen_q, heads_q)
    k = bshd(batch, seqlen_k, heads_kv)
    v = bshd(batch, seqlen_k, heads_kv)
    out = bshd(batch, seqlen_q, heads_q)
    lse = make_fake_tensor(
        cutlass.Float32,
        (batch, heads_q, seqlen_q),
        (cute.sym_int64(), cute.sym_int64(), 1),
        assumed_align=4,
    )
    return q, k, v, out, lse


def check_operand_dtypes(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor):
    """Trace-time check in a kernel's ``__call__``: one dtype for q, k, v and out."""
    if not (mQ.element_type == mK.element_type == mV.element_type):
        raise TypeError("q, k and v must share one dtype")
    if mO.element_type != mQ.element_type:
        raise TypeError("out must have the dtype of q")


def check_same_dtype(**tensors: cute.Tensor):
    """Trace-time check in a kernel's ``__call__``: every named tensor has one dtype."""
    names = list(tensors)
    first = tensors[names[0]].element_type
    for name in names[1:]:
        if tensors[name].element_type != first:
            raise TypeError(f"{name} must have the dtype of {names[0]}")
