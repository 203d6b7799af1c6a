"""The forward as one opaque torch.library custom op, and the launch of a plan's kernel.

``torch.ops.cuteattn.forward`` (``forward`` here)::

    cuteattn::forward(Tensor q, Tensor k, Tensor v, Tensor(a3!) out, float softmax_scale,
                      bool causal, int window_left, int window_right, float softcap,
                      Tensor? learnable_sink, str? family) -> Tensor

writes the attention into ``out`` (allocated by the caller, so the op never returns an alias
of an input) and returns lse, (batch, heads_q, seqlen_q) fp32. ``inference`` (the same
arguments less ``out``) returns (out, lse) in new tensors: the path of calls that give no
``out`` and record no gradient, since torch's wrapper of a mutating op costs ~40 us of host
time per call (``varlen_inference`` likewise beside ``varlen_forward``). api.forward calls it after
validating the arguments; torch.compile traces that code and records this one opaque op.
``family`` (None: the planner's choice) is the family override, a name that api has checked;
``window_left`` / ``window_right`` bound a local window (-1: unbounded; both -1: none;
``mask_of`` normalises them); ``softcap`` (0: off) soft-caps the scores (a compile-time value
of the plan); ``learnable_sink`` (None, or (heads_q,) fp32) adds a sink logit per query head
to each row's softmax (``kernels/common/sink.py``); its gradient comes from the attention op's
autograd.

- Real implementation (eager calls, and a compiled graph when it runs): checks out's memory
  (aligned start, no overlap with q, k, v; under torch.compile the api's code ran on fake
  tensors, so this is the first place that sees real addresses), makes q, k, v
  kernel-addressable, plans on the device's arch (``plan_forward``; ``family`` forces a
  family) and launches. It plans inside because a KernelPlan cannot cross the op schema,
  which takes tensors and primitives only.
- Fake implementation (FakeTensorMode, torch.compile's tracing): allocates lse through the
  same helper as the real one (``empty_lse`` -> ``lse_shape``), so their metadata cannot
  drift. It does not plan: planning reads sizes that may be symbolic while tracing, and the
  planner's NotImplementedError reaches the caller unchanged from the real implementation,
  before any launch.

Training goes through a second, functional op (torch's autograd registration needs one):

    cuteattn::attention(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal,
                        int window_left, int window_right, float softcap,
                        Tensor? learnable_sink, str? family, bool deterministic)
                        -> (Tensor out, Tensor lse)
    cuteattn::backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
                       float softmax_scale, bool causal, int window_left, int window_right,
                       float softcap, str? family, bool deterministic)
                       -> (Tensor dq, Tensor dk, Tensor dv)

``attention`` saves q, k, v, out and lse (no copies; and the sink) and its autograd formula
calls ``backward`` (the sink needs nothing there: lse includes it; ``sink_grad`` gives dsink),
which plans the backward on the device's arch (``plan_backward``: the first family with a
backward kernel, or ``family`` when that family has one) and runs ``launch_backward``.
Packed batches (flash_attn_varlen_func) have their own ops: ``varlen_forward`` (into out),
``varlen_attention`` (functional, with autograd) and ``varlen_backward``. The gradient of
lse is not propagated (as in flash-attn).

``launch_forward`` runs a given plan's kernel. The op calls it; so does api.forward for an
explicit ``plan=`` (tests and the benchmark), which cannot go through the op since a plan
cannot cross its schema. That path is for eager calls only.

Eager calls that nothing observes skip the ops' dispatch (``eager_call``): the op's Python
function runs directly, since torch's dispatch of a custom op costs 70-160 us of host time per
call on the H200's host, time in which a short call's GPU waits.
"""

import dataclasses
import functools

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from cuteattn import validate
from cuteattn.plan import KernelPlan, Problem, get_family, plan_backward, plan_forward
from cuteattn.runtime.arch import device_arch
from cuteattn.runtime.compile import (
    compile_backward,
    compile_backward_preprocess,
    compile_dq_postprocess,
    compile_forward,
)


# The Python function of each op made by ``custom_op``, for ``eager_call``.
_FUNCTIONS: dict[object, object] = {}


def custom_op(name: str, mutates_args: tuple[str, ...] = ()):
    """``torch.library.custom_op(name, mutates_args=...)`` that also keeps the function, so
    that ``eager_call`` can run it without the op's dispatch."""

    def register(function):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(function)
        _FUNCTIONS[op] = function
        return op

    return register


def eager_call(op, *args):
    """``op(*args)``, or where nothing would see the op its Python function on ``args``:
    torch's dispatch of a custom op cost 70-160 us of host time per d128 1k backward on the
    H200's host (autograd.grad 536 -> 458 us causal, 615 -> 453 dense; a call's latency
    1475 -> 1185 us with its GPU time: docs/PERF.md "thirtieth session"), time in which a short
    call's GPU waits. The op stays wherever it is seen or needed: under torch.compile (the
    graph records the opaque op), under a dispatch mode (fake tensors, FlopCounterMode,
    tracers), for tensor subclasses, and where autograd would record it (grad mode on and an
    argument that requires grad: the op refuses a backward through it, the bare function
    would return results that silently carry no graph; e.g. a backward with
    create_graph)."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return op(*args)
    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    if any(type(x) is not torch.Tensor for x in tensors) or (
        torch.is_grad_enabled() and any(x.requires_grad for x in tensors)
    ):
        return op(*args)
    return _FUNCTIONS[op](*args)


# One dynamic tile counter per (device, stream): the kernels leave it zero (``_publish`` in
# kernels/common/tile_scheduler.py), so calls on a stream share it (no zero fill per call).
_TILE_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def _tile_counter(device: torch.device) -> torch.Tensor:
    """The zeroed int32 (1,) tile counter of the current stream. While a CUDA graph is being
    captured, a fresh one: the zero fill of a counter made then is captured, not run, so it
    could not serve the eager calls after."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(1, dtype=torch.int32, device=device)
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    counter = _TILE_COUNTERS.get(key)
    if counter is None:
        counter = _TILE_COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def out_shape(q: torch.Tensor, v: torch.Tensor) -> tuple:
    """(batch, seqlen_q, heads_q, dim_v): the shape of out."""
    batch, seqlen_q, heads_q, _ = q.shape
    return (batch, seqlen_q, heads_q, v.shape[3])


def varlen_out_shape(q: torch.Tensor, v: torch.Tensor) -> tuple:
    """(total_q, heads_q, dim_v): the shape of a packed batch's out."""
    return (*q.shape[:2], v.shape[2])


def lse_shape(q: torch.Tensor) -> tuple:
    """(batch, heads_q, seqlen_q): the shape of lse, for the real and the fake forward alike."""
    batch, seqlen_q, heads_q, _ = q.shape
    return (batch, heads_q, seqlen_q)


def empty_lse(q: torch.Tensor) -> torch.Tensor:
    return torch.empty(lse_shape(q), dtype=torch.float32, device=q.device)


def has_no_work(q: torch.Tensor, k: torch.Tensor) -> bool:
    """No query row (batch 0 or seqlen_q 0) or no key (seqlen_k 0): flash-attn's results need
    no kernel (empty outputs; where no key: out = 0, lse = -inf, and zero gradients)."""
    return q.shape[0] == 0 or q.shape[1] == 0 or k.shape[1] == 0


def forward_without_kernel(
    q: torch.Tensor, out: torch.Tensor, sink: torch.Tensor | None = None
) -> torch.Tensor:
    """The forward of a problem with no work (``has_no_work``): out = 0; returns lse = -inf,
    or each head's sink logit where there is one (the sink alone in the denominator)."""
    out.zero_()
    lse = empty_lse(q)
    if sink is None:
        return lse.fill_(float("-inf"))
    return lse.copy_(sink.view(1, -1, 1).expand_as(lse))


def sink_grad(
    sink: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """dsink[h] = -sum over batch and rows of exp(sink[h] - lse) * rowsum(dout * out): a
    reduction over the rows, no pass over K or V. ``rows``: a bool (seqlen_q,) mask of the rows
    that count (a packed batch's rows of some sequence; the others were never written)."""
    dpsum = (dout.float() * out.float()).sum(-1).transpose(1, 2)  # (batch, heads_q, seqlen_q)
    # A row with lse = -inf (no key, and a sink of -inf) has weight 0, not exp(-inf + inf).
    terms = torch.exp(sink.view(1, -1, 1) - lse) * dpsum
    terms = torch.where(torch.isneginf(lse), 0.0, terms)
    if rows is not None:
        terms = torch.where(rows.view(1, 1, -1), terms, 0.0)
    return -terms.sum(dim=(0, 2))


def mask_of(
    causal: bool, window_left: int, window_right: int, seqlen_q: int, seqlen_k: int
) -> tuple[bool, tuple[int, int] | None]:
    """The Problem's (causal, window) from the ops' ints (-1 unbounded). A bound that hides
    nothing at these lengths is unbounded (a left bound >= seqlen_k, a right one >= seqlen_q:
    the kernels compute in 32 bits, and every huge value would compile its own kernels); what
    is left of the window may be the causal mask (-1, 0) or no mask at all."""
    left = -1 if window_left >= seqlen_k else int(window_left)
    right = -1 if window_right >= seqlen_q else int(window_right)
    if (left, right) == (-1, 0):
        return True, None
    if (left, right) == (-1, -1):
        return causal, None
    return False, (left, right)


def forward_problem(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
    deterministic: bool = False, softcap: float = 0.0, sink: bool = False,
    window_left: int = -1, window_right: int = -1, lse: bool = True,
) -> Problem:
    """The planner's Problem for validated inputs, on the arch of q's device (``deterministic``
    matters to the backward's plan only; the window as ``mask_of`` normalises it; ``lse``
    False: the caller reads no lse)."""
    batch, seqlen_q, heads_q, dim = q.shape
    causal, window = mask_of(causal, window_left, window_right, seqlen_q, k.shape[1])
    return Problem(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=k.shape[1],
        heads_q=heads_q,
        heads_kv=k.shape[2],
        head_dim=dim,
        head_dim_v=v.shape[3],
        dtype=validate.DTYPES[q.dtype],
        causal=causal,
        softcap=float(softcap),
        sink=sink,
        window=window,
        arch=device_arch(q.device),
        deterministic=deterministic,
        lse=lse,
    )


def launch_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_scale: float,
    plan: KernelPlan,
    sink: torch.Tensor | None = None,
    varlen: tuple | None = None,
) -> torch.Tensor | None:
    """Run ``plan``'s compiled kernel on the current stream: writes out, returns lse (None for
    a plan with ("lse", False), whose kernel writes none).

    q, k, v and out must be kernel-addressable (``validate.kernel_ready``, ``check_out_memory``);
    ``sink``, the learnable sink's fp32 logits, is given exactly when the plan has one;
    ``varlen``, (cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q), exactly when the plan is
    varlen (q, k, v, out then the (1, total, heads, dim) views of packed tensors).
    """
    if has_no_work(q, k):
        return forward_without_kernel(q, out, sink)
    cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q = varlen or (None, None, None, 0)
    with torch.cuda.device(q.device):
        lse = empty_lse(q) if plan.option("lse", True) else None
        kernel = compile_forward(plan)
        sink = sink.contiguous() if sink is not None else None
        tile_counter = None
        if get_family(plan.family).uses_tile_counter(plan):
            tile_counter = _tile_counter(q.device)
        kernel(
            q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
            softmax_scale, _num_sms(q.device.index), tile_counter,
        )
    return lse


@custom_op("cuteattn::forward", mutates_args=("out",))
def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    learnable_sink: torch.Tensor | None,
    family: str | None,
) -> torch.Tensor:
    """Attention of validated q, k, v into ``out``; returns lse. See the module docstring."""
    validate.check_out_memory(out, q, k, v)
    return _forward_into(
        q, k, v, out, softmax_scale, causal, window_left, window_right, softcap, learnable_sink,
        family,
    )


def _forward_into(
    q, k, v, out, softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
    need_lse=True,
) -> torch.Tensor | None:
    """The forward ops' work into an ``out`` whose memory is known good; returns lse (or,
    without ``need_lse``, maybe None: the kernel then writes none)."""
    if has_no_work(q, k):
        return forward_without_kernel(q, out, learnable_sink)
    q, k, v = (validate.kernel_ready(x) for x in (q, k, v))
    problem = forward_problem(
        q, k, v, causal=causal, window_left=window_left, window_right=window_right, softcap=softcap,
        sink=learnable_sink is not None, lse=need_lse,
    )
    plan = plan_forward(problem, family=family)
    return launch_forward(q, k, v, out, softmax_scale, plan, learnable_sink)


@forward.register_fake
def _forward_fake(
    q, k, v, out, softmax_scale, causal, window_left, window_right, softcap, learnable_sink,
    family,
):
    return empty_lse(q)


@custom_op("cuteattn::inference")
def inference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    learnable_sink: torch.Tensor | None,
    family: str | None,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of validated q, k, v in new tensors, for calls that record no gradient and
    give no ``out``. Functional, unlike ``forward``: torch wraps an op that mutates an argument
    in a version-counter step that rebuilds the schema's arguments on every call (~40 us of
    host time on the CI machine, the GPU's idle time between short calls). Without
    ``return_lse`` the kernel writes no lse and lse is an empty (0,) tensor."""
    out = torch.empty(out_shape(q, v), dtype=q.dtype, device=q.device)
    lse = _forward_into(
        q, k, v, out, softmax_scale, causal, window_left, window_right, softcap, learnable_sink,
        family, need_lse=return_lse,
    )
    return out, (lse if return_lse else no_lse(q))


def no_lse(q: torch.Tensor) -> torch.Tensor:
    """What the inference ops return for lse when the caller asked for none."""
    return torch.empty(0, dtype=torch.float32, device=q.device)


@inference.register_fake
def _inference_fake(
    q, k, v, softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
    return_lse,
):
    return q.new_empty(out_shape(q, v)), (empty_lse(q) if return_lse else no_lse(q))


# ---- Training: a functional forward with an autograd formula, and the backward --------------


@custom_op("cuteattn::attention")
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    learnable_sink: torch.Tensor | None,
    family: str | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of validated q, k, v in new tensors; differentiable in q, k, v (with a
    bitwise reproducible backward when ``deterministic``)."""
    out = torch.empty(out_shape(q, v), dtype=q.dtype, device=q.device)
    if has_no_work(q, k):
        return out, forward_without_kernel(q, out, learnable_sink)
    q, k, v = (validate.kernel_ready(x) for x in (q, k, v))
    problem = forward_problem(
        q, k, v, causal=causal, window_left=window_left, window_right=window_right, softcap=softcap,
        sink=learnable_sink is not None,
    )
    plan = plan_forward(problem, family=family)
    # The backward this call records must exist: refuse now (NotImplementedError), not when
    # autograd first asks for it.
    plan_backward(
        dataclasses.replace(problem, deterministic=deterministic),
        family=backward_family(family),
    )
    return out, launch_forward(q, k, v, out, softmax_scale, plan, learnable_sink)


@attention.register_fake
def _attention_fake(
    q, k, v, softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
    deterministic,
):
    return q.new_empty(out_shape(q, v)), empty_lse(q)


def launch_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    plan: KernelPlan,
    *,
    dq: torch.Tensor | None = None,
    dk: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run ``plan``'s backward on the current stream: returns (dq, dk, dv), written into the
    given buffers (dk, dv kernel-addressable: ``validate.check_grad_buffers``) or new ones.

    Three launches: the preprocess kernel (``kernels/bwd_preprocess.py``: rowsum(dout * out)
    and lse in log2 units, +inf where the forward saw no key so those probabilities are 0,
    both padded to whole query tiles), the plan's kernel (dk, dv; dS K accumulated in fp32),
    and the postprocess dq = softmax_scale * accumulator in dq's dtype (``dq_from_accum``).
    """
    if has_no_work(q, k):
        return backward_without_kernel(q, k, v, dq=dq, dk=dk, dv=dv)
    with torch.cuda.device(q.device):
        batch, seqlen_q, heads_q, _ = q.shape
        rows = -(-seqlen_q // plan.tile_m) * plan.tile_m
        # Every fill before the preprocess: the main kernel runs as its dependent
        # (programmatic dependent launch), so nothing may launch between the two. The
        # accumulator's fill first: the call's first GPU work, it starts while the host goes on.
        family = get_family(plan.family)
        zeroed = dq_accum_needs_zeros(plan, seqlen_q, k.shape[1])
        dq_accum = new_dq_accum(
            q, rows, *family.dq_accum_chunks(plan), head_dim=plan.head_dim, zeroed=zeroed
        )
        f32 = dict(dtype=torch.float32, device=q.device)
        dpsum = torch.empty(batch, heads_q, rows, **f32)
        lse_log2 = torch.empty(batch, heads_q, rows, **f32)
        semaphore = None
        if family.dq_counters(plan):
            # Counters of the dq accumulation, one per (batch, head, query tile): the turns of
            # the ordered one, or the claims of each query tile's first addition.
            semaphore = torch.full(
                (batch, heads_q, rows // plan.tile_m), family.dq_counters_start(plan, zeroed),
                dtype=torch.int32, device=q.device,
            )
        if dk is None:
            dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        if dv is None:
            dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        out, lse = validate.kernel_ready(out), lse.contiguous()
        kernel = compile_backward(plan)
        # rowsum(dout * out): over the columns of v (dim_v).
        preprocess = compile_backward_preprocess(plan.arch, plan.dtype, out.shape[3])
        preprocess(out, dout, lse, lse_log2, dpsum, None, 0)
        kernel(
            q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv, semaphore, None, None, None, 0,
            softmax_scale,
        )
        dq = dq_from_accum(dq_accum, softmax_scale, q, plan, dq=dq)
    return dq, dk, dv


def backward_without_kernel(q, k, v, *, dq=None, dk=None, dv=None):
    """The backward of a problem with no work (``has_no_work``): zero gradients, in the given
    buffers or new ones."""
    grads = []
    for x, buffer in ((q, dq), (k, dk), (v, dv)):
        grads.append(torch.zeros_like(x) if buffer is None else buffer.zero_())
    return tuple(grads)


def new_dq_accum(
    q: torch.Tensor, rows: int, chunks: int, row_pad: int, head_dim: int | None = None, *,
    zeroed: bool = True,
) -> torch.Tensor:
    """The fp32 dq accumulator of a backward plan, zeroed unless ``zeroed`` is False: (batch,
    heads_q, chunks, rows, head_dim / chunks + row_pad), rows padded to whole query tiles
    (``KernelFamily.dq_accum_chunks``); ``head_dim`` the kernel's (default: q's; larger when the
    kernel pads q's)."""
    batch, _, heads_q, dim = q.shape
    dim = dim if head_dim is None else head_dim
    new = torch.zeros if zeroed else torch.empty
    return new(
        batch, heads_q, chunks, rows, dim // chunks + row_pad, dtype=torch.float32, device=q.device
    )


def dq_accum_needs_zeros(plan: KernelPlan, seqlen_q: int, seqlen_k: int) -> bool:
    """Whether a fixed-length backward's dq accumulator must start zeroed: yes unless the plan's
    kernel stores every query tile's first addition in this call
    (``KernelFamily.stores_first_additions``: the sm90 backward, its deterministic first turns
    or the claims of the other). (Varlen accumulators stay zeroed: a sequence may have no
    keys.)"""
    return not get_family(plan.family).stores_first_additions(plan, seqlen_q, seqlen_k)


def dq_from_accum(
    dq_accum: torch.Tensor, softmax_scale: float, q: torch.Tensor, plan: KernelPlan, *,
    dq: torch.Tensor | None = None, cu_seqlens_q: torch.Tensor | None = None,
    max_seqlen_q: int = 0, zero_kv_tails: tuple | None = None,
) -> torch.Tensor:
    """The postprocess kernel (``kernels/bwd_postprocess.py``): dq = softmax_scale * the
    accumulator of ``plan``'s backward, cast to q's dtype, into ``dq`` (any strides: through a
    kernel-addressable copy when it is not) or a new tensor. Packed (varlen) batches: q (total_q,
    heads, dim) and the cumulative lengths (each sequence's rows from its tile-aligned block;
    zeros past the last sequence); ``zero_kv_tails`` (dk, dv, cu_seqlens_k): zeros in their
    rows past the last sequence too."""
    family = get_family(plan.family)
    chunks, row_pad = family.dq_accum_chunks(plan)
    varlen = cu_seqlens_q is not None
    dk, dv, cu_seqlens_k = zero_kv_tails or (None, None, None)
    postprocess = compile_dq_postprocess(
        plan.arch, plan.dtype, q.shape[-1], plan.head_dim, chunks, row_pad,
        varlen_rows_tile=plan.tile_m if varlen else 0,
        zero_kv_dims=None if dk is None else (dk.shape[-1], dv.shape[-1]),
        fragment_order=family.dq_accum_fragment_order(plan),
    )
    target = dq
    if target is None or not validate.kernel_addressable(target):
        target = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    rows = target
    if varlen:
        rows = target.unsqueeze(0)
        dk, dv = (None, None) if dk is None else (dk.unsqueeze(0), dv.unsqueeze(0))
    postprocess(dq_accum, rows, cu_seqlens_q, max_seqlen_q, softmax_scale, dk, dv, cu_seqlens_k)
    if dq is None:
        return target
    if target is not dq:
        dq.copy_(target)
    return dq


def backward_family(family: str | None) -> str | None:
    """The family to plan a backward with: the forward's override if it has a backward kernel,
    else the planner's choice."""
    if family is not None and get_family(family).has_backward:
        return family
    return None


@custom_op("cuteattn::backward")
def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    family: str | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention(q, k, v) for the output gradient ``dout``; bitwise
    reproducible when ``deterministic``."""
    if has_no_work(q, k):
        return backward_without_kernel(q, k, v)
    dout, q, k, v = (validate.kernel_ready(x) for x in (dout, q, k, v))
    problem = forward_problem(
        q, k, v, causal=causal, window_left=window_left, window_right=window_right,
        deterministic=deterministic, softcap=softcap,
    )
    plan = plan_backward(problem, family=backward_family(family))
    return launch_backward(dout, q, k, v, out, lse, softmax_scale, plan)


@backward.register_fake
def _backward_fake(
    dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, family,
    deterministic,
):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup_context(ctx, inputs, output):
    (q, k, v, softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
     deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, learnable_sink)
    ctx.softmax_scale, ctx.causal, ctx.softcap = softmax_scale, causal, softcap
    ctx.window = (window_left, window_right)
    ctx.family = family
    ctx.deterministic = deterministic


def _attention_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, learnable_sink = ctx.saved_tensors
    dq, dk, dv = eager_call(
        backward, grad_out, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, *ctx.window,
        ctx.softcap, ctx.family, ctx.deterministic,
    )
    dsink = None
    if learnable_sink is not None and ctx.needs_input_grad[8]:
        dsink = sink_grad(learnable_sink, lse, out, grad_out)
    return dq, dk, dv, None, None, None, None, None, dsink, None, None


attention.register_autograd(_attention_backward, setup_context=_attention_setup_context)


# ---- Varlen: packed sequences of their own lengths (flash_attn_varlen_func) -----------------


def varlen_problem(
    q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, *, causal, window_left, window_right,
    softcap, sink, seqused_k, lse=True,
) -> Problem:
    """The planner's Problem for packed (total, heads, dim) inputs: the sequence count as the
    batch and the longest sequences as the lengths (they pick the tiling, and ``mask_of``
    normalises the window against them)."""
    _, heads_q, dim = q.shape
    causal, window = mask_of(causal, window_left, window_right, max_seqlen_q, max_seqlen_k)
    return Problem(
        batch=cu_seqlens_q.shape[0] - 1, seqlen_q=max_seqlen_q, seqlen_k=max_seqlen_k,
        heads_q=heads_q, heads_kv=k.shape[1], head_dim=dim, head_dim_v=v.shape[2],
        dtype=validate.DTYPES[q.dtype], causal=causal, arch=device_arch(q.device),
        softcap=float(softcap), sink=sink, window=window, varlen=True,
        seqused_k=seqused_k, lse=lse,
    )


@custom_op("cuteattn::varlen_forward", mutates_args=("out",))
def varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    learnable_sink: torch.Tensor | None,
    family: str | None,
) -> torch.Tensor:
    """Attention of validated packed q (total_q, heads_q, dim), k, v (total_k, heads_kv, dim)
    into ``out`` (total_q, heads_q, dim_v); returns lse (heads_q, total_q). Sequence b owns rows
    cu_seqlens[b] .. cu_seqlens[b + 1]; rows past cu_seqlens_q[-1] are not written."""
    validate.check_out_memory(out, q, k, v)
    return _varlen_forward_into(
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
    )


def _varlen_forward_into(
    q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
    softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
    need_lse=True,
) -> torch.Tensor | None:
    """The varlen forward ops' work into an ``out`` whose memory is known good; returns lse (or,
    without ``need_lse``, maybe None: the kernel then writes none)."""
    q4, k4, v4, out4 = (x.unsqueeze(0) for x in (q, k, v, out))
    no_sequence = cu_seqlens_q.shape[0] == 1 or max_seqlen_q == 0 or max_seqlen_k == 0
    if has_no_work(q4, k4) or no_sequence:
        return forward_without_kernel(q4, out4, learnable_sink).squeeze(0)
    q4, k4, v4 = (validate.kernel_ready(x) for x in (q4, k4, v4))
    problem = varlen_problem(
        q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal=causal,
        window_left=window_left, window_right=window_right, softcap=softcap,
        sink=learnable_sink is not None, seqused_k=seqused_k is not None, lse=need_lse,
    )
    plan = plan_forward(problem, family=family)
    bookkeeping = (
        cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(),
        None if seqused_k is None else seqused_k.contiguous(), max_seqlen_q,
    )
    lse = launch_forward(q4, k4, v4, out4, softmax_scale, plan, learnable_sink, bookkeeping)
    return None if lse is None else lse.squeeze(0)


@varlen_forward.register_fake
def _varlen_forward_fake(
    q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
    softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
):
    return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@custom_op("cuteattn::varlen_inference")
def varlen_inference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    learnable_sink: torch.Tensor | None,
    family: str | None,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``varlen_forward`` into a new out, functional (``inference`` says why): (out, lse), lse
    an empty (0,) tensor without ``return_lse``."""
    out = torch.empty(varlen_out_shape(q, v), dtype=q.dtype, device=q.device)
    lse = _varlen_forward_into(
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
        need_lse=return_lse,
    )
    return out, (lse if return_lse else no_lse(q))


@varlen_inference.register_fake
def _varlen_inference_fake(
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
    causal, window_left, window_right, softcap, learnable_sink, family, return_lse,
):
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if return_lse else no_lse(q)
    return q.new_empty(varlen_out_shape(q, v)), lse


def padded_rows(total_q: int, num_seqs: int, tile_m: int) -> int:
    """Rows of a packed batch's backward per-row buffers: every sequence starts on a whole
    tile (``SeqlenInfo``'s ``padded_rows_start``) and has its length rounded up to tiles."""
    return -(-(total_q + num_seqs * tile_m) // tile_m) * tile_m


def launch_varlen_backward(
    dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
    softmax_scale: float, plan: KernelPlan,
):
    """The backward of a packed batch (q, dout, out (total_q, heads_q, dim), k, v (total_k,
    heads_kv, dim), lse (heads_q, total_q)): returns new (dq, dk, dv). As ``launch_backward``,
    with the per-row buffers laid out per sequence on whole tiles (``padded_rows``; the
    postprocess reads each packed row from its sequence's block, zeros past the last sequence);
    rows of dk and dv that no sequence owns get zeros (from the postprocess; with seqused_k,
    which leaves rows inside the sequences unwritten, dk and dv start at 0)."""
    total_q, heads_q, _ = q.shape
    num_seqs = cu_seqlens_q.shape[0] - 1
    with torch.cuda.device(q.device):
        rows = padded_rows(total_q, num_seqs, plan.tile_m)
        f32 = dict(dtype=torch.float32, device=q.device)
        dpsum = torch.empty(1, heads_q, rows, **f32)
        lse_log2 = torch.empty(1, heads_q, rows, **f32)
        q4, k4, v4, out4, dout4 = (
            validate.kernel_ready(x.unsqueeze(0)) for x in (q, k, v, out, dout)
        )
        lse3 = lse.unsqueeze(0).contiguous()
        # Every fill before the preprocess: the main kernel runs as its dependent
        # (programmatic dependent launch), so nothing may launch between the two.
        chunks, row_pad = get_family(plan.family).dq_accum_chunks(plan)
        dq_accum = new_dq_accum(q4, rows, chunks, row_pad, head_dim=plan.head_dim)
        # The kernel writes every key row of every sequence up to its keys used: only
        # seqused_k leaves rows inside the sequences unwritten; the postprocess zeroes the rows
        # past the last one.
        new_grad = torch.empty if seqused_k is None else torch.zeros
        dk = new_grad(k.shape, dtype=k.dtype, device=k.device)
        dv = new_grad(v.shape, dtype=v.dtype, device=v.device)
        semaphore = None
        if get_family(plan.family).dq_counters(plan):
            semaphore = torch.zeros(
                num_seqs, heads_q, -(-max_seqlen_q // plan.tile_m), dtype=torch.int32,
                device=q.device,
            )
        kernel = compile_backward(plan)
        preprocess = compile_backward_preprocess(
            plan.arch, plan.dtype, out.shape[2], varlen_rows_tile=plan.tile_m
        )
        preprocess(out4, dout4, lse3, lse_log2, dpsum, cu_seqlens_q, max_seqlen_q)
        kernel(
            q4, k4, v4, dout4, lse_log2, dpsum, dq_accum, dk.unsqueeze(0), dv.unsqueeze(0),
            semaphore, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_k, softmax_scale,
        )
        dq = dq_from_accum(
            dq_accum, softmax_scale, q, plan, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
            zero_kv_tails=None if seqused_k is not None else (dk, dv, cu_seqlens_k),
        )
    return dq, dk, dv


@custom_op("cuteattn::varlen_backward")
def varlen_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    family: str | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ``varlen_attention`` for the output gradient ``dout``."""
    no_sequence = cu_seqlens_q.shape[0] == 1 or max_seqlen_q == 0 or max_seqlen_k == 0
    if q.shape[0] == 0 or k.shape[0] == 0 or no_sequence:
        return backward_without_kernel(q, k, v)
    problem = varlen_problem(
        q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal=causal,
        window_left=window_left, window_right=window_right, softcap=softcap, sink=False,
        seqused_k=seqused_k is not None,
    )
    problem = dataclasses.replace(problem, deterministic=deterministic)
    plan = plan_backward(problem, family=backward_family(family))
    return launch_varlen_backward(
        dout, q, k, v, out, lse, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(),
        None if seqused_k is None else seqused_k.contiguous(), max_seqlen_q, max_seqlen_k,
        softmax_scale, plan,
    )


@varlen_backward.register_fake
def _varlen_backward_fake(
    dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
    softmax_scale, causal, window_left, window_right, softcap, family, deterministic,
):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@custom_op("cuteattn::varlen_attention")
def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    learnable_sink: torch.Tensor | None,
    family: str | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of packed q, k, v in new tensors; differentiable in q, k, v and the sink."""
    out = torch.empty(varlen_out_shape(q, v), dtype=q.dtype, device=q.device)
    lse = _varlen_forward_into(
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, softcap, learnable_sink, family,
    )
    return out, lse


@varlen_attention.register_fake
def _varlen_attention_fake(
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
    causal, window_left, window_right, softcap, learnable_sink, family, deterministic,
):
    out = q.new_empty(varlen_out_shape(q, v))
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
     causal, window_left, window_right, softcap, learnable_sink, family, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, learnable_sink)
    ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                softcap, family, deterministic)


def _varlen_backward_formula(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, learnable_sink = ctx.saved_tensors
    dq, dk, dv = eager_call(
        varlen_backward, grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
        *ctx.args,
    )
    dsink = None
    if learnable_sink is not None and ctx.needs_input_grad[13]:
        covered = torch.arange(q.shape[0], device=q.device) < cu_seqlens_q[-1]
        dsink = sink_grad(
            learnable_sink, lse.unsqueeze(0), out.unsqueeze(0), grad_out.unsqueeze(0), covered
        )
    return (dq, dk, dv) + (None,) * 10 + (dsink, None, None)


varlen_attention.register_autograd(_varlen_backward_formula, setup_context=_varlen_setup_context)

