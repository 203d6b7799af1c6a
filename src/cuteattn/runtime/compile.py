"""Compiles kernels once per plan, with fake tensors and symbolic sizes, through TVM-FFI.

Sizes (batch, sequence lengths, heads) and strides are symbolic, so one compiled kernel serves
every shape of a plan; strides are 64-bit and known to be multiples of 8 elements (16 bytes),
which is what validation guarantees before a launch. The stream comes from the TVM-FFI
environment, i.e. torch's current stream.
"""

import logging
import time

from cuteattn.plan import KernelPlan

log = logging.getLogger("cuteattn")

_compiled: dict[KernelPlan, object] = {}


def _dsl_dtype(name: str):
    import cutlass

    return {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}[name]


def fake_forward_args(plan: KernelPlan):
    """(q, k, v, out, lse) fake tensors in the flash-attn layout, last mode contiguous."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    dtype = _dsl_dtype(plan.dtype)
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


def build_forward_kernel(plan: KernelPlan):
    if plan.family != "sm80":
        raise NotImplementedError(f"kernel family {plan.family!r}")
    from cuteattn.kernels.sm80.forward import FlashForwardSm80

    return FlashForwardSm80(
        _dsl_dtype(plan.dtype),
        plan.head_dim,
        plan.tile_m,
        plan.tile_n,
        plan.num_threads,
        plan.causal,
    )


def compile_forward(plan: KernelPlan):
    """Compile (or fetch) the forward kernel for a plan; call it as fn(q, k, v, out, lse, scale)."""
    fn = _compiled.get(plan)
    if fn is None:
        import cutlass
        import cutlass.cute as cute

        start = time.perf_counter()
        kernel = build_forward_kernel(plan)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(
            kernel,
            *fake_forward_args(plan),
            cutlass.Float32(1.0),
            stream,
            options=f"--enable-tvm-ffi --gpu-arch {plan.arch}",
        )
        _compiled[plan] = fn
        log.info("compiled %s in %.1f s", plan, time.perf_counter() - start)
    return fn
