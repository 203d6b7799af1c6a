"""Compiles kernels once per plan, with fake tensors and symbolic sizes, through TVM-FFI.

Generic over kernel families: the plan's family supplies the kernel object and its fake
arguments. The stream comes from the TVM-FFI environment, i.e. torch's current stream. The
dependency floors are checked once, before the first compile imports the DSL.
"""

import functools
import logging
import os
import time

from cuteattn.arch import arch_from_name
from cuteattn.plan import KernelPlan, get_family
from cuteattn.runtime.deps import check_dependencies

log = logging.getLogger("cuteattn")

# Compiled kernels by plan, or by (kind, arch, sizes) for the pre- and postprocess kernels.
_compiled: dict[object, object] = {}

# For benchmarks: extra ptxas options (e.g. "-O2") for every kernel this process compiles, read
# once, at the first compile (FlashAttention-4 measured -O2 at +3-4% on some kernels, -7% on
# others). One setting per process: compare settings in separate processes.
PTXAS_OPTIONS_ENV = "CUTEATTN_PTXAS_OPTIONS"


@functools.cache
def _ptxas_options() -> str:
    return os.environ.get(PTXAS_OPTIONS_ENV, "").strip()


def compile_options(arch: str, ptxas_options: str = "") -> str:
    """``cute.compile``'s options for ``arch``, with extra ptxas options if any."""
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if ptxas_options:
        if "'" in ptxas_options:
            raise ValueError(f"{PTXAS_OPTIONS_ENV} must not contain a quote: {ptxas_options!r}")
        options += f" --ptxas-options '{ptxas_options}'"
    return options


@functools.cache
def _check_dependencies_once() -> None:
    # A failure is not cached (functools.cache keeps only returns): it is raised again next time.
    check_dependencies()


def compile_forward(plan: KernelPlan):
    """Compile (or fetch) the forward kernel for a plan.

    Call it as ``fn(q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k,
    max_seqlen_q, softmax_scale, max_ctas, tile_counter)``: ``sink`` the learnable sink's
    (heads_q,) fp32 logits of a plan with one, else None; a varlen plan's int32 cumulative
    lengths and keys used (else None) and its longest query sequence (else unused); ``max_ctas``
    is how many CTAs can be resident at once (the device's SM count), the grid of a persistent
    kernel; a runtime value, so one compiled kernel serves every SKU of an arch;
    ``tile_counter`` a zeroed (1,) int32 tensor where the family ``uses_tile_counter``, else
    None.
    """
    if plan.kind != "forward":
        raise ValueError(f"not a forward plan: {plan}")
    return _compile(plan, lambda family, cutlass: (
        *family.fake_forward_args(plan), cutlass.Float32(1.0), cutlass.Int32(1),
        family.fake_tile_counter(plan),
    ))


def compile_backward(plan: KernelPlan):
    """Compile (or fetch) the main backward kernel for a plan.

    Call it as ``fn(q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv, semaphore, cu_seqlens_q,
    cu_seqlens_k, seqused_k, max_seqlen_k, softmax_scale)``: ``semaphore`` is the int32
    counters of a plan whose family ``dq_counters`` (deterministic turns, or claims), else
    None; the varlen bookkeeping of a varlen plan, else None (and 0)
    (``cuteattn.ops.launch_backward`` prepares the buffers).
    """
    if plan.kind != "backward":
        raise ValueError(f"not a backward plan: {plan}")
    return _compile(plan, lambda family, cutlass: (
        *family.fake_backward_args(plan), cutlass.Float32(1.0)
    ))


def compile_backward_preprocess(arch: str, dtype: str, head_dim: int, varlen_rows_tile: int = 0):
    """Compile (or fetch) the backward preprocess (``kernels/bwd_preprocess.py``), one per
    (arch, dtype, head_dim, varlen_rows_tile). Call it as ``fn(out, dout, lse, lse_log2, dpsum,
    cu_seqlens_q, max_seqlen_q)`` (varlen_rows_tile 0: a fixed-length batch, None and 0)."""

    def build():
        from cuteattn.kernels.bwd_preprocess import BackwardPreprocess, preprocess_fake_args
        from cuteattn.kernels.common.compile_args import dsl_dtype

        kernel = BackwardPreprocess(
            dtype=dsl_dtype(dtype), head_dim=head_dim, varlen_rows_tile=varlen_rows_tile,
            launches_dependents=arch_from_name(arch).pdl,
        )
        return kernel, preprocess_fake_args(
            dsl_dtype(dtype), head_dim, varlen=varlen_rows_tile > 0
        )

    key = ("backward preprocess", arch, dtype, head_dim, varlen_rows_tile)
    return _cached_compile(key, arch, build)


def compile_dq_postprocess(
    arch: str, dtype: str, head_dim: int, kernel_dim: int, chunks: int, row_pad: int,
    varlen_rows_tile: int = 0, zero_kv_dims: tuple[int, int] | None = None,
    fragment_order: tuple | None = None,
):
    """Compile (or fetch) the backward's dq postprocess (``kernels/bwd_postprocess.py``): dq's
    head_dim and dtype, the plan's kernel head dim, dq_accum's (chunks, row_pad), and a packed
    batch's tile_m (0: a fixed-length batch) and, packed, dk's and dv's (head_dim, dim_v) when
    it zeroes their rows past the last sequence too; ``fragment_order`` (family name, then
    that family's layout): dq_accum's query tiles in a backward's fragment order
    (``KernelFamily.dq_accum_fragment_order``; the family builds the kernel), else plain rows.
    Call it as ``fn(dq_accum, dq,
    cu_seqlens_q, max_seqlen_q, softmax_scale, dk, dv, cu_seqlens_k)`` (fixed-length: None, 0;
    dk, dv, cu_seqlens_k None unless zero_kv_dims; packed tensors as (1, total, heads, dim))."""

    def build():
        from cuteattn.kernels.bwd_postprocess import DqPostprocess, postprocess_fake_args
        from cuteattn.kernels.common.compile_args import dsl_dtype

        if fragment_order is None:
            kernel = DqPostprocess(
                dtype=dsl_dtype(dtype), head_dim=head_dim, kernel_dim=kernel_dim, chunks=chunks,
                rows_tile=varlen_rows_tile,
            )
        else:
            kernel = get_family(fragment_order[0]).fragment_dq_postprocess(
                fragment_order[1:], dtype=dsl_dtype(dtype), head_dim=head_dim,
                kernel_dim=kernel_dim, rows_tile=varlen_rows_tile,
            )
        fake_args = postprocess_fake_args(
            dsl_dtype(dtype), head_dim, kernel_dim, chunks, row_pad,
            varlen=varlen_rows_tile > 0, zero_kv_dims=zero_kv_dims,
        )
        return kernel, fake_args

    key = (
        "dq postprocess", arch, dtype, head_dim, kernel_dim, chunks, row_pad, varlen_rows_tile,
        zero_kv_dims, fragment_order,
    )
    return _cached_compile(key, arch, build)


def _compile(plan: KernelPlan, fake_args):
    def build():
        import cutlass

        family = get_family(plan.family)
        if not family.can_implement(plan, arch_from_name(plan.arch)):
            raise ValueError(f"kernel family {plan.family!r} cannot implement {plan}")
        return family.kernel(plan), fake_args(family, cutlass)

    return _cached_compile(plan, plan.arch, build)


def _cached_compile(key, arch: str, build):
    """The compiled kernel of ``key``, or compile it once: ``build()`` (called after the
    dependency check, so it may import the DSL) returns the kernel object and its fake
    arguments; the stream is torch's current one, through TVM-FFI."""
    fn = _compiled.get(key)
    if fn is None:
        _check_dependencies_once()
        import cutlass.cute as cute

        kernel, fake_args = build()
        start = time.perf_counter()
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(
            kernel, *fake_args, stream, options=compile_options(arch, _ptxas_options())
        )
        _compiled[key] = fn
        log.info("compiled %s in %.1f s", key, time.perf_counter() - start)
    return fn
