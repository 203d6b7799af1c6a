"""The forward custom op on the GPU: opcheck with the real kernel, torch.compile (inductor,
fullgraph) bitwise equal to eager, and a CUDA graph capture of a warmed-up call.

tests/cpu/test_custom_op.py checks the same registration on the CPU with a stand-in launch;
these run the kernels.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _qkv(batch=2, seqlen_q=300, seqlen_k=500, heads_q=8, heads_kv=2, dim=128):
    q = torch.randn(batch, seqlen_q, heads_q, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen_k, heads_kv, dim, device="cuda", dtype=torch.bfloat16)
    return q, k, torch.randn_like(k)


def _attention(q, k, v, causal, out=None):
    import cuteattn

    return cuteattn.flash_attn_func(q, k, v, causal=causal, out=out, return_lse=True)


@pytest.mark.parametrize("causal", (False, True))
def test_opcheck_with_the_kernel(causal):
    from cuteattn import ops  # the op itself: run alone, nothing has registered it before

    q, k, v = _qkv()
    op = ops.forward
    args = (q, k, v, torch.empty_like(q), 128**-0.5, causal, -1, -1, 0.0, None)
    torch.library.opcheck(op, (*args, None))
    torch.library.opcheck(op, (*args, "sm80"))
    for return_lse in (True, False):
        torch.library.opcheck(ops.inference, (q, k, v, *args[4:], None, return_lse))


@pytest.mark.parametrize("causal", (False, True))
def test_compiled_forward_is_bitwise_eager(causal):
    from cuteattn.testing import poison_like

    q, k, v = _qkv()
    expected, expected_lse = _attention(q, k, v, causal)
    compiled = torch.compile(_attention, fullgraph=True)
    out, lse = compiled(q, k, v, causal)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    given = poison_like(q)
    out, lse = compiled(q, k, v, causal, given)
    assert out is given and torch.equal(out, expected) and torch.equal(lse, expected_lse)


def test_compiled_forward_with_dynamic_seqlens():
    torch._dynamo.reset()
    compiled = torch.compile(_attention, fullgraph=True, dynamic=True)
    for seqlen_q, seqlen_k in ((128, 256), (77, 1000), (1, 4096)):
        q, k, v = _qkv(seqlen_q=seqlen_q, seqlen_k=seqlen_k)
        expected, expected_lse = _attention(q, k, v, True)
        out, lse = compiled(q, k, v, True)
        assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


def test_cuda_graph_replays_a_warmed_up_call():
    """Warm up first: the first call of a plan compiles its kernel, which is no graph work."""
    q, k, v = _qkv()
    expected, expected_lse = _attention(q, k, v, True)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = _attention(q, k, v, True, out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


def test_tile_counter_survives_graph_replays_streams_and_eager_calls():
    """A causal forward hands out its tiles from a counter that each launch leaves zero (one
    per stream): replays of a captured call, eager calls after the capture and a call on
    another stream all give the same bits."""
    q, k, v = _qkv(seqlen_q=1000, seqlen_k=1000)
    expected, expected_lse = _attention(q, k, v, True)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = _attention(q, k, v, True, out)
    for _ in range(2):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    for _ in range(2):
        again, again_lse = _attention(q, k, v, True)
        assert torch.equal(again, expected) and torch.equal(again_lse, expected_lse)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        other, other_lse = _attention(q, k, v, True)
    torch.cuda.synchronize()
    assert torch.equal(other, expected) and torch.equal(other_lse, expected_lse)
