"""Training through the custom ops (torch.ops.cuteattn.attention / backward), on the CPU.

As in test_custom_op.py, no GPU: CPU tensors pretend to sit on an sm_90a device and the two
launches are replaced, the forward by the reference writing out, the backward by the
reference's autograd gradients, so what is tested is the wiring: autograd registration,
saved tensors, scale / causal / family reaching the backward plan, fake implementations,
torch.compile. The kernels are the GPU tests' business (tests/gpu/test_backward.py).
"""

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import FakeTensorMode

import cuteattn
from cuteattn import api, ops, reference
from cuteattn.runtime.arch import ARCH_ENV
from cuteattn.testing import OpRecorder, dispatched_ops, reference_grads

ATTENTION = torch.ops.cuteattn.attention.default
BACKWARD = torch.ops.cuteattn.backward.default


# torch.compile caches would carry graphs (and their guards) from test to test.
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def qkv(dtype=torch.bfloat16, device="cpu", requires_grad=True, shape=(2, 16, 24, 4, 2, 64)):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dim = shape
    tensors = (
        torch.randn(batch, seqlen_q, heads_q, dim, dtype=dtype, device=device),
        torch.randn(batch, seqlen_k, heads_kv, dim, dtype=dtype, device=device),
        torch.randn(batch, seqlen_k, heads_kv, dim, dtype=dtype, device=device),
    )
    return tuple(t.requires_grad_(requires_grad) for t in tensors)


def explicit_grads(q, k, v, dout, *, causal, softmax_scale):
    """The attention backward written out in fp32 (no autograd: the launch stand-in runs inside
    an op, below the autograd key, where opcheck's wrappers also forbid torch.func)."""
    q, k, v, dout = (x.float() for x in (q, k, v, dout))
    group = q.shape[2] // k.shape[2]
    k_full, v_full = (x.repeat_interleave(group, dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k_full) * softmax_scale
    if causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        rows = torch.arange(seqlen_q)[:, None]
        cols = torch.arange(seqlen_k)[None, :]
        scores = scores.masked_fill(cols > rows + seqlen_k - seqlen_q, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v_full)
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, dout)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", dout, v_full)
    dpsum = (dout * out).sum(-1).transpose(1, 2)[..., None]
    dscores = probs * (dprobs - dpsum)
    dq = torch.einsum("bhqk,bkhd->bqhd", dscores, k_full) * softmax_scale
    dk = torch.einsum("bhqk,bqhd->bkhd", dscores, q) * softmax_scale

    def per_kv_head(grad):
        batch, seqlen_k, _, dim = grad.shape
        return grad.view(batch, seqlen_k, -1, group, dim).sum(3)

    return dq, per_kv_head(dk), per_kv_head(dv)


@pytest.mark.parametrize("causal", [False, True])
def test_explicit_grads_match_the_reference(causal):
    q, k, v = (x.float() for x in qkv(requires_grad=False, shape=(2, 20, 9, 4, 2, 32)))
    dout = torch.randn_like(q)
    want = reference_grads(q, k, v, dout, causal=causal, softmax_scale=0.3)
    for got, expected in zip(explicit_grads(q, k, v, dout, causal=causal, softmax_scale=0.3), want):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.fixture
def cpu_launches(monkeypatch):
    """Both launches on CPU tensors through the reference; each call is recorded."""
    calls = []

    def launch_forward(q, k, v, out, softmax_scale, plan, sink=None):
        calls.append(("forward", plan, softmax_scale))
        expected, lse = reference.attention(
            q, k, v, softmax_scale=softmax_scale, causal=plan.causal, learnable_sink=sink
        )
        out.copy_(expected)
        return lse

    def launch_backward(dout, q, k, v, out, lse, softmax_scale, plan):
        calls.append(("backward", plan, softmax_scale))
        grads = explicit_grads(q, k, v, dout, causal=plan.causal, softmax_scale=softmax_scale)
        return tuple(g.to(x.dtype).contiguous() for g, x in zip(grads, (q, k, v)))

    monkeypatch.setenv(ARCH_ENV, "sm_90a")
    monkeypatch.setattr(api.validate, "check_devices", lambda *tensors: None)
    monkeypatch.setattr(ops, "launch_forward", launch_forward)
    monkeypatch.setattr(ops, "launch_backward", launch_backward)
    return calls


@pytest.fixture
def no_launch(monkeypatch):
    def launch(*args):
        raise AssertionError("traced code reached a launch")

    monkeypatch.delenv(ARCH_ENV, raising=False)
    monkeypatch.setattr(ops, "launch_forward", launch)
    monkeypatch.setattr(ops, "launch_backward", launch)


def test_the_ops_are_registered_with_their_schemas():
    assert str(ATTENTION._schema) == (
        "cuteattn::attention(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, "
        "SymInt window_left, SymInt window_right, float softcap, Tensor? learnable_sink, "
        "str? family, bool deterministic) -> (Tensor, Tensor)"
    )
    assert str(BACKWARD._schema) == (
        "cuteattn::backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "float softmax_scale, bool causal, SymInt window_left, SymInt window_right, "
        "float softcap, str? family, bool deterministic) -> "
        "(Tensor, Tensor, Tensor)"
    )


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_flow_through_the_ops(cpu_launches, causal):
    q, k, v = qkv()
    out = cuteattn.flash_attn_func(q, k, v, 0.0, 0.3, causal)
    dout = torch.randn_like(out)
    out.backward(dout)
    expected = reference_grads(q, k, v, dout, causal=causal, softmax_scale=0.3)
    for got, want in zip((q.grad, k.grad, v.grad), expected):
        torch.testing.assert_close(got, want.to(got.dtype))
    (fwd, fwd_plan, fwd_scale), (bwd, bwd_plan, bwd_scale) = cpu_launches
    assert (fwd, bwd) == ("forward", "backward")
    assert fwd_plan.family == "sm90" and fwd_plan.kind == "forward"
    # Hopper's backward family for d64 (qkv()'s head dim): sm90.
    assert (bwd_plan.family, bwd_plan.kind, bwd_plan.causal) == ("sm90", "backward", causal)
    assert fwd_scale == bwd_scale == 0.3


def test_eager_autograd_runs_the_backward_function_not_the_op(cpu_launches):
    """The op's dispatch costs host time a short call's GPU waits for (ops.eager_call): an
    eager backward runs the op's function, with the same gradients."""
    q, k, v = qkv()
    out = cuteattn.flash_attn_func(q, k, v, 0.0, 0.3, True)
    dout = torch.randn_like(out)
    assert dispatched_ops(lambda: out.backward(dout)) == set()
    assert [kind for kind, _, _ in cpu_launches] == ["forward", "backward"]
    expected = reference_grads(q, k, v, dout, causal=True, softmax_scale=0.3)
    for got, want in zip((q.grad, k.grad, v.grad), expected):
        torch.testing.assert_close(got, want.to(got.dtype))


def test_a_backward_with_create_graph_goes_through_the_op(cpu_launches):
    """Grad mode on in the backward (create_graph): the op, which refuses a double backward,
    not the bare function, whose gradients would silently carry no graph."""
    q, k, v = qkv()
    out = cuteattn.flash_attn_func(q, k, v)
    grads = []

    def backward():
        grads.extend(torch.autograd.grad(out.sum(), q, create_graph=True))

    assert dispatched_ops(backward) == {"cuteattn::backward"}
    with pytest.raises(RuntimeError, match="autograd"):
        grads[0].sum().backward()


def test_a_dispatch_mode_sees_the_backward_op(cpu_launches):
    """A dispatch mode (a flop counter, a tracer) sees cuteattn::backward, not its insides."""
    q, k, v = qkv()
    out = cuteattn.flash_attn_func(q, k, v)
    with OpRecorder() as seen:
        out.sum().backward()
    assert BACKWARD in seen.ops


def test_a_forced_family_with_a_backward_runs_it(cpu_launches):
    q, k, v = qkv()
    out, _ = api.forward(q, k, v, family="sm80")
    out.sum().backward()
    assert [plan.family for _, plan, _ in cpu_launches] == ["sm80", "sm80"]


def test_only_inputs_that_require_grad_get_it(cpu_launches):
    q, k, v = qkv(requires_grad=False)
    k.requires_grad_()
    cuteattn.flash_attn_func(q, k, v).sum().backward()
    assert q.grad is None and v.grad is None and k.grad is not None


def test_no_grad_runs_the_inference_op(cpu_launches):
    q, k, v = qkv()
    with torch.no_grad():
        out = cuteattn.flash_attn_func(q, k, v)
    assert out.grad_fn is None and [kind for kind, _, _ in cpu_launches] == ["forward"]


def test_out_with_grad_receives_the_result(cpu_launches):
    q, k, v = qkv()
    out = torch.empty(q.shape, dtype=q.dtype)
    got = cuteattn.flash_attn_func(q, k, v, out=out)
    assert got is out and out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None


def test_deterministic_reaches_the_backward_plan(cpu_launches):
    q, k, v = qkv()
    cuteattn.flash_attn_func(q, k, v, deterministic=True).sum().backward()
    cuteattn.flash_attn_func(q, k, v).sum().backward()
    backward_plans = [plan for kind, plan, _ in cpu_launches if kind == "backward"]
    assert [plan.option("deterministic") for plan in backward_plans] == [True, False]
    forward_plans = [plan for kind, plan, _ in cpu_launches if kind == "forward"]
    assert forward_plans[0] == forward_plans[1]  # the forward does not change


def test_an_explicit_forward_plan_does_not_record_a_backward(cpu_launches):
    q, k, v = qkv()
    with torch.no_grad():
        _, _ = api.forward(q, k, v)
    plan = cpu_launches[-1][1]
    with pytest.raises(NotImplementedError, match=r"explicit plan runs the forward only"):
        api.forward(q, k, v, plan=plan)


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck(cpu_launches, causal):
    """Schemas, fake vs real metadata, autograd registration, aot_dispatch: every opcheck
    test, with the CPU launches real."""
    q, k, v = qkv()
    torch.library.opcheck(ATTENTION, (q, k, v, 0.125, causal, -1, -1, 0.0, None, None, False))
    with torch.no_grad():
        out, lse = ATTENTION(q, k, v, 0.125, causal, -1, -1, 0.0, None, None, False)
    dout = torch.randn_like(out)
    for deterministic in (False, True):
        args = (dout, q.detach(), k.detach(), v.detach(), out, lse, 0.125, causal, -1, -1,
                0.0, None, deterministic)
        torch.library.opcheck(BACKWARD, args)


def test_backward_entry_checks_its_inputs(cpu_launches, monkeypatch):
    q, k, v = qkv(requires_grad=False)
    with torch.no_grad():
        out, lse = api.forward(q, k, v)
    dout = torch.randn_like(out)
    with pytest.raises(TypeError, match=r"lse must be torch.float32"):
        api.backward(dout, q, k, v, out, lse.double())
    with pytest.raises(ValueError, match=r"dout must have the shape of the output"):
        api.backward(dout[:, :-1], q, k, v, out, lse)
    # A forced family that cannot run the backward here: sm90 on an sm_80 device.
    monkeypatch.setenv(ARCH_ENV, "sm_80")
    with pytest.raises(NotImplementedError, match=r"cannot run this problem's backward"):
        api.backward(dout, q, k, v, out, lse, family="sm90")
    monkeypatch.setenv(ARCH_ENV, "sm_90a")
    dq, dk, dv = api.backward(dout, q, k, v, out, lse, family="sm80")
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)


# torch.compile --------------------------------------------------------------------------


def training_loss(q, k, v):
    return cuteattn.flash_attn_func(q, k, v, causal=True).float().square().sum()


class JointGraphs:
    """An aot_autograd backend that keeps the forward and backward graphs it compiles."""

    def __init__(self):
        self.forward, self.backward = [], []
        self.backend = aot_autograd(fw_compiler=self.keep(self.forward),
                                    bw_compiler=self.keep(self.backward))

    @staticmethod
    def keep(graphs):
        def compiler(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        return compiler

    @staticmethod
    def targets(graphs):
        (gm,) = graphs  # one graph: no graph break
        return [node.target for node in gm.graph.nodes if node.op == "call_function"]


def test_compile_fullgraph_traces_a_training_step_with_fake_tensors(no_launch, monkeypatch):
    """Fake inputs: dynamo traces forward and backward without a break; the forward graph
    holds the attention op and the backward graph the backward op, once each. (Fake CPU
    tensors that pass for CUDA ones: autograd on fake CUDA tensors needs a CUDA build.)"""
    monkeypatch.setattr(api.validate, "check_devices", lambda *tensors: None)
    graphs = JointGraphs()
    with FakeTensorMode():
        q, k, v = qkv()
        loss = torch.compile(training_loss, backend=graphs.backend, fullgraph=True)(q, k, v)
        loss.backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape
    assert JointGraphs.targets(graphs.forward).count(ATTENTION) == 1
    assert JointGraphs.targets(graphs.backward).count(BACKWARD) == 1


def test_compiled_training_step_equals_eager(cpu_launches):
    q, k, v = qkv()
    training_loss(q, k, v).backward()
    eager = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    compiled = torch.compile(training_loss, backend="aot_eager", fullgraph=True)
    compiled(q, k, v).backward()
    for got, want in zip((q.grad, k.grad, v.grad), eager):
        assert torch.equal(got, want)


def test_sink_grad_matches_the_reference_autograd():
    """ops.sink_grad (what the attention op's backward returns for the sink) against autograd
    through the fp32 reference."""
    q, k, v = (x.float() for x in qkv(requires_grad=False, shape=(2, 20, 24, 4, 2, 32)))
    sink = torch.randn(4, requires_grad=True)
    out, lse = reference.attention(q, k, v, causal=True, learnable_sink=sink)
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    got = ops.sink_grad(sink.detach(), lse.detach(), out.detach(), dout)
    torch.testing.assert_close(got, sink.grad, atol=1e-5, rtol=1e-5)


def test_the_sink_gets_its_gradient_through_autograd(cpu_launches):
    """flash_attn_func(learnable_sink=) records the attention op; its backward returns dsink
    (a sink that alone requires grad is enough to record it)."""
    q, k, v = qkv(requires_grad=False)
    sink = torch.randn(4, requires_grad=True)
    out = cuteattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    assert cpu_launches[-1][0] == "forward" and cpu_launches[-1][1].option("sink") is True
    dout = torch.randn_like(out)
    out.backward(dout)
    ref_sink = sink.detach().clone().requires_grad_()
    ref_out, _ = reference.attention(q, k, v, causal=True, learnable_sink=ref_sink)
    torch.testing.assert_close(out, ref_out.to(out.dtype))
    (ref_out * dout.float()).sum().backward()
    torch.testing.assert_close(sink.grad, ref_sink.grad, atol=2e-2, rtol=2e-2)


def test_sink_grad_of_rows_without_keys_and_a_sink_of_minus_inf():
    """lse = -inf rows (no key, sink -inf) weigh 0 in dsink, not NaN."""
    sink = torch.tensor([float("-inf"), 0.5])
    lse = torch.tensor([[[float("-inf"), float("-inf")], [0.5, 1.0]]])  # (1, heads, rows)
    out = torch.zeros(1, 2, 2, 4)
    out[0, :, 1] = 1.0
    dout = torch.ones(1, 2, 2, 4)
    got = ops.sink_grad(sink, lse, out, dout)
    assert torch.isfinite(got).all() and got[0] == 0


def test_dim_v_trains_through_autograd_and_compile(cpu_launches):
    """(192, 128): the attention op and its backward carry v's head dim (out, dout and dv of
    128 columns), eager and torch.compile(fullgraph=True) alike."""
    q, k, _ = qkv(shape=(2, 16, 24, 4, 2, 192))
    v = torch.randn(2, 24, 2, 128, dtype=torch.bfloat16, requires_grad=True)
    training_loss(q, k, v).backward()
    eager = [x.grad.clone() for x in (q, k, v)]
    assert eager[2].shape == v.shape
    plans = [plan for kind, plan, _ in cpu_launches]
    assert [plan.option("dim_v") for plan in plans] == [128, 128]
    for x in (q, k, v):
        x.grad = None
    torch.compile(training_loss, backend="aot_eager", fullgraph=True)(q, k, v).backward()
    for got, want in zip((q.grad, k.grad, v.grad), eager):
        assert torch.equal(got, want)
