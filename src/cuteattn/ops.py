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

No autograd formula is registered yet: the backward kernels do not exist, and api refuses
inputs that require grad up front (NotImplementedError). The backward issue adds
``register_autograd`` here.

``launch_forward`` runs a given plan's kernel. The op calls it; so does api.forward for an
explicit ``plan=`` (tests and the benchmark), which cannot go through the op since a plan
cannot cross its schema. That path is for eager calls only.
"""

import functools

import torch

from cuteattn import validate
from cuteattn.plan import KernelPlan, Problem, plan_forward
from cuteattn.runtime.arch import device_arch
from cuteattn.runtime.compile import compile_forward


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


def forward_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> Problem:
    """The planner's Problem for validated inputs, on the arch of q's device."""
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
    q, k, v = (validate.kernel_ready(x) for x in (q, k, v))
    plan = plan_forward(forward_problem(q, k, v, causal=causal), family=family)
    return launch_forward(q, k, v, out, softmax_scale, plan)


@forward.register_fake
def _forward_fake(q, k, v, out, softmax_scale, causal, family):
    return empty_lse(q)
