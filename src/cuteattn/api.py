"""Public entry points with flash-attn's argument names and (batch, seqlen, heads, dim) layout.

Normalise arguments -> validate -> ops. No DSL code here. ``forward`` is the internal entry
that ``flash_attn_func`` calls; tests and the benchmark call it to force a kernel family or run
an explicit plan.

The work goes through one custom op per call (cuteattn.ops), which plans inside:
``torch.ops.cuteattn.inference`` (functional) for a call that records no gradient and gives no
``out``, ``torch.ops.cuteattn.forward`` for one that gives ``out``, ``attention`` for one that
records a gradient; torch.compile traces the code here on fake tensors (``fullgraph=True``
holds) and records that op. An explicit ``plan=`` cannot cross the op's schema: it is checked here
and launched directly. Both overrides of ``forward`` (``family=``, ``plan=``) are for eager
calls: checking a family name loads the family modules, which dynamo does not trace.
"""

import torch

from cuteattn import ops, validate
from cuteattn.plan import KernelPlan, check_plan, get_family, plan_backward


def _requires_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _reject_unsupported(*, dropout_p, alibi_slopes, return_attn_probs):
    """NotImplementedError, naming the argument, for a well-formed option no kernel has yet."""
    if dropout_p != 0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: dropout is not supported by any kernel yet; pass 0.0"
        )
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes is not supported by any kernel yet; pass None")
    if return_attn_probs:
        raise NotImplementedError(
            "return_attn_probs=True is not supported (no kernel writes the attention "
            "probabilities); for the lse, pass return_lse=True, which returns (out, lse)"
        )


def _check_options(
    dropout_p, softmax_scale, softcap, causal, window_size, deterministic, alibi_slopes,
    return_attn_probs,
) -> tuple[bool, int, int]:
    """The options flash_attn_func and flash_attn_varlen_func share: types and ranges first
    (ValueError / TypeError), then what no kernel has (NotImplementedError); returns the mask
    as ``resolve_mask`` does."""
    validate.check_dropout(dropout_p)
    validate.check_scalars(softmax_scale, softcap)
    validate.check_flag("causal", causal)
    validate.check_flag("deterministic", deterministic)
    validate.check_flag("return_attn_probs", return_attn_probs)
    mask = resolve_mask(causal, window_size)
    _reject_unsupported(
        dropout_p=dropout_p, alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs
    )
    return mask


def resolve_mask(causal, window_size) -> tuple[bool, int, int]:
    """(causal, window_left, window_right) implied by (causal, window_size), -1 unbounded.

    As in flash-attn, causal forces the right bound to 0, and a window unbounded on the left
    and closed at the diagonal, (-1, 0), is the causal mask: it comes back as causal with no
    window, (True, -1, -1); a local window comes back as (False, left, right).
    """
    left, right = validate.check_window(window_size)
    if causal:
        right = 0
    if (left, right) == (-1, 0):
        return True, -1, -1
    return False, left, right


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
    learnable_sink=None,
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
      Row i sees keys i + s - left .. i + s + right (s = seqlen_k - seqlen_q); key tiles
      wholly outside the window are skipped, forward and backward.
    - ``softcap``: >= 0; > 0 makes the scores softcap * tanh(scores / softcap) (Gemma 2),
      forward and backward, in both families (each value compiles its own kernels).
    - ``alibi_slopes``: only None is supported (NotImplementedError else).
    - ``deterministic``: the forward is deterministic already (each output row is reduced in
      one fixed order, no atomics); ``True`` makes the backward bitwise reproducible too (the
      key tiles add their dq terms in a fixed order, waiting their turn).
    - ``return_attn_probs``: only False; flash-attn 2 returns (out, softmax_lse, S_dmask) with
      it. Ask for the lse with ``return_lse=True`` instead.
    - ``out``, if given, receives the result; it must not overlap q, k or v. With inputs that
      require grad the result is computed in a new tensor and copied into ``out``.
    - ``learnable_sink`` (keyword-only, as FlashAttention-4's): None, or (heads_q,) fp32 on the
      device of q: one extra logit per query head in every row's softmax denominator, with no
      value row (gpt-oss). Rows that see no key then get out = 0 and lse = the sink.

    Differentiable in q, k, v and learnable_sink (not through lse): with grad enabled and an
    input that requires grad, the call records ``torch.ops.cuteattn.attention``, whose backward
    runs the backward kernels.

    Returns out, or (out, lse) with ``return_lse``; lse is (batch, heads_q, seqlen_q) fp32,
    natural log. Rows that see no key get out = 0 and lse = -inf. docs/MIGRATING.md maps
    flash-attn 2, FlashAttention-3 and FlashAttention-4 calls to this one.
    """
    validate.check_flag("return_lse", return_lse)
    out, lse = forward(
        q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        deterministic=deterministic, return_attn_probs=return_attn_probs, out=out,
        learnable_sink=learnable_sink, return_lse=return_lse,
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
    learnable_sink=None,
    family: str | None = None,
    plan: KernelPlan | None = None,
    return_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``flash_attn_func``'s work, returning (out, lse); for tests and benchmarks.

    ``return_lse`` False: the caller drops lse (it is then None), so a call that records no
    gradient and gives no ``out`` has its kernel write none; an explicit ``plan`` decides that
    itself (one with ("lse", False) needs ``return_lse=False``).

    Takes flash_attn_func's options by keyword, and checks them in the same order: every
    TypeError / ValueError (tensors, then scalars and flags) before any NotImplementedError.

    ``family`` forces a kernel family by name (NotImplementedError if it cannot run the
    problem on this device); ``plan`` runs an explicit KernelPlan, which must match the inputs
    (dtype, head dim, causal, the device's arch) and be implementable by its family. Both are
    read at call time; give at most one.
    """
    validate.check_forward(q, k, v, out)
    validate.check_sink(learnable_sink, q)
    causal, window_left, window_right = _check_options(
        dropout_p, softmax_scale, softcap, causal, window_size, deterministic, alibi_slopes,
        return_attn_probs,
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
    if _requires_grad(q, k, v, learnable_sink):
        if plan is not None:
            raise NotImplementedError(
                "an explicit plan runs the forward only; call under torch.no_grad() or use "
                "backward(..., plan=) for the backward"
            )
        result, lse = ops.attention(
            q, k, v, softmax_scale, causal, window_left, window_right, softcap, learnable_sink,
            family, deterministic,
        )
        if out is None:
            return result, lse
        validate.check_out_memory(out, q, k, v)
        out.copy_(result)
        return out, lse
    if plan is not None and not ops.has_no_work(q, k):
        # A KernelPlan cannot cross the op's schema: an explicit plan is launched directly.
        if return_lse and plan.option("lse", True) is False:
            raise ValueError(
                "plan writes no lse (its option ('lse', False)): pass return_lse=False, or a "
                "plan without that option"
            )
        problem = ops.forward_problem(
            q, k, v, causal=causal, window_left=window_left, window_right=window_right,
            softcap=softcap, sink=learnable_sink is not None,
        )
        check_plan(plan, problem)
        out = _out_or_new(out, q, v)
        q, k, v = (validate.kernel_ready(x) for x in (q, k, v))
        lse = ops.launch_forward(q, k, v, out, softmax_scale, plan, learnable_sink)
        return out, (lse if return_lse else None)
    if out is None:
        out, lse = ops.eager_call(
            ops.inference, q, k, v, softmax_scale, causal, window_left, window_right, softcap,
            learnable_sink, family, return_lse,
        )
        return out, (lse if return_lse else None)
    return out, ops.forward(
        q, k, v, out, softmax_scale, causal, window_left, window_right, softcap, learnable_sink,
        family,
    )


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
    window_size=(-1, -1),
    softcap=0.0,
    deterministic=False,
    family: str | None = None,
    plan: KernelPlan | None = None,
    dq=None,
    dk=None,
    dv=None,
    learnable_sink=None,
) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of attention(q, k, v) -> (out, lse) for the output gradient ``dout``: the
    backward that autograd runs, as a direct call (flash-attn's ``_flash_attn_backward``).
    With the forward's ``learnable_sink``: (dq, dk, dv, dsink), dsink fp32 (heads_q,).

    ``dq``, ``dk``, ``dv``, if given, receive the gradients (shapes and dtypes of q, k, v; no
    overlap with the inputs; dk and dv kernel-addressable). ``family`` forces a family with a
    backward kernel; ``plan`` runs an explicit backward plan (``kind="backward"``), which must
    match the inputs. Buffers and plans are for eager calls; the op path allocates.
    """
    validate.check_forward(q, k, v, None)
    validate.check_backward(dout, q, out, lse, dim_v=v.shape[3])
    validate.check_sink(learnable_sink, q)
    validate.check_grad_buffers(q, k, v, dout, out, dq=dq, dk=dk, dv=dv)
    validate.check_scalars(softmax_scale, softcap)
    validate.check_flag("causal", causal)
    validate.check_flag("deterministic", deterministic)
    causal, window_left, window_right = resolve_mask(causal, window_size)
    if family is not None and plan is not None:
        raise ValueError("give family or plan, not both (a plan names its family)")
    if family is not None and not get_family(family).has_backward:
        raise NotImplementedError(f"kernel family {family!r} has no backward kernel yet")
    validate.check_devices(q, k, v, dout)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    softmax_scale = float(softmax_scale)
    buffers = dict(dq=dq, dk=dk, dv=dv)
    grads = _backward(
        dout, q, k, v, out, lse, softmax_scale, causal, (window_left, window_right), softcap,
        deterministic, family, plan, buffers,
    )
    if learnable_sink is None:
        return grads
    return (*grads, ops.sink_grad(learnable_sink, lse, out, dout))


def _backward(
    dout, q, k, v, out, lse, softmax_scale, causal, window, softcap, deterministic, family, plan,
    buffers,
):
    """(dq, dk, dv) of validated inputs: no kernel for empty ones, the op without a plan or
    buffers, else a launch of the given or planned backward plan."""
    if ops.has_no_work(q, k):
        return ops.backward_without_kernel(q, k, v, **buffers)
    if plan is None and all(x is None for x in buffers.values()):
        return ops.backward(
            dout, q, k, v, out, lse, softmax_scale, causal, *window, softcap, family,
            deterministic,
        )
    problem = ops.forward_problem(
        q, k, v, causal=causal, window_left=window[0], window_right=window[1], deterministic=deterministic,
        softcap=softcap,
    )
    if plan is None:
        plan = plan_backward(problem, family=ops.backward_family(family))
    if not isinstance(plan, KernelPlan) or plan.kind != "backward":
        raise TypeError(f"plan must be a backward KernelPlan, got {plan!r}")
    check_plan(plan, problem)
    dout, q, k, v = (validate.kernel_ready(x) for x in (dout, q, k, v))
    return ops.launch_backward(dout, q, k, v, out, lse, softmax_scale, plan, **buffers)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    window_size=(None, None),
    softcap=0.0,
    learnable_sink=None,
    return_lse=False,
    out=None,
    *,
    dropout_p=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    family: str | None = None,
):
    """Attention over packed sequences of their own lengths (flash-attn's varlen layout).

    q: (total_q, heads_q, dim); k, v: (total_k, heads_kv, dim / dim_v); sequence b owns query
    rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] and key rows cu_seqlens_k[b] ..
    cu_seqlens_k[b + 1] (int32, length batch + 1, on q's device); max_seqlen_q / max_seqlen_k
    (host ints) bound every sequence's length: the kernels size their grids by them and assume
    them (``CUTEATTN_CHECK_INPUTS=1`` checks it, at the cost of a host sync). ``seqused_k``
    (int32, (batch,)) caps the keys of each sequence; lengths of 0 are fine. causal and window
    align bottom-right per sequence. Rows past cu_seqlens_q[-1] are not written (nor read
    into any sequence's result, whatever they hold).

    The other options are flash_attn_func's (``dropout_p``, ``alibi_slopes``, ``deterministic``
    and ``return_attn_probs`` keyword-only, as Hugging Face passes them). Returns out (total_q,
    heads_q, dim_v), or (out, lse) with ``return_lse``, lse (heads_q, total_q) fp32. Runs in
    the sm90 family on Hopper (the sm80 family elsewhere), forward and backward (inputs that
    require grad record
    ``torch.ops.cuteattn.varlen_attention``; ``deterministic=True`` makes its backward bitwise
    reproducible).
    """
    validate.check_varlen_packed(q, k, v, out)
    validate.check_sink(learnable_sink, q.unsqueeze(0))
    validate.check_varlen_args(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k)
    validate.check_flag("return_lse", return_lse)
    causal, window_left, window_right = _check_options(
        dropout_p, softmax_scale, softcap, causal, window_size, deterministic, alibi_slopes,
        return_attn_probs,
    )
    if seqused_q is not None:
        raise NotImplementedError("seqused_q is not supported yet; pass None")
    if family is not None:
        get_family(family)
    validate.check_devices(q, k, v, out)
    validate.check_varlen_devices(
        q, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
    )
    validate.check_varlen_contents(
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k
    )
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if _requires_grad(q, k, v, learnable_sink):
        result, lse = ops.varlen_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q),
            int(max_seqlen_k), float(softmax_scale), causal, window_left, window_right, softcap,
            learnable_sink, family, deterministic,
        )
        if out is not None:
            validate.check_out_memory(out, q, k, v)
            out.copy_(result)
            result = out
        return (result, lse) if return_lse else result
    if out is None:
        out, lse = ops.eager_call(
            ops.varlen_inference, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
            int(max_seqlen_q), int(max_seqlen_k), float(softmax_scale), causal, window_left,
            window_right, softcap, learnable_sink, family, return_lse,
        )
        return (out, lse) if return_lse else out
    lse = ops.varlen_forward(
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q),
        int(max_seqlen_k), float(softmax_scale), causal, window_left, window_right, softcap,
        learnable_sink, family,
    )
    return (out, lse) if return_lse else out
