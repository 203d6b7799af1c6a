"""Public entry points with flash-attn's argument names and (batch, seqlen, heads, dim) layout.

Normalise arguments -> validate -> plan -> ops. No DSL code here.
"""

import torch

from cuteattn import ops, validate
from cuteattn.plan import Problem, plan_forward
from cuteattn.runtime.arch import device_arch


def _requires_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def resolve_causal(causal, window_size) -> bool:
    """The causal flag implied by (causal, window_size); local windows are not supported yet.

    As in flash-attn, causal forces the right bound to 0, and a window unbounded on the left
    and closed at the diagonal, (-1, 0), is the causal mask.
    """
    left, right = validate.check_window(window_size)
    if causal:
        right = 0
    if (left, right) == (-1, 0):
        return True
    if (left, right) == (-1, -1):
        return False
    raise NotImplementedError(
        f"window_size {tuple(window_size)} (local attention) is not supported by any kernel yet"
    )


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    window_size=(None, None),
    softcap=0.0,
    return_lse=False,
    out=None,
):
    """Exact attention softmax(q k^T * softmax_scale) v.

    q: (batch, seqlen_q, heads_q, dim); k, v: (batch, seqlen_k, heads_kv, dim), fp16 or bf16 on
    one CUDA device; heads_q a multiple of heads_kv (GQA / MQA). ``causal`` aligns the mask to
    the bottom-right corner when seqlen_q != seqlen_k. ``window_size=(left, right)``, None or
    -1 meaning unbounded. ``out``, if given, receives the result. Returns out, or (out, lse)
    with ``return_lse``; lse is (batch, heads_q, seqlen_q) fp32, natural log. Rows that see no
    key get out = 0 and lse = -inf.
    """
    validate.check_forward(q, k, v, out)
    validate.check_scalars(softmax_scale, softcap)
    causal = resolve_causal(causal, window_size)
    if softcap != 0.0:
        raise NotImplementedError("softcap is not supported by any kernel yet")
    validate.check_devices(q, k, v, out)
    if _requires_grad(q, k, v):
        raise NotImplementedError(
            "the backward pass is not implemented yet; call under torch.no_grad() or detach q/k/v"
        )
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5

    q, k, v = (validate.kernel_ready(x) for x in (q, k, v))
    batch, seqlen_q, heads_q, dim = q.shape
    problem = Problem(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=k.shape[1],
        heads_q=heads_q,
        heads_kv=k.shape[2],
        head_dim=dim,
        head_dim_v=v.shape[3],
        dtype=validate.DTYPES[q.dtype],
        causal=causal,
        arch=device_arch(q.device),
    )
    out, lse = ops.forward(q, k, v, out, float(softmax_scale), plan_forward(problem))
    return (out, lse) if return_lse else out
