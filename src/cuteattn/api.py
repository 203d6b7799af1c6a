"""Public entry points with flash-attn's argument names and (batch, seqlen, heads, dim) layout.

Normalise arguments -> validate -> ops. No DSL code here. ``forward`` is the internal entry
that ``flash_attn_func`` calls; tests and the benchmark call it to force a kernel family or run
an explicit plan.

The work goes through one custom op, ``torch.ops.cuteattn.forward`` (cuteattn.ops), which
plans inside; torch.compile traces the code here on fake tensors (``fullgraph=True`` holds)
and records that op. An explicit ``plan=`` cannot cross the op's schema: it is checked here
and launched directly. Both overrides of ``forward`` (``family=``, ``plan=``) are for eager
calls: checking a family name loads the family modules, which dynamo does not trace.
"""

import torch

from cuteattn import ops, validate
from cuteattn.plan import KernelPlan, check_plan, get_family, plan_backward


def _requires_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _reject_unsupported(*, dropout_p, softcap, alibi_slopes, return_attn_probs):
    """NotImplementedError, naming the argument, for a well-formed option no kernel has yet."""
    if dropout_p != 0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: dropout is not supported by any kernel yet; pass 0.0"
        )
    if softcap != 0.0:
        raise NotImplementedError("softcap is not supported by any kernel yet")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes is not supported by any kernel yet; pass None")
    if return_attn_probs:
        raise NotImplementedError(
            "return_attn_probs=True is not supported (no kernel writes the attention "
            "probabilities); for the lse, pass return_lse=True, which returns (out, lse)"
        )


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
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    return_lse=False,
    out=None,
):
    """Exact attention softmax(q k^T * softmax_scale) v, in flash-attn 2's argument order.

    q: (batch, seqlen_q, heads_q, dim); k, v: (batch, seqlen_k, heads_kv, dim), fp16 or bf16 on
    one CUDA device; heads_q a multiple of heads_kv (GQA / MQA).

    The positional order is flash-attn 2's, so ``flash_attn_func(q, k, v, 0.0)`` passes
    dropout_p, not softmax_scale. ``return_lse`` and ``out`` are keyword-only.

    - ``dropout_p``: a real number in [0, 1); only 0.0 is supported (NotImplementedError else).
    - ``softmax_scale`` (> 0) defaults to dim ** -0.5.
    - ``causal`` (a Python bool, as every flag here) aligns the mask to the bottom-right
      corner when seqlen_q != seqlen_k.
    - ``window_size=(left, right)``, None or -1 meaning unbounded; (-1, 0) is the causal mask.
      Local windows are not supported yet (NotImplementedError).
    - ``softcap``: >= 0; only 0.0 (off) is supported yet.
    - ``alibi_slopes``: only None is supported (NotImplementedError else).
    - ``deterministic``: the forward is deterministic already (each output row is reduced in
      one fixed order, no atomics); ``True`` makes the backward bitwise reproducible too (the
      key tiles add their dq terms in a fixed order, waiting their turn).
    - ``return_attn_probs``: only False; flash-attn 2 returns (out, softmax_lse, S_dmask) with
      it. Ask for the lse with ``return_lse=True`` instead.
    - ``out``, if given, receives the result; it must not overlap q, k or v. With inputs that
      require grad the result is computed in a new tensor and copied into ``out``.

    Differentiable in q, k and v (not through lse): with grad enabled and an input that
    requires grad, the call records ``torch.ops.cuteattn.attention``, whose backward runs the
    backward kernels.

    Returns out, or (out, lse) with ``return_lse``; lse is (batch, heads_q, seqlen_q) fp32,
    natural log. Rows that see no key get out = 0 and lse = -inf. docs/MIGRATING.md maps
    flash-attn 2, FlashAttention-3 and FlashAttention-4 calls to this one.
    """
    validate.check_flag("return_lse", return_lse)
    out, lse = forward(
        q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        deterministic=deterministic, return_attn_probs=return_attn_probs, out=out,
    )
    return (out, lse) if return_lse else out


def forward(
    q,
    k,
    v,
    *,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    out=None,
    family: str | None = None,
    plan: KernelPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flash_attn_func``'s work, returning (out, lse); for tests and benchmarks.

    Takes flash_attn_func's options by keyword, and checks them in the same order: every
    TypeError / ValueError (tensors, then scalars and flags) before any NotImplementedError.

    ``family`` forces a kernel family by name (NotImplementedError if it cannot run the
    problem on this device); ``plan`` runs an explicit KernelPlan, which must match the inputs
    (dtype, head dim, causal, the device's arch) and be implementable by its family. Both are
    read at call time; give at most one.
    """
    validate.check_forward(q, k, v, out)
    validate.check_dropout(dropout_p)
    validate.check_scalars(softmax_scale, softcap)
    validate.check_flag("causal", causal)
    validate.check_flag("deterministic", deterministic)
    validate.check_flag("return_attn_probs", return_attn_probs)
    causal = resolve_causal(causal, window_size)
    _reject_unsupported(
        dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes,
        return_attn_probs=return_attn_probs,
    )
    if family is not None and plan is not None:
        raise ValueError("give family or plan, not both (a plan names its family)")
    # Unknown names and wrong types are reported before the device check.
    if family is not None:
        get_family(family)
    if plan is not None and not isinstance(plan, KernelPlan):
        raise TypeError(f"plan must be a cuteattn.plan.KernelPlan, got {type(plan).__name__}")
    validate.check_devices(q, k, v, out)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5

    softmax_scale = float(softmax_scale)
    if _requires_grad(q, k, v):
        if plan is not None:
            raise NotImplementedError(
                "an explicit plan runs the forward only; call under torch.no_grad() or use "
                "backward(..., plan=) for the backward"
            )
        result, lse = ops.attention(q, k, v, softmax_scale, causal, family, deterministic)
        if out is None:
            return result, lse
        validate.check_out_memory(out, q, k, v)
        out.copy_(result)
        return out, lse
    if plan is not None and not ops.has_no_work(q, k):
        # A KernelPlan cannot cross the op's schema: an explicit plan is launched directly.
        check_plan(plan, ops.forward_problem(q, k, v, causal=causal))
        out = _out_or_new(out, q, v)
        q, k, v = (validate.kernel_ready(x) for x in (q, k, v))
        return out, ops.launch_forward(q, k, v, out, softmax_scale, plan)
    out = _out_or_new(out, q, v)
    return out, ops.forward(q, k, v, out, softmax_scale, causal, family)


def _out_or_new(out, q, v) -> torch.Tensor:
    """The caller's out, or a new one: the op writes into out and returns only lse, so it never
    returns an alias of an input."""
    if out is not None:
        return out
    return torch.empty(ops.out_shape(q, v), dtype=q.dtype, device=q.device)


def backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    *,
    softmax_scale=None,
    causal=False,
    deterministic=False,
    family: str | None = None,
    plan: KernelPlan | None = None,
    dq=None,
    dk=None,
    dv=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention(q, k, v) -> (out, lse) for the output gradient ``dout``: the
    backward that autograd runs, as a direct call (flash-attn's ``_flash_attn_backward``).

    ``dq``, ``dk``, ``dv``, if given, receive the gradients (shapes and dtypes of q, k, v; no
    overlap with the inputs; dk and dv kernel-addressable). ``family`` forces a family with a
    backward kernel; ``plan`` runs an explicit backward plan (``kind="backward"``), which must
    match the inputs. Buffers and plans are for eager calls; the op path allocates.
    """
    validate.check_forward(q, k, v, None)
    validate.check_backward(dout, q, out, lse)
    validate.check_grad_buffers(q, k, v, dout, out, dq=dq, dk=dk, dv=dv)
    validate.check_scalars(softmax_scale, 0.0)
    validate.check_flag("causal", causal)
    validate.check_flag("deterministic", deterministic)
    if family is not None and plan is not None:
        raise ValueError("give family or plan, not both (a plan names its family)")
    if family is not None and not get_family(family).has_backward:
        raise NotImplementedError(f"kernel family {family!r} has no backward kernel yet")
    validate.check_devices(q, k, v, dout)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    softmax_scale = float(softmax_scale)
    buffers = dict(dq=dq, dk=dk, dv=dv)
    if ops.has_no_work(q, k):
        return ops.backward_without_kernel(q, k, v, **buffers)
    if plan is None and all(x is None for x in buffers.values()):
        return ops.backward(
            dout, q, k, v, out, lse, softmax_scale, causal, family, deterministic
        )
    problem = ops.forward_problem(q, k, v, causal=causal, deterministic=deterministic)
    if plan is None:
        plan = plan_backward(problem, family=ops.backward_family(family))
    if not isinstance(plan, KernelPlan) or plan.kind != "backward":
        raise TypeError(f"plan must be a backward KernelPlan, got {plan!r}")
    check_plan(plan, problem)
    dout, q, k, v = (validate.kernel_ready(x) for x in (dout, q, k, v))
    return ops.launch_backward(dout, q, k, v, out, lse, softmax_scale, plan, **buffers)
