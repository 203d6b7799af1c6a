"""flash_attn_varlen_func on the GPU (the sm80 family; sm90 plans it there too): packed batches
of random lengths (0 and 1 included, total_q != total_k), seqused_k, causal and windows aligned
per sequence, GQA and MQA, bf16 and fp16, against the fp32 reference with the dense tests' rule;
out and lse poisoned first, rows of every sequence checked."""

import pytest
import torch

from cuteattn.testing import param_id

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float16)


def _cumulative(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def _batch(seed, count, longest):
    generator = torch.Generator().manual_seed(seed)
    lengths_q = torch.randint(0, longest + 1, (count,), generator=generator).tolist()
    lengths_k = torch.randint(0, longest + 1, (count,), generator=generator).tolist()
    lengths_q[:2] = [0, 1]  # empty and one-row sequences every time
    lengths_k[1:3] = [1, 0]
    return lengths_q, lengths_k


@pytest.mark.parametrize("seqused", (False, True))
@pytest.mark.parametrize("window", (None, (5, 17), (256, 0), (-1, 64)), ids=str)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("heads", ((8, 8), (8, 2), (8, 1)), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=param_id)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_varlen_forward(head_dim, dtype, heads, causal, window, seqused):
    import cuteattn
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference

    lengths_q, lengths_k = _batch(head_dim + len(heads) + int(causal), 7, 700)
    heads_q, heads_kv = heads
    q = torch.randn(sum(lengths_q), heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(sum(lengths_k), heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    cu_q, cu_k = _cumulative(lengths_q), _cumulative(lengths_k)
    seqused_k = None
    if seqused:
        seqused_k = torch.tensor([n // 2 for n in lengths_k], dtype=torch.int32, device="cuda")
    window_size = window or (None, None)
    out = torch.full_like(q, float("nan"))
    got, lse = cuteattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), seqused_k=seqused_k,
        causal=causal, window_size=window_size, out=out, return_lse=True,
    )
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=seqused_k, causal=causal,
                  window_size=window_size)
    out_ref, lse_ref = attention(q, k, v, **kwargs)
    out_pt, lse_pt = attention(q, k, v, upcast=False, **kwargs)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)


def test_varlen_equals_the_padded_batch():
    """Sequences of one length packed give the dense call's result bitwise (same kernels,
    same order of work per row)."""
    import cuteattn
    from cuteattn import api

    q = torch.randn(3, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(3, 500, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    dense, _ = api.forward(q, k, v, causal=True, family="sm80")
    cu_q = torch.arange(0, 901, 300, dtype=torch.int32, device="cuda")
    cu_k = torch.arange(0, 1501, 500, dtype=torch.int32, device="cuda")
    packed = cuteattn.flash_attn_varlen_func(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 300, 500, causal=True
    )
    assert torch.equal(packed, dense.flatten(0, 1))


@pytest.mark.parametrize("deterministic", (False, True))
@pytest.mark.parametrize("window", (None, (256, 0)), ids=str)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("heads", ((8, 8), (8, 2), (8, 1)), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=param_id)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_varlen_backward(head_dim, dtype, heads, causal, window, deterministic):
    """dq, dk, dv through autograd (cuteattn::varlen_attention -> varlen_backward) against the
    reference's; deterministic runs bitwise equal."""
    import cuteattn
    from cuteattn.testing import assert_grads_close

    lengths_q, lengths_k = _batch(head_dim + len(heads) + 7 * int(causal), 6, 600)
    heads_q, heads_kv = heads
    q = torch.randn(sum(lengths_q), heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(sum(lengths_k), heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    cu_q, cu_k = _cumulative(lengths_q), _cumulative(lengths_k)
    window_size = window or (None, None)

    def grads():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out = cuteattn.flash_attn_varlen_func(
            *leaves, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
            window_size=window_size, deterministic=deterministic,
        )
        out.backward(dout)
        return [x.grad for x in leaves]

    got = grads()
    torch.cuda.synchronize()
    kwargs = dict(causal=causal, window_size=window_size, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert_grads_close(got, q, k, v, dout, **kwargs)
    if deterministic:
        again = grads()
        assert all(torch.equal(a, b) for a, b in zip(got, again))


def test_varlen_backward_with_seqused_k_and_a_sink():
    import cuteattn
    from cuteattn.testing import assert_grads_close

    lengths_q, lengths_k = _batch(5, 5, 500)
    q = torch.randn(sum(lengths_q), 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths_k), 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    cu_q, cu_k = _cumulative(lengths_q), _cumulative(lengths_k)
    used = torch.tensor([n // 2 for n in lengths_k], dtype=torch.int32, device="cuda")
    sink = torch.randn(8, device="cuda")
    leaves = [x.detach().requires_grad_() for x in (q, k, v, sink)]
    out, lse = cuteattn.flash_attn_varlen_func(
        *leaves[:3], cu_q, cu_k, max(lengths_q), max(lengths_k), seqused_k=used, causal=True,
        learnable_sink=leaves[3], return_lse=True,
    )
    out.backward(dout)
    kwargs = dict(causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used,
                  learnable_sink=sink)
    assert_grads_close([leaf.grad for leaf in leaves], q, k, v, dout, out=out.detach(),
                       lse=lse.detach(), **kwargs)
