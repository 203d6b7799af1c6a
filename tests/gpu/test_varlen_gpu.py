"""flash_attn_varlen_func on the GPU through both families, forward and backward: packed
batches of random lengths (0 and 1 included, total_q != total_k), seqused_k, causal and windows aligned
per sequence, GQA and MQA, bf16 and fp16, against the fp32 reference with the dense tests' rule;
out and lse poisoned first, rows of every sequence checked."""

import pytest
import torch

from cuteattn.plan import families
from cuteattn.testing import param_id, skip_unless_family_runs

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float16)
FAMILIES = [family.name for family in families()]


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


def _training_batch(seed, count, longest, heads, head_dim, dtype=torch.bfloat16):
    """A packed batch for a backward test: its lengths, q, k, v, dout and cumulative lengths."""
    lengths_q, lengths_k = _batch(seed, count, longest)
    heads_q, heads_kv = heads
    q = torch.randn(sum(lengths_q), heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(sum(lengths_k), heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    return lengths_q, lengths_k, q, k, v, dout, _cumulative(lengths_q), _cumulative(lengths_k)


@pytest.mark.parametrize("seqused", (False, True))
@pytest.mark.parametrize("window", (None, (5, 17), (256, 0), (-1, 64)), ids=str)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("heads", ((8, 8), (8, 2), (8, 1)), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=param_id)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_forward(family, head_dim, dtype, heads, causal, window, seqused):
    import cuteattn
    from cuteattn.testing import assert_attention_close

    skip_unless_family_runs(family)
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
        causal=causal, window_size=window_size, out=out, return_lse=True, family=family,
    )
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    assert_attention_close(
        got, lse, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=seqused_k,
        causal=causal, window_size=window_size,
    )


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (64, 128))
@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_forward_without_lse(family, head_dim, causal):
    """No return_lse, no grad, no out: the kernel writes no lse; out (allocated in the op,
    poisoned through the allocator: a freed NaN block of its size) matches the reference."""
    import cuteattn
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference

    skip_unless_family_runs(family)
    lengths_q, lengths_k = _batch(head_dim + int(causal), 7, 700)
    q = torch.randn(sum(lengths_q), 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu_q, cu_k = _cumulative(lengths_q), _cumulative(lengths_k)
    block = torch.full_like(q, float("nan"))
    poison_ptr = block.data_ptr()
    del block
    got = cuteattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal, family=family,
    )
    torch.cuda.synchronize()
    assert got.data_ptr() == poison_ptr, "out did not reuse the poisoned block"
    options = dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out_ref, _ = attention(q, k, v, **options)
    out_pt, _ = attention(q, k, v, upcast=False, **options)
    assert_close_to_reference("out", got, out_ref, out_pt)


@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_equals_the_padded_batch(family):
    """Sequences of one length packed give the dense call's result bitwise (the family's
    kernels, the same key tiles in the same order for every row)."""
    import cuteattn
    from cuteattn import api

    skip_unless_family_runs(family)
    q = torch.randn(3, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(3, 500, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    dense, _ = api.forward(q, k, v, causal=True, family=family)
    cu_q = torch.arange(0, 901, 300, dtype=torch.int32, device="cuda")
    cu_k = torch.arange(0, 1501, 500, dtype=torch.int32, device="cuda")
    packed = cuteattn.flash_attn_varlen_func(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 300, 500, causal=True,
        family=family,
    )
    assert torch.equal(packed, dense.flatten(0, 1))


@pytest.mark.parametrize("deterministic", (False, True))
@pytest.mark.parametrize("window", (None, (256, 0)), ids=str)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("heads", ((8, 8), (8, 2), (8, 1)), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=param_id)
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_backward(family, head_dim, dtype, heads, causal, window, deterministic):
    """dq, dk, dv through autograd (cuteattn::varlen_attention -> varlen_backward) against the
    reference's; deterministic runs bitwise equal."""
    import cuteattn
    from cuteattn.testing import assert_grads_close

    skip_unless_family_runs(family)
    lengths_q, lengths_k, q, k, v, dout, cu_q, cu_k = _training_batch(
        head_dim + len(heads) + 7 * int(causal), 6, 600, heads, head_dim, dtype
    )
    window_size = window or (None, None)

    def grads():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out = cuteattn.flash_attn_varlen_func(
            *leaves, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
            window_size=window_size, deterministic=deterministic, family=family,
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


@pytest.mark.parametrize("window", (None, (256, 0)), ids=str)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_deterministic_backward_d96(family, causal, window):
    """d96's own dQ path (warpgroup 0 alone computes dQ; sm90 deterministic: two dQ buffers,
    a writer warp each) on packed sequences, GQA 8/2."""
    test_varlen_backward(family, 96, torch.bfloat16, (8, 2), causal, window, True)


def test_varlen_backward_with_seqused_k_and_a_sink():
    import cuteattn
    from cuteattn.testing import assert_grads_close

    lengths_q, lengths_k, q, k, v, dout, cu_q, cu_k = _training_batch(5, 5, 500, (8, 2), 128)
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


@pytest.mark.parametrize("head_dim,causal", ((64, False), (128, True), (192, True), (256, False)))
@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_ignores_what_lies_past_the_sequences(family, head_dim, causal):
    """NaN in the packed rows past the last sequence and in the keys past seqused_k (a cache's
    unwritten tail) reaches no result: tiles that cross a sequence's end must see zeros there
    (P = 0 times NaN would still be NaN): the sm90 kernels' ragged TMA views load zeros past
    each sequence, the sm80 kernels' predicated copies skip those rows. Forward and backward."""
    import cuteattn
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, assert_grads_close

    skip_unless_family_runs(family)
    lengths_q, lengths_k = [70, 1, 130, 200], [90, 5, 64, 333]
    cu_q, cu_k = _cumulative(lengths_q), _cumulative(lengths_k)
    tail = 77
    q = torch.randn(sum(lengths_q) + tail, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths_k) + tail, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    used = torch.tensor([n - 7 if n > 7 else n for n in lengths_k], dtype=torch.int32,
                        device="cuda")
    for x, lengths in ((q, lengths_q), (k, lengths_k), (v, lengths_k), (dout, lengths_q)):
        x[sum(lengths):] = float("nan")
    for b, n in enumerate(lengths_k):  # the keys past seqused_k
        start = int(cu_k[b])
        k[start + int(used[b]):start + n] = float("nan")
        v[start + int(used[b]):start + n] = float("nan")
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = cuteattn.flash_attn_varlen_func(
        *leaves, cu_q, cu_k, max(lengths_q), max(lengths_k), seqused_k=used, causal=causal,
        family=family,
    )
    out.backward(dout)
    rows_q, rows_k = sum(lengths_q), sum(lengths_k)
    options = dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used)
    # The reference reads only the used keys; clean copies keep its autograd NaN-free.
    clean = [x.nan_to_num(0.0) for x in (q, k, v, dout)]
    out_ref, _ = attention(*clean[:3], **options)
    out_pt, _ = attention(*clean[:3], upcast=False, **options)
    assert_close_to_reference("out", out.detach()[:rows_q], out_ref[:rows_q], out_pt[:rows_q])
    grads = [leaves[0].grad[:rows_q], leaves[1].grad[:rows_k], leaves[2].grad[:rows_k]]
    want_shapes = [clean[0][:rows_q], clean[1][:rows_k], clean[2][:rows_k]]
    assert_grads_close(grads, *want_shapes, clean[3][:rows_q], **options)


@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_many_sequences(family):
    """70 sequences (empty ones among them): more than one warp's 32 per pass of the sm90
    kernels' tile scan; forward and the deterministic causal backward against the reference,
    with max_seqlen passed larger than the longest (the grid's bound is then the packed rows')."""
    import cuteattn
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference, assert_grads_close

    skip_unless_family_runs(family)
    lengths_q, lengths_k, q, k, v, dout, cu_q, cu_k = _training_batch(70, 70, 200, (4, 2), 128)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out, lse = cuteattn.flash_attn_varlen_func(
        *leaves, cu_q, cu_k, max(lengths_q) + 300, max(lengths_k) + 300, causal=True,
        deterministic=True, return_lse=True, family=family,
    )
    out.backward(dout)
    torch.cuda.synchronize()
    kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    out_ref, lse_ref = attention(q, k, v, **kwargs)
    out_pt, lse_pt = attention(q, k, v, upcast=False, **kwargs)
    assert_close_to_reference("out", out.detach(), out_ref, out_pt)
    assert_close_to_reference("lse", lse.detach(), lse_ref, lse_pt)
    assert_grads_close([x.grad for x in leaves], q, k, v, dout, **kwargs)



@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (64, 128))
@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_long_sequences(family, head_dim, causal):
    """Sequences past 2048 rows, where the sm90 planner takes its long plans for packed
    batches (d64: 192-row tiles, persistent; d128 causal: single tile) and a persistent grid
    of the SM count strides over more work tiles than it has CTAs (the plans:
    ``tests/cpu/test_plan.py``); forward against the reference."""
    import cuteattn
    from cuteattn.testing import assert_attention_close

    skip_unless_family_runs(family)
    lengths_q = [3001, 0, 2300, 1, 4100, 777]
    lengths_k = [2900, 5, 2300, 0, 4100, 1500]
    q = torch.randn(sum(lengths_q), 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu_q, cu_k = _cumulative(lengths_q), _cumulative(lengths_k)
    out = torch.full_like(q, float("nan"))
    got, lse = cuteattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal, out=out,
        return_lse=True, family=family,
    )
    torch.cuda.synchronize()
    assert_attention_close(got, lse, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal)
