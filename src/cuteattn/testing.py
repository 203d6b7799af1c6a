"""Accuracy checks shared by the GPU tests: errors bounded relative to PyTorch's own.

A kernel's result is compared with the fp32 reference; the allowed error is ``factor`` times
the error that plain PyTorch makes on the same inputs in the same low precision
(``reference.attention(..., upcast=False)``), plus a small absolute floor. NaN never passes.
"""

import torch


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor shaped like t, filled with NaN, so an element the kernel skips cannot pass."""
    return torch.full_like(t, float("nan"))


def max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Max |x - ref| over positions where both are finite (matching infinities count as 0)."""
    diff = x.float() - ref.float()
    same_inf = torch.isinf(x.float()) & (x.float() == ref.float())
    diff = torch.where(same_inf, torch.zeros_like(diff), diff)
    return diff.abs().max().item() if diff.numel() else 0.0


def assert_close_to_reference(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    low_precision: torch.Tensor,
    factor: float = 2.0,
    floor: float = 1e-4,
) -> None:
    if torch.isnan(got).any():
        bad = torch.isnan(got).nonzero()[:5].tolist()
        raise AssertionError(f"{name}: NaN at {bad} (of {int(torch.isnan(got).sum())})")
    if not torch.equal(torch.isinf(got.float()), torch.isinf(ref.float())):
        raise AssertionError(f"{name}: infinities differ from the reference")
    err = max_err(got, ref)
    pt_err = max_err(low_precision, ref)
    bound = factor * pt_err + floor
    if not err <= bound:
        raise AssertionError(
            f"{name}: max error {err:.3e} > {factor} x PyTorch's {pt_err:.3e} + {floor:.0e}"
        )


def reference_grads(q, k, v, dout, *, causal=False, softmax_scale=None, upcast=True):
    """(dq, dk, dv) of ``reference.attention`` for the output gradient ``dout``: fp32 with
    ``upcast`` (the oracle), else in the inputs' dtype (PyTorch's own low-precision error)."""
    from cuteattn.reference import attention

    def output(q, k, v):
        return attention(q, k, v, softmax_scale=softmax_scale, causal=causal, upcast=upcast)[0]

    # torch.func, not autograd: it also works below the autograd dispatch key (inside an op).
    out, vjp = torch.func.vjp(output, q.detach(), k.detach(), v.detach())
    return vjp(dout.to(out.dtype))
