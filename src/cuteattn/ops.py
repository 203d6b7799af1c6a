"""The forward as one opaque torch.library custom op, and the launch of a plan's kernel.

``torch.ops.cuteattn.forward`` (``forward`` here)::

    cuteattn::forward(Tensor q, Tensor k, Tensor v, Tensor(a3!) out, float softmax_scale,
                      bool causal, str? family) -> Tensor

writes the attention into ``out`` (allocated by the caller, so the op never returns an alias
of an input) and returns lse, (batch, heads_q, seqlen_q) fp32. api.forward calls it after
validating the arguments; torch.compile traces that code and records this one opaque op.
``family`` (None: the planner's choice) is the family override, a name that api has checked.

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
                        str? family, bool deterministic) -> (Tensor out, Tensor lse)
    cuteattn::backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
                       float softmax_scale, bool causal, str? family, bool deterministic)
                       -> (Tensor dq, Tensor dk, Tensor dv)

``attention`` saves q, k, v, out and lse (no copies) and its autograd formula calls
``backward``, which plans the backward on the device's arch (``plan_backward``: the first
family with a backward kernel, or ``family`` when that family has one) and runs
``launch_backward``. The gradient of lse is not propagated (as in flash-attn).

``launch_forward`` runs a given plan's kernel. The op calls it; so does api.forward for an
explicit ``plan=`` (tests and the benchmark), which cannot go through the op since a plan
cannot cross its schema. That path is for eager calls only.
"""

import functools

import torch

from cuteattn import validate
from cuteattn.plan import KernelPlan, Problem, get_family, plan_backward, plan_forward
from cuteattn.runtime.arch import device_arch
from cuteattn.runtime.compile import (
    compile_backward,
    compile_backward_preprocess,
    compile_forward,
)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def out_shape(q: torch.Tensor, v: torch.Tensor) -> tuple:
    """(batch, seqlen_q, heads_q, dim_v): the shape of out."""
    batch, seqlen_q, heads_q, _ = q.shape
    return (batch, seqlen_q, heads_q, v.shape[3])


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


def forward_without_kernel(q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The forward of a problem with no work (``has_no_work``): out = 0; returns lse = -inf."""
    out.zero_()
    return empty_lse(q).fill_(float("-inf"))


def forward_problem(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, deterministic: bool = False
) -> Problem:
    """The planner's Problem for validated inputs, on the arch of q's device (``deterministic``
    matters to the backward's plan only)."""
    batch, seqlen_q, heads_q, dim = q.shape
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
        arch=device_arch(q.device),
        deterministic=deterministic,
    )


def launch_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_scale: float,
    plan: KernelPlan,
) -> torch.Tensor:
    """Run ``plan``'s compiled kernel on the current stream: writes out, returns lse.

    q, k, v and out must be kernel-addressable (``validate.kernel_ready``, ``check_out_memory``).
    """
    if has_no_work(q, k):
        return forward_without_kernel(q, out)
    with torch.cuda.device(q.device):
        lse = empty_lse(q)
        kernel = compile_forward(plan)
        kernel(q, k, v, out, lse, softmax_scale, _num_sms(q.device.index))
    return lse


@torch.library.custom_op("cuteattn::forward", mutates_args=("out",))
def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    family: str | None,
) -> torch.Tensor:
    """Attention of validated q, k, v into ``out``; returns lse. See the module docstring."""
    validate.check_out_memory(out, q, k, v)
    if has_no_work(q, k):
        return forward_without_kernel(q, out)
    q, k, v = (validate.kernel_ready(x) for x in (q, k, v))
    plan = plan_forward(forward_problem(q, k, v, causal=causal), family=family)
    return launch_forward(q, k, v, out, softmax_scale, plan)


@forward.register_fake
def _forward_fake(q, k, v, out, softmax_scale, causal, family):
    return empty_lse(q)


# ---- Training: a functional forward with an autograd formula, and the backward --------------


@torch.library.custom_op("cuteattn::attention", mutates_args=())
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    family: str | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of validated q, k, v in new tensors; differentiable in q, k, v (with a
    bitwise reproducible backward when ``deterministic``)."""
    out = torch.empty(out_shape(q, v), dtype=q.dtype, device=q.device)
    if has_no_work(q, k):
        return out, forward_without_kernel(q, out)
    q, k, v = (validate.kernel_ready(x) for x in (q, k, v))
    plan = plan_forward(forward_problem(q, k, v, causal=causal), family=family)
    return out, launch_forward(q, k, v, out, softmax_scale, plan)


@attention.register_fake
def _attention_fake(q, k, v, softmax_scale, causal, family, deterministic):
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
    and the postprocess dq = softmax_scale * accumulator in dq's dtype (one PyTorch op).
    """
    if has_no_work(q, k):
        return backward_without_kernel(q, k, v, dq=dq, dk=dk, dv=dv)
    with torch.cuda.device(q.device):
        batch, seqlen_q, heads_q, dim = q.shape
        rows = -(-seqlen_q // plan.tile_m) * plan.tile_m
        f32 = dict(dtype=torch.float32, device=q.device)
        dpsum = torch.empty(batch, heads_q, rows, **f32)
        lse_log2 = torch.empty(batch, heads_q, rows, **f32)
        preprocess = compile_backward_preprocess(plan.arch, plan.dtype, dim)
        preprocess(validate.kernel_ready(out), dout, lse.contiguous(), lse_log2, dpsum)
        dq_accum = new_dq_accum(q, rows, *get_family(plan.family).dq_accum_chunks(plan))
        if dk is None:
            dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        if dv is None:
            dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        kernel = compile_backward(plan)
        semaphore = None
        if plan.option("deterministic", False):
            # Turn counters of the ordered dq accumulation, one per (batch, head, query tile).
            semaphore = torch.zeros(
                batch, heads_q, rows // plan.tile_m, dtype=torch.int32, device=q.device
            )
        kernel(q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv, semaphore, softmax_scale)
        if dq is None:
            dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dq_from_accum(dq_accum, softmax_scale, dq)
    return dq, dk, dv


def backward_without_kernel(q, k, v, *, dq=None, dk=None, dv=None):
    """The backward of a problem with no work (``has_no_work``): zero gradients, in the given
    buffers or new ones."""
    grads = []
    for x, buffer in ((q, dq), (k, dk), (v, dv)):
        grads.append(torch.zeros_like(x) if buffer is None else buffer.zero_())
    return tuple(grads)


def new_dq_accum(q: torch.Tensor, rows: int, chunks: int, row_pad: int) -> torch.Tensor:
    """The zeroed fp32 dq accumulator of a backward plan: (batch, heads_q, chunks, rows,
    head_dim / chunks + row_pad), rows padded to whole query tiles
    (``KernelFamily.dq_accum_chunks``)."""
    batch, _, heads_q, dim = q.shape
    return torch.zeros(
        batch, heads_q, chunks, rows, dim // chunks + row_pad, dtype=torch.float32, device=q.device
    )


def dq_from_accum(dq_accum: torch.Tensor, softmax_scale: float, dq: torch.Tensor) -> torch.Tensor:
    """The postprocess: dq (batch, seqlen_q, heads_q, dim) = softmax_scale * the accumulator,
    cast to dq's dtype, through (batch, seqlen_q, heads_q, chunks, chunk_dim) views of both (one
    strided pass; the row padding and the padded rows are not read)."""
    chunks = dq_accum.shape[2]
    chunk_dim = dq.shape[-1] // chunks
    accumulated = dq_accum[:, :, :, : dq.shape[1], :chunk_dim].permute(0, 3, 1, 2, 4)
    torch.mul(accumulated, softmax_scale, out=dq.unflatten(-1, (chunks, chunk_dim)))
    return dq


def backward_family(family: str | None) -> str | None:
    """The family to plan a backward with: the forward's override if it has a backward kernel,
    else the planner's choice."""
    if family is not None and get_family(family).has_backward:
        return family
    return None


@torch.library.custom_op("cuteattn::backward", mutates_args=())
def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    family: str | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention(q, k, v) for the output gradient ``dout``; bitwise
    reproducible when ``deterministic``."""
    if has_no_work(q, k):
        return backward_without_kernel(q, k, v)
    dout, q, k, v = (validate.kernel_ready(x) for x in (dout, q, k, v))
    problem = forward_problem(q, k, v, causal=causal, deterministic=deterministic)
    plan = plan_backward(problem, family=backward_family(family))
    return launch_backward(dout, q, k, v, out, lse, softmax_scale, plan)


@backward.register_fake
def _backward_fake(dout, q, k, v, out, lse, softmax_scale, causal, family, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, family, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale, ctx.causal, ctx.family = softmax_scale, causal, family
    ctx.deterministic = deterministic


def _attention_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = backward(
        grad_out, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.family,
        ctx.deterministic,
    )
    return dq, dk, dv, None, None, None, None


attention.register_autograd(_attention_backward, setup_context=_attention_setup_context)
