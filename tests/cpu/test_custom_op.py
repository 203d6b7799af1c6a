"""The forward as one torch.library custom op (torch.ops.cuteattn.forward), on the CPU.

No GPU here, so two stand-ins: fake CUDA tensors (FakeTensorMode makes them on a CPU-only
build) for everything that only traces, and, where the op must really run, a CPU launch
(``ops.launch_forward`` replaced by the reference writing ``out``) with CUTEATTN_ARCH naming
the arch the op plans for. The kernel itself is the GPU tests' business.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cuteattn
from cuteattn import api, ops, reference, validate
from cuteattn.runtime.arch import ARCH_ENV
from cuteattn.testing import OpRecorder, dispatched_ops

OP = torch.ops.cuteattn.forward.default
INFERENCE = torch.ops.cuteattn.inference.default

SHAPES = {
    # name: (batch, seqlen_q, seqlen_k, heads_q, heads_kv, dim)
    "mha": (2, 16, 16, 4, 4, 64),
    "gqa": (2, 16, 24, 4, 2, 64),
    "mqa_decode": (3, 1, 40, 8, 1, 128),
}


# torch.compile caches would carry graphs (and their guards) from test to test.
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def qkv(shape="gqa", dtype=torch.bfloat16, device="cpu"):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dim = SHAPES[shape]
    q = torch.randn(batch, seqlen_q, heads_q, dim, dtype=dtype, device=device)
    k = torch.randn(batch, seqlen_k, heads_kv, dim, dtype=dtype, device=device)
    v = torch.randn(batch, seqlen_k, heads_kv, dim, dtype=dtype, device=device)
    return q, k, v


@pytest.fixture
def cpu_launch(monkeypatch):
    """Run the op on CPU tensors: an sm_90a plan, the reference in place of the kernel."""
    calls = []

    def launch(q, k, v, out, softmax_scale, plan, sink=None):
        calls.append({"q": q, "out": out, "plan": plan, "softmax_scale": softmax_scale})
        assert (sink is not None) == plan.option("sink", False)
        expected, lse = reference.attention(
            q, k, v, softmax_scale=softmax_scale, causal=plan.causal,
            softcap=plan.option("softcap", 0.0), learnable_sink=sink,
            window_size=plan.option("window") or (None, None),
        )
        out.copy_(expected)
        return lse

    monkeypatch.setenv(ARCH_ENV, "sm_90a")
    monkeypatch.setattr(api.validate, "check_devices", lambda *tensors: None)
    monkeypatch.setattr(ops, "launch_forward", launch)
    return calls


@pytest.fixture
def no_launch(monkeypatch):
    """Tracing must never reach the launch (nor plan: no CUTEATTN_ARCH is set)."""

    def launch(*args):
        raise AssertionError("traced code reached the launch")

    monkeypatch.delenv(ARCH_ENV, raising=False)
    monkeypatch.setattr(ops, "launch_forward", launch)


def assert_matches_reference(out, lse, q, k, v, *, causal, softmax_scale=None):
    expected, expected_lse = reference.attention(
        q, k, v, softmax_scale=softmax_scale, causal=causal
    )
    torch.testing.assert_close(out, expected.to(out.dtype))
    torch.testing.assert_close(lse, expected_lse)


# Registration ---------------------------------------------------------------------------


def test_the_op_is_registered_with_its_schema():
    assert OP.name() == "cuteattn::forward"
    assert str(OP._schema) == (
        "cuteattn::forward(Tensor q, Tensor k, Tensor v, Tensor(a3!) out, float softmax_scale, "
        "bool causal, SymInt window_left, SymInt window_right, float softcap, "
        "Tensor? learnable_sink, str? family) -> Tensor"
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck(cpu_launch, shape, causal):
    """Schema (out mutated, lse new), fake vs real metadata, autograd registration (none, no
    input requires grad) and aot_dispatch_dynamic: every opcheck test, the CPU launch real."""
    q, k, v = qkv(shape)
    out = torch.empty_like(q)
    torch.library.opcheck(OP, (q, k, v, out, 0.125, causal, -1, -1, 0.0, None, None))
    torch.library.opcheck(OP, (q, k, v, out, 0.125, causal, -1, -1, 0.0, None, "sm80"))
    for return_lse in (True, False):
        torch.library.opcheck(
            INFERENCE, (q, k, v, 0.125, causal, -1, -1, 0.0, None, None, return_lse)
        )


def test_fp16(cpu_launch):
    q, k, v = qkv("mha", dtype=torch.float16)
    torch.library.opcheck(OP, (q, k, v, torch.empty_like(q), 0.125, True, -1, -1, 0.0, None, None))


# Eager ----------------------------------------------------------------------------------


def test_an_observed_call_goes_through_the_op(cpu_launch):
    """Seen by a dispatch mode: without out, the functional inference op (it allocates out);
    with one, the op that writes into it."""
    q, k, v = qkv()
    with OpRecorder() as recorder:
        out, lse = cuteattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert recorder.ops == [INFERENCE]
    assert cpu_launch[-1]["plan"].arch == "sm_90a" and cpu_launch[-1]["out"] is out
    assert_matches_reference(out, lse, q, k, v, causal=True)
    given = torch.empty_like(q)
    with OpRecorder() as recorder:
        got, lse = cuteattn.flash_attn_func(q, k, v, out=given, return_lse=True)
    assert recorder.ops == [OP] and got is given and cpu_launch[-1]["out"] is given
    assert_matches_reference(given, lse, q, k, v, causal=False)


def test_an_eager_inference_call_runs_the_op_function(cpu_launch):
    """Unobserved and recording no gradient (ops.eager_call): the inference op's function
    runs without the op's dispatch (its host time is a short call's GPU idle time); the
    mutating op (a given out) keeps its dispatch, which bumps out's version counter."""
    q, k, v = qkv()
    results = []
    assert dispatched_ops(
        lambda: results.append(cuteattn.flash_attn_func(q, k, v, causal=True, return_lse=True))
    ) == set()
    (out, lse), = results
    assert cpu_launch[-1]["out"] is out
    assert_matches_reference(out, lse, q, k, v, causal=True)
    given = torch.empty_like(q)
    version = given._version
    assert dispatched_ops(lambda: cuteattn.flash_attn_func(q, k, v, out=given)) == {
        "cuteattn::forward"
    }
    assert given._version > version


def test_the_op_plans_with_the_family_it_is_given(cpu_launch):
    q, k, v = qkv()
    cuteattn.flash_attn_func(q, k, v)
    assert cpu_launch[-1]["plan"].family == "sm90"
    api.forward(q, k, v, family="sm80")
    assert cpu_launch[-1]["plan"].family == "sm80"


def test_the_op_refuses_an_out_overlapping_an_input(cpu_launch):
    """Called directly, as a compiled graph calls it: the real implementation checks out's
    memory before the launch."""
    q, k, v = qkv("mha")
    with pytest.raises(ValueError, match=r"^out must not overlap q: "):
        OP(q, k, v, q, 0.125, False, -1, -1, 0.0, None, None)
    with pytest.raises(ValueError, match=r"^out must not overlap v: "):
        OP(q, k, v, v, 0.125, False, -1, -1, 0.0, None, None)
    assert cpu_launch == []


def test_the_op_refuses_a_misaligned_out(cpu_launch):
    q, k, v = qkv()
    out = torch.empty(q.numel() + 8, dtype=q.dtype)[1 : 1 + q.numel()].view(q.shape)
    with pytest.raises(ValueError, match=r"16-byte aligned start"):
        OP(q, k, v, out, 0.125, False, -1, -1, 0.0, None, None)
    assert cpu_launch == []


def test_the_op_makes_its_inputs_kernel_addressable(cpu_launch):
    q, k, v = qkv()
    misaligned = torch.empty(q.numel() + 8, dtype=q.dtype)[1 : 1 + q.numel()].view(q.shape)
    misaligned.copy_(q)
    out = torch.empty_like(q)
    lse = OP(misaligned, k, v, out, 0.125, False, -1, -1, 0.0, None, None)
    launched = cpu_launch[-1]["q"]
    assert launched is not misaligned and validate.kernel_addressable(launched)
    assert_matches_reference(out, lse, q, k, v, causal=False, softmax_scale=0.125)


def test_inputs_that_require_grad_take_the_training_op(cpu_launch):
    """With grad, flash_attn_func records cuteattn::attention (tests/cpu/test_training_op.py);
    without, cuteattn::inference."""
    q, k, v = qkv()
    q.requires_grad_()
    with OpRecorder() as recorder:
        cuteattn.flash_attn_func(q, k, v)
        with torch.no_grad():
            cuteattn.flash_attn_func(q, k, v)
    cuteattn_ops = [op for op in recorder.ops if op.namespace == "cuteattn"]
    assert cuteattn_ops == [torch.ops.cuteattn.attention.default, INFERENCE]


# Fake tensors ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fake_cuda_tensors_give_out_and_lse_metadata(no_launch, shape, dtype):
    with FakeTensorMode():
        q, k, v = qkv(shape, dtype=dtype, device="cuda")
        out, lse = cuteattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
        given = torch.empty_like(q)
        got, _ = cuteattn.flash_attn_func(q, k, v, out=given, return_lse=True)
    batch, seqlen_q, heads_q, dim = q.shape
    assert (out.shape, out.dtype, out.device.type) == (q.shape, dtype, "cuda")
    assert (lse.shape, lse.dtype, lse.device.type) == (
        (batch, heads_q, seqlen_q), torch.float32, "cuda"
    )
    assert lse.is_contiguous()
    assert got is given


def test_lse_shape_is_the_one_helper():
    q = torch.empty(3, 5, 8, 64, device="meta")
    assert ops.lse_shape(q) == (3, 8, 5)
    assert ops.empty_lse(q).shape == (3, 8, 5) and ops.empty_lse(q).dtype == torch.float32


# torch.compile --------------------------------------------------------------------------


class GraphRecorder:
    """A torch.compile backend that keeps each graph and runs it as traced."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def op_calls(self, op=INFERENCE):
        (gm,) = self.graphs  # one graph: no graph break
        return [node for node in gm.graph.nodes if node.op == "call_function" and node.target == op]


def attention(q, k, v):
    return cuteattn.flash_attn_func(q, k, v, causal=True, return_lse=True)


def attention_into(q, k, v, out):
    return cuteattn.flash_attn_func(q, k, v, 0.0, 0.5, out=out, return_lse=True)


def test_compile_fullgraph_traces_one_op(no_launch):
    """Fake CUDA inputs: dynamo traces the api code (validation included) without a break and
    records exactly one cuteattn op; the graph then runs on the fake tensors."""
    recorder = GraphRecorder()
    with FakeTensorMode():
        q, k, v = qkv(device="cuda")
        out, lse = torch.compile(attention, backend=recorder, fullgraph=True)(q, k, v)
    (call,) = recorder.op_calls()
    assert call.args[3:] == (64**-0.5, True, -1, -1, 0.0, None, None, True)
    assert recorder.op_calls(OP) == []
    assert out.shape == q.shape and lse.shape == (2, 4, 16) and lse.dtype == torch.float32


def test_compile_fullgraph_with_a_given_out(no_launch):
    recorder = GraphRecorder()
    with FakeTensorMode():
        q, k, v = qkv(device="cuda")
        out = torch.empty_like(q)
        got, _ = torch.compile(attention_into, backend=recorder, fullgraph=True)(q, k, v, out)
    (call,) = recorder.op_calls(OP)
    assert call.args[3].op == "placeholder"  # the caller's out, not a new buffer
    assert call.args[4:] == (0.5, False, -1, -1, 0.0, None, None)
    assert got is out


def test_explain_finds_no_graph_break(no_launch):
    with FakeTensorMode():
        q, k, v = qkv(device="cuda")
        explanation = torch._dynamo.explain(attention)(q, k, v)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_call_runs(cpu_launch, backend):
    """On real CPU tensors through the CPU launch: aot_eager functionalizes the op's mutation
    of out, which must still land in the caller's out."""
    q, k, v = qkv()
    compiled = torch.compile(attention_into, backend=backend, fullgraph=True)
    out = torch.empty_like(q)
    got, lse = compiled(q, k, v, out)
    assert got is out
    assert_matches_reference(out, lse, q, k, v, causal=False, softmax_scale=0.5)
    out, lse = torch.compile(attention, backend=backend, fullgraph=True)(q, k, v)
    assert_matches_reference(out, lse, q, k, v, causal=True)


def test_compiled_call_with_dynamic_shapes(cpu_launch):
    recorder = GraphRecorder()
    compiled = torch.compile(attention, backend=recorder, fullgraph=True, dynamic=True)
    for seqlen_q, seqlen_k in ((16, 24), (33, 40)):
        q = torch.randn(2, seqlen_q, 4, 64, dtype=torch.bfloat16)
        k, v = torch.randn(2, 2, seqlen_k, 2, 64, dtype=torch.bfloat16).unbind(0)
        out, lse = compiled(q, k, v)
        assert_matches_reference(out, lse, q, k, v, causal=True)
    assert len(recorder.op_calls()) == 1  # one graph for both sizes
    assert [call["q"].shape[1] for call in cpu_launch] == [16, 33]


def test_compiled_call_checks_out_memory_when_it_runs(cpu_launch):
    """Tracing saw fake tensors, so the alignment check of out runs in the op, on the real out."""
    q, k, v = qkv()
    compiled = torch.compile(attention_into, backend="aot_eager", fullgraph=True)
    out = torch.empty(q.numel() + 8, dtype=q.dtype)[1 : 1 + q.numel()].view(q.shape)
    with pytest.raises(ValueError, match=r"16-byte aligned start"):
        compiled(q, k, v, out)
    assert cpu_launch == []


def test_planner_errors_reach_a_compiled_caller_unchanged(cpu_launch):
    """The fake implementation does not plan; the real one raises the planner's error, as
    eager calls do, before any launch."""
    q, k = (torch.randn(1, 8, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, 8, 2, 32, dtype=torch.bfloat16)  # dim_v != dim: no family yet
    compiled = torch.compile(attention, backend="aot_eager", fullgraph=True)
    with pytest.raises(NotImplementedError, match=r"no kernel family can run this problem"):
        compiled(q, k, v)
    assert cpu_launch == []


def test_softcap_reaches_the_plan_and_the_kernel(cpu_launch):
    """softcap travels through the op into the plan (an option of every family's plan); the
    stand-in launch computes the reference with the plan's value, so the result shows it."""
    q, k, v = qkv("gqa")
    out = torch.empty_like(q)
    lse = OP(q, k, v, out, 0.125, True, -1, -1, 5.0, None, None)
    plan = cpu_launch[-1]["plan"]
    assert plan.option("softcap") == 5.0
    expected, expected_lse = reference.attention(q, k, v, softmax_scale=0.125, causal=True, softcap=5.0)
    torch.testing.assert_close(out, expected.to(out.dtype))
    torch.testing.assert_close(lse, expected_lse)
    OP(q, k, v, out, 0.125, True, -1, -1, 0.0, None, "sm80")
    assert cpu_launch[-1]["plan"].option("softcap") is None


@pytest.mark.parametrize("window", [(3, 0), (-1, 5), (4, 4), (0, 0)])
def test_windows_reach_the_plan_and_the_kernel(cpu_launch, window):
    """A window travels through the op's two ints into the plan; the stand-in launch computes
    the reference with the plan's window."""
    q, k, v = qkv("gqa")
    out = torch.empty_like(q)
    lse = OP(q, k, v, out, 0.125, False, *window, 0.0, None, None)
    assert cpu_launch[-1]["plan"].option("window") == window
    expected, expected_lse = reference.attention(q, k, v, softmax_scale=0.125, window_size=window)
    torch.testing.assert_close(out, expected.to(out.dtype))
    torch.testing.assert_close(lse, expected_lse)
