"""flash_attn_varlen_func on the CPU: argument checks (before any launch), the debug-switch
content checks, planning (packed batches go to the sm80 family, with the varlen options), and
the op's plumbing end to end with the reference standing in for the kernel."""

import itertools

import pytest
import torch

import cuteattn
from cuteattn import ops, reference, validate
from cuteattn.runtime.arch import ARCH_ENV
from cuteattn.testing import dispatched_ops

LENGTHS_Q = (5, 0, 17, 1)
LENGTHS_K = (9, 4, 0, 30)


def packed(
    lengths_q=LENGTHS_Q, lengths_k=LENGTHS_K, heads=(4, 2), dim=64, dtype=torch.bfloat16,
    device="cpu",
):
    heads_q, heads_kv = heads
    q = torch.randn(sum(lengths_q), heads_q, dim, dtype=dtype, device=device)
    k = torch.randn(sum(lengths_k), heads_kv, dim, dtype=dtype, device=device)
    v = torch.randn(sum(lengths_k), heads_kv, dim, dtype=dtype, device=device)

    def cumulative(lengths):
        return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)

    return q, k, v, cumulative(lengths_q), cumulative(lengths_k)


@pytest.fixture
def cpu_launch(monkeypatch):
    """The op on CPU tensors: an sm_90a device, the reference in place of the kernel (it reads
    the same views and bookkeeping the kernel gets)."""
    calls = []

    def launch(q, k, v, out, softmax_scale, plan, sink=None, varlen=None):
        calls.append({"plan": plan, "varlen": varlen})
        cu_q, cu_k, seqused_k, max_seqlen_q = varlen
        expected, lse = reference.attention(
            q[0], k[0], v[0], softmax_scale=softmax_scale, causal=plan.causal,
            window_size=plan.option("window") or (None, None),
            softcap=plan.option("softcap", 0.0), learnable_sink=sink,
            cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=seqused_k,
        )
        out[0].copy_(expected)
        return lse.unsqueeze(0)

    monkeypatch.setenv(ARCH_ENV, "sm_90a")
    monkeypatch.setattr(validate, "check_devices", lambda *tensors: None)
    monkeypatch.setattr(ops, "launch_forward", launch)
    return calls


def call(q, k, v, cu_q, cu_k, **kwargs):
    return cuteattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(LENGTHS_Q), max(LENGTHS_K), **kwargs
    )


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(causal=True), dict(window_size=(3, 2)), dict(softcap=5.0),
     dict(learnable_sink=torch.randn(4))],
    ids=["dense", "causal", "window", "softcap", "sink"],
)
def test_varlen_reaches_the_planned_kernel_and_matches_the_reference(cpu_launch, kwargs):
    q, k, v, cu_q, cu_k = packed()
    out, lse = call(q, k, v, cu_q, cu_k, return_lse=True, **kwargs)
    plan = cpu_launch[-1]["plan"]
    assert (plan.family, plan.option("varlen")) == ("sm90", True)  # the forward on Hopper
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    expected, expected_lse = reference.attention(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kwargs
    )
    torch.testing.assert_close(out, expected.to(out.dtype))
    torch.testing.assert_close(lse, expected_lse)


def test_seqused_k_is_a_plan_option(cpu_launch):
    q, k, v, cu_q, cu_k = packed()
    used = torch.tensor([3, 4, 0, 7], dtype=torch.int32)
    out = call(q, k, v, cu_q, cu_k, seqused_k=used)
    plan = cpu_launch[-1]["plan"]
    assert (plan.family, plan.option("seqused_k")) == ("sm90", True)
    expected, _ = reference.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used)
    torch.testing.assert_close(out, expected.to(out.dtype))


def test_no_sequence_or_no_key_launches_nothing(cpu_launch):
    q, k, v, cu_q, cu_k = packed()
    out, lse = cuteattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 0, return_lse=True)
    assert not cpu_launch and torch.count_nonzero(out) == 0 and torch.isneginf(lse).all()
    empty = torch.zeros(1, dtype=torch.int32)
    out = cuteattn.flash_attn_varlen_func(q, k, v, empty, empty, 17, 30)
    assert not cpu_launch and torch.count_nonzero(out) == 0


@pytest.mark.parametrize(
    "change,error,message",
    [
        (lambda a: {**a, "q": a["q"].unsqueeze(0)}, ValueError, r"q must have 3 dimensions"),
        (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].long()}, TypeError,
         r"cu_seqlens_q must be torch.int32"),
        (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][:-1]}, ValueError,
         r"cu_seqlens_q and cu_seqlens_k must have one length"),
        (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].view(1, -1)}, ValueError,
         r"cu_seqlens_q must be 1-D"),
        (lambda a: {**a, "max_seqlen_q": 17.0}, TypeError, r"max_seqlen_q must be an int"),
        (lambda a: {**a, "max_seqlen_k": -1}, ValueError, r"max_seqlen_k must be >= 0"),
        (lambda a: {**a, "seqused_k": torch.zeros(3, dtype=torch.int32)}, ValueError,
         r"seqused_k must have shape \(batch,\) = \(4,\)"),
        (lambda a: {**a, "seqused_k": torch.zeros(4)}, TypeError, r"seqused_k must be torch.int32"),
        (lambda a: {**a, "seqused_q": torch.zeros(4, dtype=torch.int32)}, NotImplementedError,
         r"seqused_q is not supported yet"),
        (lambda a: {**a, "causal": 1}, TypeError, r"causal must be a Python bool"),
        (lambda a: {**a, "window_size": (-2, 0)}, ValueError, r"window_size left must be >= 0"),
    ],
)
def test_bad_varlen_arguments(cpu_launch, change, error, message):
    q, k, v, cu_q, cu_k = packed()
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=17,
                max_seqlen_k=30)
    with pytest.raises(error, match=message):
        cuteattn.flash_attn_varlen_func(**change(args))
    assert not cpu_launch


def test_cu_seqlens_on_another_device(cpu_launch):
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be on the device of q"):
        call(q, k, v, cu_q, cu_k.to("meta"))


def test_autograd_through_the_varlen_ops(cpu_launch, monkeypatch):
    """Inputs that require grad record cuteattn::varlen_attention; its eager backward runs
    cuteattn::varlen_backward's function, not the op (``ops.eager_call``; the reference
    standing in for the kernels here); the grads equal the reference's autograd."""
    def launch_backward(dout, q, k, v, out, lse, cu_q, cu_k, seqused_k, max_q, max_k, scale,
                        plan):
        assert plan.kind == "backward" and plan.option("varlen") is True

        def output(q, k, v):
            return reference.attention(
                q, k, v, softmax_scale=scale, causal=plan.causal, cu_seqlens_q=cu_q,
                cu_seqlens_k=cu_k, seqused_k=seqused_k,
            )[0]

        _, vjp = torch.func.vjp(output, q, k, v)
        return tuple(g.to(x.dtype) for g, x in zip(vjp(dout.float()), (q, k, v)))

    monkeypatch.setattr(ops, "launch_varlen_backward", launch_backward)
    q, k, v, cu_q, cu_k = (x.float() if x.is_floating_point() else x for x in packed())
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = cuteattn.flash_attn_varlen_func(
        *[x.to(torch.bfloat16) for x in leaves], cu_q, cu_k, 17, 30, causal=True
    )
    dout = torch.randn_like(out)
    assert dispatched_ops(lambda: out.backward(dout)) == set()
    ref_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref_out, _ = reference.attention(
        *[x.to(torch.bfloat16) for x in ref_leaves], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        causal=True,
    )
    (ref_out * dout.float()).sum().backward()
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad, atol=2e-2, rtol=2e-2)


def test_content_checks_run_under_the_debug_switch(cpu_launch, monkeypatch):
    q, k, v, cu_q, cu_k = packed()
    descending = cu_q.clone()
    descending[2] = 1
    # Without the switch the contents are assumed, never read (no host sync).
    assert validate.check_varlen_contents(q, k, descending, cu_k, 17, 30, None) is None
    monkeypatch.setenv(validate.CHECK_INPUTS_ENV, "1")
    with pytest.raises(ValueError, match=r"cu_seqlens_q must start at 0 and never decrease"):
        call(q, k, v, descending, cu_k)
    with pytest.raises(ValueError, match=r"longer than max_seqlen \(16\) for cu_seqlens_q"):
        cuteattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 16, 30)
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\] = 43 exceeds the packed length 42"):
        call(q, k[:-1], v[:-1], cu_q, cu_k)
    with pytest.raises(ValueError, match=r"seqused_k must be within each sequence's keys"):
        call(q, k, v, cu_q, cu_k, seqused_k=torch.tensor([10, 0, 0, 0], dtype=torch.int32))
    call(q, k, v, cu_q, cu_k)  # well-formed inputs pass


def test_compile_fullgraph_traces_the_varlen_op(monkeypatch):
    """Fake CUDA inputs: dynamo traces flash_attn_varlen_func (validation included) without a
    graph break and records one cuteattn::varlen_inference; the fake runs it on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.delenv(validate.CHECK_INPUTS_ENV, raising=False)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def varlen(q, k, v, cu_q, cu_k):
        return cuteattn.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, 17, 30, causal=True, window_size=(8, 0), return_lse=True
        )

    torch._dynamo.reset()
    with FakeTensorMode():
        q, k, v, cu_q, cu_k = packed(device="cuda")
        out, lse = torch.compile(varlen, backend=backend, fullgraph=True)(q, k, v, cu_q, cu_k)
    (gm,) = graphs
    calls = [
        node for node in gm.graph.nodes
        if node.op == "call_function" and node.target == torch.ops.cuteattn.varlen_inference.default
    ]
    assert len(calls) == 1
    assert out.shape == q.shape and lse.shape == (4, q.shape[0]) and lse.dtype == torch.float32


def test_dsink_ignores_rows_of_no_sequence():
    """Rows past cu_seqlens_q[-1] are never written (garbage lse and out): they must not reach
    dsink."""
    lse = torch.tensor([[[0.5, 1.0, float("nan")]]])  # (1, heads, rows): the last row unwritten
    out = torch.ones(1, 3, 1, 4)
    out[0, 2] = float("nan")
    dout = torch.ones(1, 3, 1, 4)
    covered = torch.tensor([True, True, False])
    got = ops.sink_grad(torch.tensor([0.0]), lse, out, dout, covered)
    expected = -(torch.exp(-torch.tensor([0.5, 1.0])) * 4).sum()
    torch.testing.assert_close(got, expected.view(1))


@pytest.mark.parametrize(
    "rows,threads_per_row,num_threads,used",
    [(128, 8, 256, 256), (48, 8, 256, 128), (64, 4, 128, 128), (80, 8, 128, 128), (48, 8, 128, 128),
     (112, 8, 128, 128), (16, 8, 256, 128)],
)
def test_row_store_threads_tile_the_rows_exactly(rows, threads_per_row, num_threads, used):
    """The sm90 dQ postprocess stores a tile's rows with 16-byte stores: the storing threads'
    row blocks tile the tile's rows exactly, never past its end (80- and 48-row tiles)."""
    from cuteattn.kernels.sm90.smem import row_store_threads

    got = row_store_threads(rows, threads_per_row, num_threads)
    assert got == used and rows % (got // threads_per_row) == 0 and got <= num_threads


@pytest.mark.parametrize("elem_bytes", (2, 4))
@pytest.mark.parametrize("row_stride", (8, 64 * 40, 32 * 128, 3 * 2**20))
def test_ragged_tma_coordinates_address_the_sequence_rows(elem_bytes, row_stride):
    """The sm90 kernels' ragged TMA views (``kernels/sm90/ragged.py``): the coordinates of a
    sequence's row r, (ROWS_BOUND - length + r, ..., ROWS_BOUND, offset + length) with the
    view's strides, address packed row offset + r modulo 2^64 bytes; its rows stay inside the
    rows mode exactly while r < length; every coordinate and byte stride fits TMA's limits
    (int32 coordinates, strides below 2^40 bytes, multiples of 16 bytes)."""
    from cuteattn.kernels.sm90.ragged import EXTRA_MODE, ROWS_BOUND, WRAP_STRIDE

    strides = (row_stride, WRAP_STRIDE - row_stride, row_stride)  # rows, then the extra modes
    for stride in strides:
        assert 0 < stride * elem_bytes < 2**40 and (stride * elem_bytes) % 16 == 0
    for offset, length in ((0, 1), (5, 4096), (2**31 - 9000, 8192), (123_456, 2**20)):
        for r in (0, length - 1, length, length + 127):
            coords = (ROWS_BOUND - length + r, ROWS_BOUND, offset + length)
            assert all(0 <= c < 2**31 for c in coords) and coords[2] < EXTRA_MODE
            address = sum(c * s for c, s in zip(coords, strides)) * elem_bytes % 2**64
            assert address == (offset + r) * row_stride * elem_bytes
            assert (coords[0] < ROWS_BOUND) == (r < length)
