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


def _fake_sizes() -> dict:
    names = ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv")
    return {name: cute.sym_int() for name in names}


def _fake_bshd(plan: KernelPlan, batch, seqlen, heads, *, values: bool = False):
    """A (batch, seqlen, heads, dim) tensor of the plan's dtype, last mode contiguous; dim is
    the inputs' (``("dim", d)`` of a padded plan), not necessarily the kernel's; ``values``
    (v, out and their gradients): the plan's ``("dim_v", d)`` where it has one."""
    dtype = dsl_dtype(plan.dtype)
    elems_16b = 128 // dtype.width
    strides = tuple(cute.sym_int64(divisibility=elems_16b) for _ in range(3)) + (1,)
    dim = plan.option("dim", plan.head_dim)
    if values:
        dim = plan.option("dim_v", dim)
    return make_fake_tensor(dtype, (batch, seqlen, heads, dim), strides, assumed_align=16)


def _fake_fp32(*shape, align: int, stride_divisibility: int = 1):
    strides = tuple(cute.sym_int64(divisibility=stride_divisibility) for _ in shape[:-1]) + (1,)
    return make_fake_tensor(cutlass.Float32, shape, strides, assumed_align=align)


def fake_forward_args(plan: KernelPlan) -> tuple:
    """(q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q): fake
    tensors in the flash-attn layout, last mode contiguous (a varlen plan's packed tensors as
    batch 1); sink, the learnable sink's (heads_q,) fp32 logits, is None unless the plan has
    one; lse None for a plan with ("lse", False); the int32 cumulative lengths (batch + 1) and
    keys used (batch) None unless the plan is varlen (with ``seqused_k``); max_seqlen_q an
    Int32."""
    n = _fake_sizes()
    q = _fake_bshd(plan, n["batch"], n["seqlen_q"], n["heads_q"])
    k = _fake_bshd(plan, n["batch"], n["seqlen_k"], n["heads_kv"])
    v = _fake_bshd(plan, n["batch"], n["seqlen_k"], n["heads_kv"], values=True)
    out = _fake_bshd(plan, n["batch"], n["seqlen_q"], n["heads_q"], values=True)
    lse = None
    if plan.option("lse", True):
        lse = _fake_fp32(n["batch"], n["heads_q"], n["seqlen_q"], align=4)
    sink = None
    if plan.option("sink", False):
        sink = make_fake_tensor(cutlass.Float32, (n["heads_q"],), (1,), assumed_align=4)
    return (q, k, v, out, lse, sink, *_fake_varlen_args(plan), cutlass.Int32(0))


def _fake_varlen_args(plan: KernelPlan) -> tuple:
    """(cu_seqlens_q, cu_seqlens_k, seqused_k): int32 cumulative lengths (batch + 1) and keys
    used (batch) of a varlen plan (seqused_k only with the option), else None."""
    if not plan.option("varlen", False):
        return None, None, None
    count = cute.sym_int()  # batch + 1
    cu_seqlens_q, cu_seqlens_k = (
        make_fake_tensor(cutlass.Int32, (count,), (1,), assumed_align=4) for _ in range(2)
    )
    seqused_k = None
    if plan.option("seqused_k", False):
        seqused_k = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4)
    return cu_seqlens_q, cu_seqlens_k, seqused_k


def fake_backward_args(plan: KernelPlan, dq_chunks: tuple[int, int], counters: bool) -> tuple:
    """(q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv, semaphore): inputs and gradients in
    the flash-attn layout, the preprocess's fp32 per-row buffers, rows padded (a symbolic
    count) so whole query tiles stay in bounds, dq_accum as (batch, heads_q, chunks, rows,
    head_dim / chunks + row_pad) for ``dq_chunks`` = (chunks, row_pad), and where the kernel
    takes ``counters`` (``KernelFamily.dq_counters``) the int32 (batch or sequences, heads_q,
    m_blocks) counters (else None); then a varlen plan's cumulative lengths and keys used
    (else None) and its longest key sequence (an Int32)."""
    n = _fake_sizes()
    rows = cute.sym_int()
    q = _fake_bshd(plan, n["batch"], n["seqlen_q"], n["heads_q"])
    dout = _fake_bshd(plan, n["batch"], n["seqlen_q"], n["heads_q"], values=True)
    k, dk = (_fake_bshd(plan, n["batch"], n["seqlen_k"], n["heads_kv"]) for _ in range(2))
    v, dv = (
        _fake_bshd(plan, n["batch"], n["seqlen_k"], n["heads_kv"], values=True)
        for _ in range(2)
    )
    # The kernels' contract: rows padded to whole query tiles, so every (batch, head) row starts
    # 16-byte aligned (the sm80 backward cp.asyncs them 16 bytes at a time).
    lse_log2 = _fake_fp32(n["batch"], n["heads_q"], rows, align=16, stride_divisibility=4)
    dpsum = _fake_fp32(n["batch"], n["heads_q"], rows, align=16, stride_divisibility=4)
    chunks, row_pad = dq_chunks
    dq_accum = _fake_fp32(
        n["batch"], n["heads_q"], chunks, rows, plan.head_dim // chunks + row_pad, align=16
    )
    semaphore = None
    if counters:
        # Counters per sequence: a packed batch's q has batch 1, its counters one per sequence.
        sequences = cute.sym_int() if plan.option("varlen", False) else n["batch"]
        semaphore = make_fake_tensor(
            cutlass.Int32, (sequences, n["heads_q"], cute.sym_int()),
            (cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4,
        )
    return (
        q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv, semaphore, *_fake_varlen_args(plan),
        cutlass.Int32(0),
    )


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
