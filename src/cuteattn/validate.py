"""Host-side well-formedness checks. Each failure names the argument and the rule it broke.

Checks run before any kernel launch and never synchronise with the GPU. Structural checks
(types, ranks, dtypes, shapes) come before device checks, so a wrong shape is reported as such
whatever device the tensors are on. What a kernel family cannot do (a head dim it does not
compile, a grid too large for it) is the planner's to say, with NotImplementedError.

The checks that read addresses (``check_out_memory``: out's 16-byte aligned start, out not
overlapping q, k or v) need tensors with memory. ``check_forward`` runs them only then
(``has_memory``): not on fake tensors (torch.compile's tracing, FakeTensorMode) nor on meta
ones. The forward custom op (cuteattn.ops) runs them again on the real tensors before it
launches, which is what covers a compiled call.
"""

import math
import numbers
import operator

import torch
from torch._subclasses.fake_tensor import is_fake

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# Kernels move rows in 16-byte accesses (cp.async, TMA, 128-bit stores).
ALIGN_BYTES = 16
HEAD_DIM_MULTIPLE = 8
MAX_HEAD_DIM = 256


def _tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _rank(name: str, x: torch.Tensor, rank: int, layout: str):
    if x.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(x.shape)}")


def _dtype(name: str, x: torch.Tensor):
    if x.dtype not in DTYPES:
        raise TypeError(f"{name} must be torch.float16 or torch.bfloat16, got {x.dtype}")


def check_window(window_size) -> tuple[int, int]:
    """(left, right) with None / -1 meaning unbounded, returned as -1."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    bounds = []
    for side, value in zip(("left", "right"), window_size):
        if value is None:
            value = -1
        if isinstance(value, bool):
            raise TypeError(f"window_size {side} must be an int or None, got {value!r}")
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"window_size {side} must be an int or None, got {value!r}") from None
        if value < -1:
            raise ValueError(
                f"window_size {side} must be >= 0, or -1 / None for unbounded, got {value}"
            )
        bounds.append(value)
    return bounds[0], bounds[1]


def check_scalars(softmax_scale, softcap):
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale must be a float or None, got {softmax_scale!r}")
        # Comparisons rather than math.isfinite, which torch.compile(dynamic=True) cannot trace
        # on the symbolic floats it makes of float arguments. NaN fails both.
        if not 0 < softmax_scale < math.inf:
            raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float, got {softcap!r}")
    if not 0 <= softcap < math.inf:
        raise ValueError(f"softcap must be finite and >= 0 (0 disables it), got {softcap}")


def check_flag(name: str, value):
    """A flag is a Python bool: a string, int, None, numpy or tensor bool is refused, not read."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be a Python bool (True or False), got {value!r} ({type(value).__name__})"
        )


def check_dropout(dropout_p):
    """A real number in [0, 1); a bool is not a number here."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a real number in [0, 1), got {dropout_p!r}")
    if not 0 <= dropout_p < 1:  # NaN fails too
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")


def byte_range(x: torch.Tensor) -> tuple[int, int]:
    """[start, end): the bytes from x's first element to the end of its highest-addressed one.

    torch strides are never negative, so the element at index 0 has the lowest address.
    """
    start = x.data_ptr()
    last = sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
    return start, start + (last + 1) * x.element_size()


def may_share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Conservative overlap test: one storage on one device, and intersecting byte ranges.

    True for every pair that shares an element, and also for interleaved views of one storage
    that share none (e.g. q and out as buf[:, :, 0] and buf[:, :, 1] of a packed buffer):
    deciding those exactly is not worth it here. Meta tensors hold no memory, so never overlap.
    """
    if a.device != b.device or a.device.type == "meta" or a.numel() == 0 or b.numel() == 0:
        return False
    # Two live storages on one device with one base address are one allocation.
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a_start, a_end = byte_range(a)
    b_start, b_end = byte_range(b)
    return a_start < b_end and b_start < a_end


def check_out_overlap(out, q, k, v):
    """out must not share memory with an input: the kernel would read what it has written."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if may_share_memory(out, x):
            raise ValueError(
                f"out must not overlap {name}: they are views of one storage whose byte ranges "
                "intersect (the test is conservative: interleaved views that share no element "
                "are refused too); pass a separate buffer"
            )


def check_forward(q, k, v, out=None):
    """Structural checks of q, k, v (batch, seqlen, heads, dim) and an optional out."""
    layout = "(batch, seqlen, heads, dim)"
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(name, x)
        _rank(name, x, 4, layout)
        _dtype(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    batch, seqlen_q, heads_q, dim = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(
            f"q, k and v must have the same batch size, got {batch}, {k.shape[0]}, {v.shape[0]}"
        )
    if k.shape[3] != dim:
        raise ValueError(f"k must have the head dim of q ({dim}), got {k.shape[3]}")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(
            f"v must match k in (batch, seqlen_k, heads_kv) {tuple(k.shape[:3])}, "
            f"got {tuple(v.shape[:3])}"
        )
    if heads_q < 1 or heads_kv < 1 or heads_q % heads_kv != 0:
        raise ValueError(
            f"heads of q ({heads_q}) must be a positive multiple of heads of k/v ({heads_kv})"
        )
    for name, d in (("q/k", dim), ("v", v.shape[3])):
        if d % HEAD_DIM_MULTIPLE != 0 or not HEAD_DIM_MULTIPLE <= d <= MAX_HEAD_DIM:
            raise ValueError(
                f"head dim of {name} must be a multiple of {HEAD_DIM_MULTIPLE} from "
                f"{HEAD_DIM_MULTIPLE} to {MAX_HEAD_DIM}, got {d}"
            )
    if out is not None:
        _tensor("out", out)
        expected = (batch, seqlen_q, heads_q, v.shape[3])
        if tuple(out.shape) != expected:
            raise ValueError(f"out must have shape {expected}, got {tuple(out.shape)}")
        if out.dtype != q.dtype:
            raise TypeError(f"out must have the dtype of q ({q.dtype}), got {out.dtype}")
        if any(st == 0 and n > 1 for st, n in zip(out.stride(), out.shape)):
            raise ValueError(
                f"out must not have overlapping elements (a stride of 0), got strides {out.stride()}"
            )
        if has_memory(out, q, k, v):
            check_out_memory(out, q, k, v)
        elif not _strides_addressable(out):
            raise _out_not_addressable(out)


def check_backward(dout, q, out, lse, dim_v: int | None = None):
    """Structural checks of the backward's extra inputs: dout and out of the forward's output
    shape (batch, seqlen_q, heads_q, dim_v), ``dim_v`` v's head dim (default q's), lse
    (batch, heads_q, seqlen_q) fp32."""
    batch, seqlen_q, heads_q, dim = q.shape
    shape = (batch, seqlen_q, heads_q, dim if dim_v is None else dim_v)
    for name, x in (("dout", dout), ("out", out)):
        _tensor(name, x)
        _rank(name, x, 4, "(batch, seqlen_q, heads_q, dim_v)")
        if tuple(x.shape) != shape:
            raise ValueError(
                f"{name} must have the shape of the output (batch, seqlen_q, heads_q, dim_v) "
                f"{shape}, got {tuple(x.shape)}"
            )
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {x.dtype}")
    _tensor("lse", lse)
    if tuple(lse.shape) != (batch, heads_q, seqlen_q):
        raise ValueError(
            f"lse must have shape (batch, heads_q, seqlen_q) {(batch, heads_q, seqlen_q)}, "
            f"got {tuple(lse.shape)}"
        )
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be torch.float32, got {lse.dtype}")
    for name, x in (("dout", dout), ("out", out), ("lse", lse)):
        if x.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {x.device}")


def check_grad_buffers(q, k, v, dout, out, *, dq=None, dk=None, dv=None):
    """Caller-supplied gradient buffers: shape and dtype of their input, on its device, not
    overlapping any input; dk and dv (written by the kernel in place) kernel-addressable."""
    inputs = {"q": q, "k": k, "v": v, "dout": dout, "out": out}
    for name, buffer, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if buffer is None:
            continue
        _tensor(name, buffer)
        if tuple(buffer.shape) != tuple(like.shape) or buffer.dtype != like.dtype:
            raise ValueError(
                f"{name} must have the shape and dtype of its input {tuple(like.shape)} "
                f"{like.dtype}, got {tuple(buffer.shape)} {buffer.dtype}"
            )
        if buffer.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {buffer.device}")
        if not has_memory(buffer, *inputs.values()):
            continue
        for other_name, other in inputs.items():
            if may_share_memory(buffer, other):
                raise ValueError(f"{name} must not overlap {other_name}")
        if name != "dq" and not kernel_addressable(buffer):
            raise ValueError(
                f"{name} must have a contiguous last dim, 16-byte multiple strides and a "
                f"16-byte aligned start; got strides {buffer.stride()}"
            )


def check_sink(learnable_sink, q):
    """The learnable sink: None, or one fp32 logit per query head, (heads_q,), on q's device."""
    if learnable_sink is None:
        return
    _tensor("learnable_sink", learnable_sink)
    heads_q = q.shape[2]
    if tuple(learnable_sink.shape) != (heads_q,):
        raise ValueError(
            f"learnable_sink must have shape (heads_q,) = ({heads_q},), "
            f"got {tuple(learnable_sink.shape)}"
        )
    if learnable_sink.dtype != torch.float32:
        raise TypeError(f"learnable_sink must be torch.float32, got {learnable_sink.dtype}")
    if learnable_sink.device != q.device:
        raise ValueError(
            f"learnable_sink must be on the device of q ({q.device}), got {learnable_sink.device}"
        )


VARLEN_LAYOUT = "(total, heads, dim)"
# Checks that need the tensors' contents (a host sync) run only under this switch.
CHECK_INPUTS_ENV = "CUTEATTN_CHECK_INPUTS"


def check_varlen_packed(q, k, v, out=None):
    """Packed (total, heads, dim) q, k, v (and out): ranks here, everything else as
    ``check_forward`` on their (1, total, heads, dim) views."""
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out)):
        if x is None:
            continue
        _tensor(name, x)
        _rank(name, x, 3, VARLEN_LAYOUT + " for varlen")
    view = (lambda x: None if x is None else x.unsqueeze(0))
    check_forward(view(q), view(k), view(v), view(out))


def check_varlen_args(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k):
    """The varlen bookkeeping: int32 1-D cumulative lengths of one length (batch + 1 >= 1),
    int maxima >= 0, seqused_k None or int32 (batch,). What needs their values is
    ``check_varlen_contents``'s."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _tensor(name, cu)
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"{name} must be 1-D of length batch + 1 >= 1, got {tuple(cu.shape)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must have one length (batch + 1), got "
            f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
        )
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if seqused_k is not None:
        _tensor("seqused_k", seqused_k)
        if seqused_k.dtype != torch.int32:
            raise TypeError(f"seqused_k must be torch.int32, got {seqused_k.dtype}")
        batch = cu_seqlens_q.shape[0] - 1
        if tuple(seqused_k.shape) != (batch,):
            raise ValueError(f"seqused_k must have shape (batch,) = ({batch},), got {tuple(seqused_k.shape)}")


def check_varlen_devices(q, **tensors):
    """The varlen bookkeeping tensors on q's device."""
    for name, x in tensors.items():
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {x.device}")


def check_varlen_contents(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k):
    """Under CUTEATTN_CHECK_INPUTS=1 (it reads the tensors: a host sync): the cumulative
    lengths start at 0, never decrease and end within the packed tensors; no sequence is longer
    than its max_seqlen (the kernels size their grids by it and assume it); seqused_k within
    each sequence's keys. Without the switch the kernels assume all of it."""
    import os

    if os.environ.get(CHECK_INPUTS_ENV, "0") in ("", "0"):
        return
    for name, cu, total, longest in (
        ("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
        ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k),
    ):
        values = cu.tolist()
        if values[0] != 0 or any(b < a for a, b in zip(values, values[1:])):
            raise ValueError(f"{name} must start at 0 and never decrease, got {values}")
        if values[-1] > total:
            raise ValueError(f"{name}[-1] = {values[-1]} exceeds the packed length {total}")
        lengths = [b - a for a, b in zip(values, values[1:])]
        if lengths and max(lengths) > longest:
            raise ValueError(
                f"a sequence of {max(lengths)} rows is longer than max_seqlen "
                f"({longest}) for {name}: the kernels assume none is"
            )
    if seqused_k is not None:
        keys = [b - a for a, b in zip(cu_seqlens_k.tolist(), cu_seqlens_k.tolist()[1:])]
        used = seqused_k.tolist()
        if any(not 0 <= u <= n for u, n in zip(used, keys)):
            raise ValueError(f"seqused_k must be within each sequence's keys {keys}, got {used}")


def check_devices(q, k, v, out=None):
    """All tensors on the device of q, and that device a CUDA one."""
    for name, x in (("k", k), ("v", v), ("out", out)):
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {x.device}")
    if q.device.type != "cuda":
        raise ValueError(f"q, k and v must be on a CUDA device, got {q.device}")


def has_memory(*tensors: torch.Tensor) -> bool:
    """Whether the tensors hold memory whose addresses can be read.

    False while torch.compile traces (dynamo's tensors are fake), for fake tensors
    (FakeTensorMode, the fake implementation of an op) and for meta tensors.
    """
    if torch.compiler.is_compiling():
        return False
    return not any(is_fake(x) or x.device.type == "meta" for x in tensors)


def _out_not_addressable(out: torch.Tensor) -> ValueError:
    return ValueError(
        "out must have a contiguous last dim, other strides that are multiples of "
        f"{ALIGN_BYTES // out.element_size()} elements (16 bytes) and a 16-byte aligned "
        f"start; got strides {out.stride()}"
    )


def check_out_memory(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """out's checks that read addresses: kernel-addressable (aligned start), no overlap.

    Tensors with memory only (``has_memory``). ``check_forward`` calls it for eager calls, so
    its errors come in the documented order; the forward custom op calls it again on the real
    tensors it gets, the first real ones a torch.compile'd call sees.
    """
    if not kernel_addressable(out):
        raise _out_not_addressable(out)
    check_out_overlap(out, q, k, v)


def _strides_addressable(x: torch.Tensor) -> bool:
    # Strides of size-1 dims count too: the compiled kernel declares every stride 16-byte
    # divisible, which a fresh compact copy satisfies when dim % 8 == 0.
    align_elems = ALIGN_BYTES // x.element_size()
    return x.stride(-1) == 1 and not any(s % align_elems for s in x.stride()[:-1])


def kernel_addressable(x: torch.Tensor) -> bool:
    """True when the kernel can read x in place: contiguous last dim, 16-byte aligned rows.

    Reads x's address: for tensors with memory only (``has_memory``).
    """
    return _strides_addressable(x) and x.data_ptr() % ALIGN_BYTES == 0


def kernel_ready(x: torch.Tensor) -> torch.Tensor:
    """x itself when the kernel can address it, else a fresh compact copy (never a misread).

    Not ``contiguous()``: a tensor torch calls contiguous may still start misaligned or carry an
    odd stride on a size-1 dim, and ``contiguous()`` returns it unchanged.
    """
    return x if kernel_addressable(x) else x.clone(memory_format=torch.contiguous_format)
