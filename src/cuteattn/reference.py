"""Reference (oracle) attention in plain PyTorch.

This module is the numerical ground truth the kernels are tested against. It is pure
``torch`` (no other dependency), runs on whatever device its inputs live on (CPU or CUDA),
and by default computes everything in float32.

Conventions (the flash-attn ones)
---------------------------------
Layouts
    Non-varlen: ``q`` is ``(batch, seqlen_q, heads_q, dim)``, ``k`` is
    ``(batch, seqlen_k, heads_kv, dim)``, ``v`` is ``(batch, seqlen_k, heads_kv, dim_v)``.
    The result is ``out`` of shape ``(batch, seqlen_q, heads_q, dim_v)`` and ``lse`` of shape
    ``(batch, heads_q, seqlen_q)``.

    Varlen (``cu_seqlens_q`` and ``cu_seqlens_k`` given, both or neither): the sequences are
    packed along the first axis. ``q`` is ``(total_q, heads_q, dim)``, ``k`` is
    ``(total_k, heads_kv, dim)``, ``v`` is ``(total_k, heads_kv, dim_v)``. Sequence ``b``
    owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``. The result is ``out`` of shape
    ``(total_q, heads_q, dim_v)`` and ``lse`` of shape ``(heads_q, total_q)``. Query rows not
    covered by any sequence (beyond ``cu_seqlens_q[-1]`` or before ``cu_seqlens_q[0]``) get
    ``out = 0`` and ``lse = -inf``.

GQA / MQA
    ``heads_q`` must be a multiple of ``heads_kv``; query head ``h`` attends with kv head
    ``h // (heads_q // heads_kv)``.

seqused_k
    Optional int tensor of shape ``(batch,)``: sequence ``b`` only uses its first
    ``seqused_k[b]`` keys/values (with or without varlen). That effective length is the
    ``seqlen_k`` used for the causal / local-window alignment below.

Scores
    ``s = (q @ k^T) * softmax_scale`` with ``softmax_scale`` defaulting to ``dim ** -0.5``;
    then, if ``softcap > 0``, ``s = softcap * tanh(s / softcap)``; then masking; then
    ``out = softmax(s) @ v`` and ``lse = logsumexp(s)`` (natural log, over the visible keys).

Masking (per sequence, 0-based row ``i`` and column ``j``, ``shift = seqlen_k - seqlen_q``)
    ``causal=True`` is aligned bottom-right: ``j <= i + shift``.
    ``window_size=(left, right)``, each ``None`` or ``-1`` meaning unbounded:
    ``i + shift - left <= j <= i + shift + right``. With ``causal=True`` the right bound is
    forced to ``0`` (so ``causal=True, window_size=(left, None)`` is window ``(left, 0)``).
    A query row that sees no key gets ``out = 0`` and ``lse = -inf`` (never NaN).

Learnable sink (``learnable_sink``, float ``(heads_q,)``; gpt-oss, FlashAttention-4)
    One extra logit ``sink[h]`` per query head, in the units of the (scaled, soft-capped)
    scores, joins every row's softmax denominator and has no value row:
    ``out = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink))`` and
    ``lse = log(sum_j exp(s_j) + exp(sink))``. It is never masked: a row that sees no key gets
    ``out = 0`` and ``lse = sink[h]``. Its gradient is
    ``dsink[h] = -sum_rows exp(sink[h] - lse) * rowsum(dout * out)`` (autograd gives it here).

Precision
    ``upcast=True`` (default): ``q``, ``k``, ``v`` are converted to float32 and every step
    (both matmuls, scaling, softcap, softmax) runs in float32. ``out`` is float32.

    ``upcast=False``: measures what plain PyTorch does in low precision, like a low-precision
    kernel would: ``q @ k^T`` is computed in the input dtype (the matmul result is rounded to
    that dtype; PyTorch's own matmul settings apply), the rounded scores are converted to
    float32 and scaled, soft-capped, masked and soft-maxed in float32 (``lse`` comes from these
    float32 scores), the probabilities ``P`` are then rounded to the input dtype and
    ``P @ v`` is computed in the input dtype. ``out`` is returned in ``q.dtype``. ``q``, ``k``
    and ``v`` must share one dtype.

    ``lse`` is always float32. On CUDA, TF32 is disabled for float32 matmuls for the duration
    of the call (the previous setting is restored afterwards).

    The float32 softmax subtracts the row maximum before ``exp`` and divides by the row sum;
    ``lse = log(row sum) + row max``.

Memory
    Work is done one batch element (one sequence for varlen) at a time, so at most one
    sequence's ``(heads_q, seqlen_q, seqlen_k)`` float32 score matrix exists at once; the
    probabilities overwrite it in place unless autograd needs the intermediates.

Autograd
    The function is differentiable with respect to ``q``, ``k`` and ``v`` (for building
    backward references); when any of them requires grad the in-place updates are skipped.
    Gradients through ``lse`` of rows that see no key are not meaningful (``lse = -inf``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Sequence

import torch

from cuteattn.validate import check_window

__all__ = ["attention"]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _ieee_fp32_matmul(device: torch.device):
    """Disable TF32 for CUDA float32 matmuls inside the block; restore the setting after."""
    if device.type != "cuda":
        yield
        return
    mm = torch.backends.cuda.matmul
    try:
        prev = mm.fp32_precision  # torch >= 2.9 API
    except (AttributeError, RuntimeError):
        prev = None
    if prev is not None:
        mm.fp32_precision = "ieee"
        try:
            yield
        finally:
            mm.fp32_precision = prev
    else:  # older torch: legacy flag
        prev_flag = mm.allow_tf32
        mm.allow_tf32 = False
        try:
            yield
        finally:
            mm.allow_tf32 = prev_flag


def _visible_mask(
    seqlen_q: int,
    seqlen_k: int,
    causal: bool,
    left: Optional[int],
    right: Optional[int],
    device: torch.device,
) -> Optional[torch.Tensor]:
    """Bool (seqlen_q, seqlen_k) mask of visible keys, or None when everything is visible."""
    if causal:
        right = 0
    if left is None and right is None:
        return None
    shift = seqlen_k - seqlen_q
    row = torch.arange(seqlen_q, device=device, dtype=torch.int64).unsqueeze(1) + shift
    col = torch.arange(seqlen_k, device=device, dtype=torch.int64).unsqueeze(0)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right is not None:
        visible &= col <= row + right
    if left is not None:
        visible &= col >= row - left
    return visible


def _attend_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    left: Optional[int],
    right: Optional[int],
    softcap: float,
    upcast: bool,
    sink: Optional[torch.Tensor] = None,
):
    """One sequence. q (sq, hq, d), k (sk, hkv, d), v (sk, hkv, dv); sink float32 (hq,).

    Returns out (sq, hq, dv) in the compute dtype and lse (hq, sq) in float32.
    """
    sq, hq, d = q.shape
    sk, hkv, _ = k.shape
    dv = v.shape[-1]
    group = hq // hkv
    cdtype = torch.float32 if upcast else q.dtype
    if sk == 0:  # no key at all: every row is empty (its lse is the sink, if any)
        out = torch.zeros(sq, hq, dv, dtype=cdtype, device=q.device)
        lse = torch.full((hq, sq), float("-inf"), dtype=torch.float32, device=q.device)
        if sink is not None:
            lse = sink.unsqueeze(1).expand(hq, sq).clone()
        return out, lse
    # In-place updates of the score matrix save memory, but would break autograd.
    inplace = not (
        torch.is_grad_enabled()
        and any(t is not None and t.requires_grad for t in (q, k, v, sink))
    )

    # (hkv, group, sq, d): query head h = kv_head * group + g  <=>  kv_head = h // group
    qh = q.to(cdtype).reshape(sq, hkv, group, d).permute(1, 2, 0, 3)
    kh = k.to(cdtype).permute(1, 0, 2).unsqueeze(1)  # (hkv, 1, sk, d)
    vh = v.to(cdtype).permute(1, 0, 2).unsqueeze(1)  # (hkv, 1, sk, dv)

    s = torch.matmul(qh, kh.transpose(-1, -2))  # (hkv, group, sq, sk), in the compute dtype
    s = s.float()  # no-op for float32
    s = s.mul_(scale) if inplace else s * scale
    if softcap > 0.0:
        s = s.div_(softcap).tanh_().mul_(softcap) if inplace else torch.tanh(s / softcap) * softcap

    visible = _visible_mask(sq, sk, causal, left, right, q.device)
    if visible is not None:
        s = s.masked_fill_(~visible, float("-inf")) if inplace else s.masked_fill(~visible, float("-inf"))

    # Softmax with the row max as shift; a row with no visible key has max -inf, shift 0,
    # all exp() == 0, sum 0, lse = log(0) = -inf and probabilities 0 (denominator set to 1).
    row_max = s.detach().amax(dim=-1, keepdim=True)
    sink_logit = None
    if sink is not None:
        sink_logit = sink.reshape(hkv, group, 1, 1)  # query head h = kv_head * group + g
        row_max = torch.maximum(row_max, sink_logit.detach())
    row_max = row_max.masked_fill(torch.isneginf(row_max), 0.0)
    p = s.sub_(row_max).exp_() if inplace else torch.exp(s - row_max)
    del s
    denom = p.sum(dim=-1, keepdim=True)
    if sink_logit is not None:
        denom = denom + torch.exp(sink_logit - row_max)
    lse = (torch.log(denom) + row_max).squeeze(-1)  # (hkv, group, sq)
    denom = denom.masked_fill(denom == 0, 1.0)
    p = p.div_(denom) if inplace else p / denom

    out = torch.matmul(p.to(cdtype), vh)  # (hkv, group, sq, dv)
    out = out.permute(2, 0, 1, 3).reshape(sq, hq, dv)
    return out, lse.reshape(hq, sq)


def _as_int_list(t: torch.Tensor, name: str) -> list:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    return [int(x) for x in t.tolist()]


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[Optional[int]] = (None, None),
    softcap: float = 0.0,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    upcast: bool = True,
    learnable_sink: Optional[torch.Tensor] = None,
):
    """Reference attention; returns ``(out, lse)``. See the module docstring for conventions.

    Args:
        q, k, v: ``(batch, seqlen, heads, dim)`` tensors, or ``(total, heads, dim)`` packed
            tensors when ``cu_seqlens_q`` / ``cu_seqlens_k`` are given.
        softmax_scale: multiplier of ``q @ k^T``; default ``dim ** -0.5``.
        causal: bottom-right aligned causal mask.
        window_size: ``(left, right)``, each ``None`` or ``-1`` for unbounded.
        softcap: if ``> 0``, scores become ``softcap * tanh(scores / softcap)``.
        cu_seqlens_q, cu_seqlens_k: int tensors of length ``batch + 1`` (both or neither).
        seqused_k: int tensor ``(batch,)``; sequence ``b`` uses its first ``seqused_k[b]`` keys.
        upcast: compute in float32 (True) or in the input dtype (False); see module docstring.
        learnable_sink: float ``(heads_q,)``, one extra softmax logit per query head (module
            docstring); differentiable.

    Returns:
        ``out``: ``(batch, seqlen_q, heads_q, dim_v)`` (varlen: ``(total_q, heads_q, dim_v)``),
        float32 if ``upcast`` else ``q.dtype``.
        ``lse``: float32 ``(batch, heads_q, seqlen_q)`` (varlen: ``(heads_q, total_q)``).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not upcast and not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"upcast=False needs q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (both or neither)")
    varlen = cu_seqlens_q is not None

    expected_rank = 3 if varlen else 4
    layout = "(total, heads, dim)" if varlen else "(batch, seqlen, heads, dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != expected_rank:
            raise ValueError(
                f"{name} must have rank {expected_rank} {layout}"
                f"{' for varlen' if varlen else ''}, got shape {tuple(t.shape)}"
            )

    heads_q, dim = q.shape[-2], q.shape[-1]
    heads_kv, dim_k = k.shape[-2], k.shape[-1]
    if dim_k != dim:
        raise ValueError(f"q and k head dims differ: {dim} vs {dim_k}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"k and v must agree on all but the last axis, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    dim_v = v.shape[-1]
    if not varlen and q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k batch sizes differ: {q.shape[0]} vs {k.shape[0]}")

    if window_size is None:
        window_size = (None, None)
    # -1 (unbounded) -> None for the mask builder.
    left, right = (None if b == -1 else b for b in check_window(window_size))

    scale = float(dim ** -0.5) if softmax_scale is None else float(softmax_scale)
    softcap = float(softcap) if softcap is not None else 0.0
    if math.isnan(softcap) or softcap < 0.0:
        raise ValueError(f"softcap must be >= 0, got {softcap}")

    device = q.device
    out_dtype = torch.float32 if upcast else q.dtype
    sink = None
    if learnable_sink is not None:
        if not isinstance(learnable_sink, torch.Tensor) or not learnable_sink.dtype.is_floating_point:
            raise ValueError("learnable_sink must be a floating-point tensor of shape (heads_q,)")
        if tuple(learnable_sink.shape) != (heads_q,):
            raise ValueError(
                f"learnable_sink must have shape ({heads_q},) (heads_q), "
                f"got {tuple(learnable_sink.shape)}"
            )
        sink = learnable_sink.to(device=device, dtype=torch.float32)

    if varlen:
        cuq = _as_int_list(cu_seqlens_q, "cu_seqlens_q")
        cuk = _as_int_list(cu_seqlens_k, "cu_seqlens_k")
        if len(cuq) != len(cuk) or len(cuq) < 1:
            raise ValueError(
                f"cu_seqlens_q and cu_seqlens_k must have the same length batch + 1 >= 1, "
                f"got {len(cuq)} and {len(cuk)}"
            )
        for name, cu, total in (("cu_seqlens_q", cuq, q.shape[0]), ("cu_seqlens_k", cuk, k.shape[0])):
            if cu[0] < 0 or any(b < a for a, b in zip(cu, cu[1:])):
                raise ValueError(f"{name} must be non-negative and non-decreasing, got {cu}")
            if cu[-1] > total:
                raise ValueError(f"{name}[-1] = {cu[-1]} exceeds the packed length {total}")
        batch = len(cuq) - 1
    else:
        batch = q.shape[0]

    used = None
    if seqused_k is not None:
        used = _as_int_list(seqused_k, "seqused_k")
        if len(used) != batch:
            raise ValueError(f"seqused_k must have shape ({batch},), got {tuple(seqused_k.shape)}")

    if varlen:
        out = torch.zeros(q.shape[0], heads_q, dim_v, dtype=out_dtype, device=device)
        lse = torch.full((heads_q, q.shape[0]), float("-inf"), dtype=torch.float32, device=device)
    else:
        out = torch.empty(batch, q.shape[1], heads_q, dim_v, dtype=out_dtype, device=device)
        lse = torch.empty(batch, heads_q, q.shape[1], dtype=torch.float32, device=device)

    with _ieee_fp32_matmul(device):
        for b in range(batch):
            if varlen:
                q_lo, q_hi = cuq[b], cuq[b + 1]
                k_lo, k_hi = cuk[b], cuk[b + 1]
                qb = q[q_lo:q_hi]
            else:
                k_lo, k_hi = 0, k.shape[1]
                qb = q[b]
            if used is not None:
                n = used[b]
                if n < 0 or n > k_hi - k_lo:
                    raise ValueError(
                        f"seqused_k[{b}] = {n} is outside [0, {k_hi - k_lo}] "
                        f"(the keys available to sequence {b})"
                    )
                k_hi = k_lo + n
            if varlen:
                kb, vb = k[k_lo:k_hi], v[k_lo:k_hi]
            else:
                kb, vb = k[b, k_lo:k_hi], v[b, k_lo:k_hi]

            ob, lb = _attend_one(qb, kb, vb, scale, causal, left, right, softcap, upcast, sink)
            if varlen:
                out[q_lo:q_hi] = ob
                lse[:, q_lo:q_hi] = lb
            else:
                out[b] = ob
                lse[b] = lb
    return out, lse
