"""Launch layer: allocates outputs and runs the compiled kernel of a plan on the current stream.

torch.library registration (fake implementations for torch.compile, autograd) comes with the
backward pass; until then the forward is a plain function.
"""

import functools

import torch

from cuteattn.plan import KernelPlan
from cuteattn.runtime.compile import compile_forward


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None,
    softmax_scale: float,
    plan: KernelPlan,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen_q, heads_q, _ = q.shape
    with torch.cuda.device(q.device):
        if out is None:
            out = torch.empty(batch, seqlen_q, heads_q, v.shape[3], dtype=q.dtype, device=q.device)
        lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device)
        kernel = compile_forward(plan)
        kernel(q, k, v, out, lse, softmax_scale, _num_sms(q.device.index))
    return out, lse
