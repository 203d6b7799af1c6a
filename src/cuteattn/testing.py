"""Accuracy checks shared by the GPU tests: errors bounded relative to PyTorch's own.

A kernel's result is compared with the fp32 reference; the allowed error is ``factor`` times
the error that plain PyTorch makes on the same inputs in the same low precision
(``reference.attention(..., upcast=False)``), plus a small absolute floor. NaN never passes.
"""

import math

import torch
import torch.utils._python_dispatch


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
    low_precision: torch.Tensor | tuple[torch.Tensor, ...],
    factor: float = 2.0,
    floor: float = 1e-4,
) -> None:
    if torch.isnan(got).any():
        bad = torch.isnan(got).nonzero()[:5].tolist()
        raise AssertionError(f"{name}: NaN at {bad} (of {int(torch.isnan(got).sum())})")
    if not torch.equal(torch.isinf(got.float()), torch.isinf(ref.float())):
        raise AssertionError(f"{name}: infinities differ from the reference")
    err = max_err(got, ref)
    # Several low-precision computations (a tuple): the largest of their errors.
    lows = low_precision if isinstance(low_precision, (tuple, list)) else (low_precision,)
    pt_err = max(max_err(low, ref) for low in lows)
    bound = factor * pt_err + floor
    if not err <= bound:
        raise AssertionError(
            f"{name}: max error {err:.3e} > {factor} x PyTorch's {pt_err:.3e} + {floor:.0e}"
        )


def assert_attention_close(out: torch.Tensor, lse: torch.Tensor, q, k, v, **options) -> None:
    """out and lse of an attention call against the fp32 reference of the same ``options``
    (``cuteattn.reference.attention``'s keywords), the bound set by PyTorch's own
    low-precision computation."""
    from cuteattn.reference import attention

    out_ref, lse_ref = attention(q, k, v, **options)
    out_pt, lse_pt = attention(q, k, v, upcast=False, **options)
    assert_close_to_reference("out", out, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)


def reference_grads(
    q, k, v, dout, *, causal=False, window_size=(None, None), softmax_scale=None, softcap=0.0,
    learnable_sink=None, upcast=True, flash_rowsum=False, **varlen,
):
    """(dq, dk, dv) of ``reference.attention`` for the output gradient ``dout``: fp32 with
    ``upcast`` (the oracle), else in the inputs' dtype (PyTorch's own low-precision error).
    With ``learnable_sink``: (dq, dk, dv, dsink). ``varlen``: cu_seqlens_q / cu_seqlens_k /
    seqused_k of packed inputs.

    ``flash_rowsum`` (with ``upcast=False``): the low-precision gradients as FlashAttention forms
    them, whose softmax backward subtracts rowsum(dout * out) of the rounded output where
    autograd subtracts rowsum(P * dP) in float32. The two differ where that subtraction cancels
    (a row whose probability sits on one key; dsink, which is that row sum itself), so there the
    algorithm's own error exceeds autograd's; the difference is a per-row multiple of P, the
    gradient of the lse, and is added as the lse's cotangent."""
    from cuteattn.reference import attention

    def outputs(q, k, v, *sink):
        return attention(
            q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, learnable_sink=sink[0] if sink else None, upcast=upcast, **varlen,
        )

    # torch.func, not autograd: it also works below the autograd dispatch key (inside an op).
    primals = [q.detach(), k.detach(), v.detach()]
    if learnable_sink is not None:
        primals.append(learnable_sink.detach())
    (out, lse), vjp = torch.func.vjp(outputs, *primals)
    lse_cotangent = torch.zeros_like(lse)
    if flash_rowsum and not upcast:
        exact_out = attention(
            *primals[:3], softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, learnable_sink=learnable_sink, **varlen,
        )[0]
        rowsum_gap = (dout.float() * (exact_out.float() - out.float())).sum(-1)
        # out (batch, seqlen_q, heads) -> lse (batch, heads, seqlen_q); packed: (heads, total_q)
        rowsum_gap = rowsum_gap.transpose(-1, -2)
        lse_cotangent = torch.where(torch.isfinite(lse), rowsum_gap, 0.0)
    return vjp((dout.to(out.dtype), lse_cotangent))


def half_ulp(value: float, dtype: torch.dtype) -> float:
    """Half a unit in the last place of ``value`` in ``dtype`` (0 for 0)."""
    if value <= 0.0:
        return 0.0
    return 0.5 * torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(value))


def dsink_from_rows(sink, lse, out, dout) -> torch.Tensor:
    """dsink[h] = -sum over rows of exp(sink[h] - lse) * rowsum(dout * out), in float64, for the
    dense layout (out (batch, seqlen_q, heads, dim), lse (batch, heads, seqlen_q)) or the packed
    one (out (total_q, heads, dim), lse (heads, total_q)); rows with lse = -inf weigh 0."""
    rowsums = (dout.double() * out.double()).sum(-1).transpose(-1, -2)
    lse = lse.double()
    sink = sink.double().view(-1, 1)
    weights = torch.where(torch.isneginf(lse), 0.0, torch.exp(sink - lse))
    terms = weights * rowsums
    return -(terms.sum(0).sum(-1) if terms.dim() == 3 else terms.sum(-1))


def assert_grads_close(got, q, k, v, dout, *, out=None, lse=None, **options) -> None:
    """The backward's (dq, dk, dv[, dsink]) ``got`` against the fp32 reference's gradients:
    each within 2x the larger error of PyTorch's two low-precision computations (autograd's,
    and FlashAttention's row sum: ``reference_grads(flash_rowsum=True)``) plus the floor and
    half a unit in the last place of the gradient's largest value in its dtype (its final
    rounding, which a gradient summed from few rows - a key seen by one query - cannot average
    away, while PyTorch's error on it may happen to be small).

    dsink (with ``learnable_sink``; needs the forward's ``out`` and ``lse``) is a sum of one
    rounded row sum per query row, so its error against the reference is mostly the forward
    output's own error (bounded by the forward's rule) carried through that sum: it must equal
    that sum over the forward's out and lse (float64) to float32 accuracy, and the reference
    within 2x PyTorch's error plus the error the output carries."""
    want = reference_grads(q, k, v, dout, **options)
    low = reference_grads(q, k, v, dout, upcast=False, **options)
    flash = reference_grads(q, k, v, dout, upcast=False, flash_rowsum=True, **options)
    for name, g, ref, pt, pt_flash in zip(("dq", "dk", "dv"), got, want, low, flash):
        assert_close_to_reference(
            name, g, ref, (pt, pt_flash), floor=1e-4 + half_ulp(ref.abs().max().item(), g.dtype)
        )
    if len(got) == 4:
        if out is None or lse is None:
            raise ValueError("checking dsink needs the forward's out and lse")
        from cuteattn.reference import attention

        sink = options["learnable_sink"]
        from_rows = dsink_from_rows(sink, lse, out, dout)
        gap = (got[3].double() - from_rows).abs().max().item()
        if not gap <= 1e-5 * (1.0 + from_rows.abs().max().item()):
            raise AssertionError(f"dsink: {gap:.3e} away from its row sum over out and lse")
        exact_out, exact_lse = attention(q, k, v, **options)
        carried = (from_rows - dsink_from_rows(sink, exact_lse, exact_out, dout)).abs().max()
        assert_close_to_reference(
            "dsink", got[3], want[3], (low[3], flash[3]), floor=1e-4 + carried.item()
        )


def param_id(value) -> str:
    """A pytest id: dtypes without their ``torch.`` prefix, anything else as str()."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return str(value)


def skip_unless_family_runs(family: str) -> None:
    """pytest.skip unless kernel family ``family`` runs on this GPU."""
    import pytest

    from cuteattn.plan import get_family
    from cuteattn.runtime.arch import device_arch

    if not get_family(family).supports(device_arch(torch.device("cuda"))):
        pytest.skip(f"family {family} does not run on this GPU")


def check_family_backward(q, k, v, *, causal: bool, family: str, deterministic: bool) -> None:
    """The family's forward, then its backward into poisoned gradient buffers (dout random),
    against the reference's gradients (``assert_grads_close``)."""
    from cuteattn import api

    out, lse = api.forward(q, k, v, causal=causal, family=family)
    dout = torch.randn_like(out)
    grads = tuple(poison_like(x) for x in (q, k, v))
    got = api.backward(
        dout, q, k, v, out, lse, causal=causal, family=family, deterministic=deterministic,
        dq=grads[0], dk=grads[1], dv=grads[2],
    )
    torch.cuda.synchronize()
    assert_grads_close(got, q, k, v, dout, causal=causal)


def check_training_dense_and_packed(q, k, v, dout) -> None:
    """Causal training through autograd on (q, k, v) (batch 2, 300 queries, 400 keys: the
    planner's family), then on a packed batch of their first rows (four sequences, an empty and
    a one-row one among them): out and gradients against the reference's."""
    import cuteattn
    from cuteattn.reference import attention

    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    cuteattn.flash_attn_func(*leaves, causal=True).backward(dout)
    assert_grads_close([leaf.grad for leaf in leaves], q, k, v, dout, causal=True)

    cu_q = torch.tensor((0, 100, 101, 101, 301), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor((0, 150, 180, 187, 400), dtype=torch.int32, device="cuda")
    packed = [x.flatten(0, 1)[: cu[-1]] for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k))]
    packed_dout = dout.flatten(0, 1)[: cu_q[-1]]
    leaves = [x.detach().requires_grad_() for x in packed]
    out = cuteattn.flash_attn_varlen_func(*leaves, cu_q, cu_k, 200, 213, causal=True)
    options = dict(causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out_ref, _ = attention(*packed, **options)
    out_pt, _ = attention(*packed, upcast=False, **options)
    assert_close_to_reference("out", out.detach(), out_ref, out_pt)
    out.backward(packed_dout)
    assert_grads_close([leaf.grad for leaf in leaves], *packed, packed_dout, **options)


def check_family_forward(q, k, v, *, causal: bool, family: str) -> None:
    """The family's forward into a poisoned ``out`` (v's head dim), out and lse against the
    reference's."""
    from cuteattn import api
    from cuteattn.reference import attention

    out = poison_like(q.new_empty(*q.shape[:3], v.shape[3]))
    got, lse = api.forward(q, k, v, causal=causal, out=out, family=family)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    out_ref, lse_ref = attention(q, k, v, causal=causal)
    out_pt, lse_pt = attention(q, k, v, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)


def check_packed_batch_plan(head_dim: int, causal: bool, make_plan, repeat: int = 1) -> None:
    """A packed batch (GQA 8 / 2, bf16) whose sequences include ones without keys, without
    queries and of one row among long ones (the list ``repeat`` times), run with
    ``make_plan(planner's plan)`` into a poisoned out: out and lse against the reference's."""
    from cuteattn import ops
    from cuteattn.plan import plan_forward

    lengths_q = [0, 1, 1300, 257, 2100, 640, 999, 128] * repeat
    lengths_k = [3, 0, 700, 257, 2500, 100, 999, 1] * repeat
    cu_q, cu_k = (
        torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        for n in (lengths_q, lengths_k)
    )
    q = torch.randn(sum(lengths_q), 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = poison_like(q)
    problem = ops.varlen_problem(
        q, k, v, cu_q, max(lengths_q), max(lengths_k), causal=causal, window_left=-1,
        window_right=-1, softcap=0.0, sink=False, seqused_k=False,
    )
    plan = make_plan(plan_forward(problem, family="sm90"))
    lse = ops.launch_forward(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), out.unsqueeze(0),
        head_dim ** -0.5, plan, None, (cu_q, cu_k, None, max(lengths_q)),
    ).squeeze(0)
    torch.cuda.synchronize()
    assert_attention_close(out, lse, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal)


class OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that records every op it sees (``ops``), for tests of which custom ops
    a call goes through."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def dispatched_ops(fn, prefix: str = "cuteattn::") -> set[str]:
    """The names of the ``prefix`` ops that torch's dispatcher ran during ``fn()`` (from
    torch.profiler's CPU events: unlike a dispatch mode, the profiler does not change which
    path ``ops.eager_call`` takes)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {event.name for event in prof.events() if event.name.startswith(prefix)}
