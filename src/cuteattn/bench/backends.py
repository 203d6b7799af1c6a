"""One adapter per attention backend, all fed the same tensors.

Every adapter is loaded by name (with the run's score options: ``softcap``, ``window``) and yields a
binder: ``bind(q, k, v, causal)`` returns a zero-argument call that runs one forward pass; a
backend without an option raises ValueError at bind time (that row skips it). Binding happens outside the timed region, so any
per-shape setup (views, keyword plumbing) is not measured. Inputs always arrive in the flash-attn
layout (batch, seqlen, heads, dim); k and v may have fewer heads than q (GQA / MQA).

Libraries are imported only when an adapter is loaded: listing or rejecting backend names must
work on machines without the CuTe DSL, flash-attn or a GPU. ``cuteattn`` is the planner's
choice; ``cuteattn-<family>`` forces one kernel family (one backend per registered family).
"""

from __future__ import annotations

from typing import Callable

import torch

AttentionCall = Callable[[], torch.Tensor]
Binder = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], AttentionCall]


class UnknownBackendError(ValueError):
    """Raised when the user names a backend this benchmark does not know."""


def _cuteattn_loader(
    deterministic: bool = False, family: str | None = None
) -> Callable[..., Binder]:
    """cuteattn: the planner's choice through flash_attn_func, or with ``family`` one kernel
    family forced (``api.forward(family=...)``), so families can be timed side by side on one
    GPU; a family that cannot run a shape is skipped there."""

    def load(softcap: float = 0.0, window: tuple[int, int] = (-1, -1)) -> Binder:
        import cuteattn  # late: keeps listing backends cheap; compiling pulls in the CuTe DSL
        from cuteattn import api

        def bind(q, k, v, causal, varlen=None):
            options = dict(causal=causal, window_size=window, softcap=softcap)
            if varlen is not None:
                cu_seqlens, longest = varlen
                return lambda: cuteattn.flash_attn_varlen_func(
                    q, k, v, cu_seqlens, cu_seqlens, longest, longest, **options,
                    deterministic=deterministic, family=family,
                )
            if family is not None:
                return lambda: api.forward(
                    q, k, v, **options, family=family, return_lse=False,
                    deterministic=deterministic,
                )[0]
            return lambda: cuteattn.flash_attn_func(
                q, k, v, **options, deterministic=deterministic
            )

        return bind

    return load


def _sdpa_loader(sdp_backend: str) -> Callable[..., Binder]:
    def load(softcap: float = 0.0, window: tuple[int, int] = (-1, -1)) -> Binder:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention

        backend = getattr(SDPBackend, sdp_backend)

        def bind(q, k, v, causal, varlen=None):
            if varlen is not None:
                raise ValueError("SDPA takes no packed varlen batch")
            if softcap:
                raise ValueError("SDPA has no softcap")
            if tuple(window) != (-1, -1):
                raise ValueError("SDPA's flash / cuDNN kernels take no local window here")
            # SDPA expects (batch, heads, seqlen, dim); transposed views avoid copies, and the
            # kernel pin makes SDPA raise instead of silently falling back to another kernel.
            # Fewer k/v heads than q heads (GQA / MQA) needs enable_gqa (torch >= 2.5); it is
            # passed only then, so MHA rows also run on older torch.
            if causal and q.shape[1] != k.shape[1]:
                # SDPA's is_causal aligns the diagonal top-left; flash-attn's is bottom-right.
                raise ValueError("SDPA's causal mask differs when seqlen_q != seqlen_k")
            q_t, k_t, v_t = (t.transpose(1, 2) for t in (q, k, v))
            gqa = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}

            def call():
                with sdpa_kernel(backend):
                    return scaled_dot_product_attention(q_t, k_t, v_t, is_causal=causal, **gqa)

            return call

        return bind

    return load


def _fa4_loader(deterministic: bool = False) -> Callable[..., Binder]:
    def load(softcap: float = 0.0, window: tuple[int, int] = (-1, -1)) -> Binder:
        from flash_attn.cute import flash_attn_func

        # Only asked for when set: FA4 releases without the keyword still load.
        flags = {"deterministic": True} if deterministic else {}
        if softcap:
            flags["softcap"] = softcap
        if tuple(window) != (-1, -1):
            flags["window_size"] = tuple(None if bound == -1 else bound for bound in window)

        def bind(q, k, v, causal, varlen=None):
            # FA4 takes fewer k/v heads than q heads (GQA / MQA) as they are.
            def call():
                if varlen is not None:
                    from flash_attn.cute import flash_attn_varlen_func

                    cu_seqlens, longest = varlen
                    out = flash_attn_varlen_func(
                        q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                        max_seqlen_q=longest, max_seqlen_k=longest, causal=causal, **flags,
                    )
                else:
                    out = flash_attn_func(q, k, v, causal=causal, **flags)
                # Some FA4 releases return (out, lse).
                return out[0] if isinstance(out, tuple) else out

            return call

        return bind

    return load


def _family_loaders() -> dict[str, Callable[..., Binder]]:
    # The family registry is plain Python (no DSL import), so listing it here stays cheap.
    from cuteattn.plan import family_names

    loaders = {}
    for name in family_names():
        loaders[f"cuteattn-{name}"] = _cuteattn_loader(family=name)
        loaders[f"cuteattn-{name}{DETERMINISTIC_SUFFIX}"] = _cuteattn_loader(
            family=name, deterministic=True
        )
    return loaders


# The deterministic variants differ in the backward only (``--mode bwd``): next to their plain
# runs they give the cost of deterministic=True per row.
DETERMINISTIC_SUFFIX = "-deterministic"
LOADERS: dict[str, Callable[..., Binder]] = {
    "cuteattn": _cuteattn_loader(),
    "sdpa-flash": _sdpa_loader("FLASH_ATTENTION"),
    "sdpa-cudnn": _sdpa_loader("CUDNN_ATTENTION"),
    "fa4": _fa4_loader(),
    "cuteattn" + DETERMINISTIC_SUFFIX: _cuteattn_loader(deterministic=True),
    "fa4" + DETERMINISTIC_SUFFIX: _fa4_loader(deterministic=True),
    **_family_loaders(),
}
BACKEND_NAMES: tuple[str, ...] = tuple(LOADERS)
# What runs without --backends: the planner's choice and the peers. Per-family backends
# (cuteattn-sm80, ...) are asked for by name.
DEFAULT_BACKENDS: tuple[str, ...] = ("cuteattn", "sdpa-flash", "sdpa-cudnn", "fa4")


def backward_binder(bind: Binder) -> Binder:
    """A binder whose call runs the backward of ``bind``'s forward: the forward is recorded
    once at bind time (inputs that require grad), each call computes dq, dk, dv for a fixed
    random dout through autograd (the graph retained)."""

    def bind_backward(q, k, v, causal, **extra):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out = bind(*leaves, causal, **extra)()
        dout = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)

    return bind_backward


def parse_backend_names(spec: str) -> list[str]:
    """Split a comma-separated backend list, keeping the user's order and dropping repeats."""
    names = list(dict.fromkeys(name.strip() for name in spec.split(",") if name.strip()))
    valid = ", ".join(BACKEND_NAMES)
    unknown = [name for name in names if name not in LOADERS]
    if unknown:
        raise UnknownBackendError(f"unknown backend(s): {', '.join(unknown)}; valid names: {valid}")
    if not names:
        raise UnknownBackendError(f"no backend named; valid names: {valid}")
    return names


def load_backend(
    name: str, *, softcap: float = 0.0, window: tuple[int, int] = (-1, -1)
) -> Binder:
    """Import the backend's library and return its binder for the run's score options
    (``softcap``: 0 is off; ``window``: flash-attn's window_size, -1 unbounded); import errors
    propagate."""
    return LOADERS[name](softcap=softcap, window=window)


def one_line(exc: BaseException) -> str:
    """The exception type and the first line of its message, for a compact 'unavailable' note."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
