"""CPU tests of the fp32 attention oracle (cuteattn.reference.attention).

The oracle is checked against a naive float64 implementation written here independently: a
plain loop over batch and query head that builds the full score matrix, an explicit boolean
mask from torch.arange comparisons, and torch.softmax / torch.logsumexp.
"""

import math

import pytest
import torch

from cuteattn.reference import attention

NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------
# naive float64 reference
# --------------------------------------------------------------------------------------------


def _mask(seqlen_q, seqlen_k, causal, left, right):
    """Explicit (seqlen_q, seqlen_k) visibility matrix; left/right are None for unbounded."""
    i = torch.arange(seqlen_q).view(-1, 1)
    j = torch.arange(seqlen_k).view(1, -1)
    diag = i + (seqlen_k - seqlen_q)  # key aligned with query i (bottom-right alignment)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if causal:
        visible = visible & (j <= diag)
    if left is not None:
        visible = visible & (j >= diag - left)
    if right is not None:
        visible = visible & (j <= diag + right)
    return visible


def naive_one(q, k, v, scale=None, causal=False, left=None, right=None, softcap=0.0):
    """One sequence, float64. q (sq, hq, d), k (sk, hk, d), v (sk, hk, dv).

    Returns out (sq, hq, dv) and lse (hq, sq), both float64.
    """
    q, k, v = q.double(), k.double(), v.double()
    sq, hq, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    dv = v.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    visible = _mask(sq, sk, causal, left, right)
    has_key = visible.any(dim=1)
    out = torch.zeros(sq, hq, dv, dtype=torch.float64)
    lse = torch.full((hq, sq), NEG_INF, dtype=torch.float64)
    for h in range(hq):
        kv_head = (h * hk) // hq
        s = (q[:, h, :] @ k[:, kv_head, :].T) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = torch.where(visible, s, torch.full_like(s, NEG_INF))
        for i in range(sq):
            if has_key[i]:
                p = torch.softmax(s[i], dim=0)
                out[i, h, :] = p @ v[:, kv_head, :]
                lse[h, i] = torch.logsumexp(s[i], dim=0)
    return out, lse


def naive(q, k, v, **kw):
    """Batched (batch, seqlen, heads, dim) version: loop over the batch."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        o, l = naive_one(q[b], k[b], v[b], **kw)
        outs.append(o)
        lses.append(l)
    return torch.stack(outs), torch.stack(lses)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def rand(*shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float32) * scale).to(dtype)


def make_qkv(batch, sq, sk, hq, hk, d, dv=None, seed=0, dtype=torch.float32):
    dv = d if dv is None else dv
    q = rand(batch, sq, hq, d, seed=seed, dtype=dtype)
    k = rand(batch, sk, hk, d, seed=seed + 1, dtype=dtype)
    v = rand(batch, sk, hk, dv, seed=seed + 2, dtype=dtype)
    return q, k, v


def norm_window(w):
    return None if w is None or w == -1 else w


def check(out, lse, ref_out, ref_lse, atol=2e-5, rtol=2e-5):
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert not torch.isnan(out).any()
    assert not torch.isnan(lse).any()
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    # -inf must match -inf exactly; finite values within tolerance
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    torch.testing.assert_close(lse.double(), ref_lse, atol=atol, rtol=rtol)


def check_empty_rows(out, lse, empty_rows):
    """out (..., sq, h, dv), lse (..., h, sq); empty_rows bool (sq,): exact zero / -inf there."""
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.all(out[..., empty_rows, :, :] == 0)
    assert torch.all(torch.isneginf(lse[..., :, empty_rows]))
    assert not torch.isinf(lse[..., :, ~empty_rows]).any()


# --------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hq,hk", [(4, 4), (8, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(37, 37), (20, 45)])
def test_heads(hq, hk, causal, sq, sk):
    q, k, v = make_qkv(2, sq, sk, hq, hk, 32, seed=hq * 10 + hk)
    out, lse = attention(q, k, v, causal=causal)
    ref_out, ref_lse = naive(q, k, v, causal=causal)
    check(out, lse, ref_out, ref_lse)
    assert out.shape == (2, sq, hq, 32) and lse.shape == (2, hq, sq)


def test_gqa_head_mapping_matches_repeated_kv():
    hq, hk = 8, 2
    q, k, v = make_qkv(2, 24, 31, hq, hk, 16, seed=3)
    g = hq // hk
    out, lse = attention(q, k, v)
    out_rep, lse_rep = attention(q, k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2))
    torch.testing.assert_close(out, out_rep, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, lse_rep, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "sq,sk",
    [(64, 64), (1, 1), (33, 97), (1, 50), (97, 33), (50, 1), (128, 128)],
)
def test_causal(sq, sk):
    q, k, v = make_qkv(2, sq, sk, 4, 2, 32, seed=sq + 7 * sk)
    out, lse = attention(q, k, v, causal=True)
    ref_out, ref_lse = naive(q, k, v, causal=True)
    check(out, lse, ref_out, ref_lse)
    # bottom-right alignment: query i sees key j iff j <= i + sk - sq
    empty = torch.arange(sq) + (sk - sq) < 0
    assert int(empty.sum()) == max(sq - sk, 0)
    check_empty_rows(out, lse, empty)


@pytest.mark.parametrize(
    "window",
    [(8, None), (None, 8), (5, 3), (0, 0), (16, -1), (-1, 4), (0, None), (None, 0)],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(50, 50), (40, 90), (90, 40)])
def test_window(window, causal, sq, sk):
    q, k, v = make_qkv(1, sq, sk, 4, 2, 16, seed=11 + sq)
    out, lse = attention(q, k, v, causal=causal, window_size=window)
    left, right = norm_window(window[0]), norm_window(window[1])
    ref_out, ref_lse = naive(q, k, v, causal=causal, left=left, right=right)
    check(out, lse, ref_out, ref_lse)
    empty = ~_mask(sq, sk, causal, left, right).any(dim=1)
    check_empty_rows(out, lse, empty)


def test_causal_is_window_right_zero():
    q, k, v = make_qkv(2, 45, 70, 4, 4, 32, seed=5)
    for left in (None, 0, 7):
        a = attention(q, k, v, causal=True, window_size=(left, None))
        b = attention(q, k, v, causal=False, window_size=(left, 0))
        c = attention(q, k, v, causal=True, window_size=(left, 0))
        for x, y in ((a, b), (a, c)):
            assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])


def test_window_minus_one_equals_none():
    q, k, v = make_qkv(2, 30, 42, 4, 2, 32, seed=6)
    base = attention(q, k, v)
    for w in [(None, None), (-1, -1), (-1, None), (None, -1)]:
        r = attention(q, k, v, window_size=w)
        assert torch.equal(r[0], base[0]) and torch.equal(r[1], base[1])
    a = attention(q, k, v, window_size=(6, -1), causal=True)
    b = attention(q, k, v, window_size=(6, None), causal=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    a = attention(q, k, v, window_size=(-1, 3))
    b = attention(q, k, v, window_size=(None, 3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("window", [(-2, None), (None, -5)])
def test_window_invalid_negative(window):
    q, k, v = make_qkv(1, 8, 8, 2, 2, 16, seed=0)
    with pytest.raises(ValueError):
        attention(q, k, v, window_size=window)


@pytest.mark.parametrize("softcap", [5.0, 30.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(softcap, causal):
    q, k, v = make_qkv(2, 48, 64, 4, 2, 32, seed=21)
    q = q * 4.0  # large scores so that tanh saturates noticeably
    out, lse = attention(q, k, v, softcap=softcap, causal=causal)
    ref_out, ref_lse = naive(q, k, v, softcap=softcap, causal=causal)
    check(out, lse, ref_out, ref_lse, atol=5e-5, rtol=5e-5)
    # the cap really changes the result
    plain_out, _ = attention(q, k, v, causal=causal)
    assert (plain_out - out).abs().max() > 1e-2


@pytest.mark.parametrize("scale", [0.37, 1.0, 0.05])
def test_softmax_scale(scale):
    q, k, v = make_qkv(2, 33, 40, 4, 4, 32, seed=31)
    out, lse = attention(q, k, v, softmax_scale=scale, causal=True)
    ref_out, ref_lse = naive(q, k, v, scale=scale, causal=True)
    check(out, lse, ref_out, ref_lse, atol=5e-5, rtol=5e-5)


def test_default_scale_is_inverse_sqrt_dim():
    q, k, v = make_qkv(1, 20, 20, 2, 2, 64, seed=32)
    a = attention(q, k, v)
    b = attention(q, k, v, softmax_scale=64**-0.5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("d,dv", [(32, 64), (64, 16), (16, 48)])
@pytest.mark.parametrize("causal", [False, True])
def test_dim_v(d, dv, causal):
    q, k, v = make_qkv(2, 29, 41, 4, 2, d, dv=dv, seed=d + dv)
    out, lse = attention(q, k, v, causal=causal)
    assert out.shape == (2, 29, 4, dv)
    ref_out, ref_lse = naive(q, k, v, causal=causal)
    check(out, lse, ref_out, ref_lse)


VARLEN_CASES = {
    "mixed": ([1, 17, 64, 5, 40], [1, 30, 64, 2, 40]),
    "q_longer": ([10, 1, 33], [4, 7, 33]),
}


@pytest.mark.parametrize("case", list(VARLEN_CASES))
@pytest.mark.parametrize(
    "causal,window,softcap",
    [(False, (None, None), 0.0), (True, (None, None), 0.0), (False, (6, 2), 0.0), (True, (9, -1), 10.0)],
)
def test_varlen(case, causal, window, softcap):
    lens_q, lens_k = VARLEN_CASES[case]
    hq, hk, d, dv = 4, 2, 32, 16
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = rand(int(cu_q[-1]), hq, d, seed=41)
    k = rand(int(cu_k[-1]), hk, d, seed=42)
    v = rand(int(cu_k[-1]), hk, dv, seed=43)
    out, lse = attention(
        q, k, v, causal=causal, window_size=window, softcap=softcap, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k
    )
    assert out.shape == (q.shape[0], hq, dv)
    assert lse.shape == (hq, q.shape[0])  # flash-attn varlen lse layout
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    left, right = norm_window(window[0]), norm_window(window[1])
    for b in range(len(lens_q)):
        qs, qe = int(cu_q[b]), int(cu_q[b + 1])
        ks, ke = int(cu_k[b]), int(cu_k[b + 1])
        # against the non-varlen oracle on the same sequence
        o1, l1 = attention(
            q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], causal=causal, window_size=window, softcap=softcap
        )
        torch.testing.assert_close(out[qs:qe], o1[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(lse[:, qs:qe], l1[0], atol=1e-6, rtol=1e-6)
        # against the naive float64 implementation
        ro, rl = naive_one(q[qs:qe], k[ks:ke], v[ks:ke], causal=causal, left=left, right=right, softcap=softcap)
        check(out[qs:qe], lse[:, qs:qe], ro, rl, atol=5e-5, rtol=5e-5)


def test_varlen_length_one_sequence_is_single_key_copy():
    # a length-1 q against a length-1 k: the output is exactly that key's value
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    q = rand(9, 2, 16, seed=50)
    k = rand(9, 2, 16, seed=51)
    v = rand(9, 2, 16, seed=52)
    out, lse = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    torch.testing.assert_close(out[3], v[3], atol=1e-6, rtol=1e-6)
    s = (q[3] * k[3]).sum(-1) / 4.0
    torch.testing.assert_close(lse[:, 3], s, atol=1e-5, rtol=1e-5)


def test_varlen_requires_both_cu_seqlens():
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    q = rand(9, 2, 16, seed=1)
    k = rand(9, 2, 16, seed=2)
    v = rand(9, 2, 16, seed=3)
    with pytest.raises(ValueError):
        attention(q, k, v, cu_seqlens_q=cu)
    with pytest.raises(ValueError):
        attention(q, k, v, cu_seqlens_k=cu)


@pytest.mark.parametrize("causal,window", [(False, (None, None)), (True, (None, None)), (False, (4, 4)), (True, (10, None))])
def test_seqused_k(causal, window):
    sq, sk = 40, 80
    used = [80, 33, 1, 55]
    q, k, v = make_qkv(len(used), sq, sk, 4, 2, 32, seed=61)
    seqused = torch.tensor(used, dtype=torch.int32)
    out, lse = attention(q, k, v, causal=causal, window_size=window, seqused_k=seqused)
    left, right = norm_window(window[0]), norm_window(window[1])
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    for b, n in enumerate(used):
        # the alignment uses the effective seqlen_k = n
        ro, rl = naive_one(q[b], k[b, :n], v[b, :n], causal=causal, left=left, right=right)
        check(out[b], lse[b], ro, rl)
    # keys past seqused_k are ignored
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate(used):
        k2[b, n:] = rand(sk - n, 2, 32, seed=100 + b) * 10
        v2[b, n:] = rand(sk - n, 2, 32, seed=200 + b) * 10
    out2, lse2 = attention(q, k2, v2, causal=causal, window_size=window, seqused_k=seqused)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("causal", [False, True])
def test_seqused_k_varlen(causal):
    lens_q = [12, 1, 30]
    lens_k = [20, 9, 30]
    used = [15, 0, 30]
    hq, hk, d = 4, 1, 16
    cu_q = torch.tensor([0, 12, 13, 43], dtype=torch.int32)
    assert torch.equal(cu_q.diff(), torch.tensor(lens_q, dtype=torch.int32))
    cu_k = torch.tensor([0, 20, 29, 59], dtype=torch.int32)
    q = rand(43, hq, d, seed=71)
    k = rand(59, hk, d, seed=72)
    v = rand(59, hk, d, seed=73)
    out, lse = attention(
        q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=torch.tensor(used, dtype=torch.int32)
    )
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    for b in range(3):
        qs, qe = int(cu_q[b]), int(cu_q[b + 1])
        ks = int(cu_k[b])
        n = used[b]
        ro, rl = naive_one(q[qs:qe], k[ks : ks + n], v[ks : ks + n], causal=causal)
        check(out[qs:qe], lse[:, qs:qe], ro, rl)
        o1, l1 = attention(
            q[None, qs:qe], k[None, ks : ks + lens_k[b]], v[None, ks : ks + lens_k[b]],
            causal=causal, seqused_k=torch.tensor([n], dtype=torch.int32),
        )
        torch.testing.assert_close(out[qs:qe], o1[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(lse[:, qs:qe], l1[0], atol=1e-6, rtol=1e-6)
    # sequence 1 uses no key at all: zero output, -inf lse
    assert torch.all(out[12] == 0) and torch.all(torch.isneginf(lse[:, 12]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_upcast_false(dtype, causal):
    sq, sk = 70, 50  # sq > sk: with causal, the first 20 rows see no key
    q, k, v = make_qkv(2, sq, sk, 4, 2, 64, seed=81, dtype=dtype)
    out, lse = attention(q, k, v, causal=causal, upcast=False)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref_out, ref_lse = attention(q, k, v, causal=causal)  # fp32 from the same low-precision inputs
    assert ref_out.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=2e-2)
    # it really computes in low precision (not just a cast of the fp32 result)
    assert not torch.equal(out, ref_out.to(dtype)) or not torch.equal(lse, ref_lse)
    if causal:
        empty = torch.arange(sq) + (sk - sq) < 0
        check_empty_rows(out, lse, empty)


def test_upcast_true_from_bf16_inputs_matches_naive():
    q, k, v = make_qkv(2, 36, 52, 4, 2, 32, seed=91, dtype=torch.bfloat16)
    out, lse = attention(q, k, v, causal=True)
    assert out.dtype == torch.float32
    ref_out, ref_lse = naive(q, k, v, causal=True)
    check(out, lse, ref_out, ref_lse)


def test_upcast_false_float32_matches_upcast_true():
    q, k, v = make_qkv(2, 25, 25, 2, 2, 16, seed=92)
    a = attention(q, k, v, causal=True, upcast=False)
    b = attention(q, k, v, causal=True)
    assert a[0].dtype == torch.float32
    torch.testing.assert_close(a[0], b[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(a[1], b[1], atol=1e-6, rtol=1e-6)


def test_autograd_matches_naive():
    q, k, v = make_qkv(2, 20, 28, 4, 2, 16, seed=95)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    q32, k32, v32 = (t.clone().requires_grad_() for t in (q, k, v))
    dout = rand(2, 20, 4, 16, seed=96)
    out, _ = attention(q32, k32, v32, causal=True, window_size=(5, None), softcap=3.0)
    (out * dout).sum().backward()
    ref_out, _ = naive(q64, k64, v64, causal=True, left=5, softcap=3.0)
    (ref_out * dout.double()).sum().backward()
    for a, b in ((q32, q64), (k32, k64), (v32, v64)):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=5e-5, rtol=5e-5)


def test_validation_errors():
    q, k, v = make_qkv(1, 8, 8, 6, 4, 16, seed=0)
    with pytest.raises(ValueError, match="multiple"):
        attention(q, k, v)  # 6 % 4 != 0
    q, k, v = make_qkv(1, 8, 8, 4, 2, 16, seed=0)
    with pytest.raises(ValueError, match="rank"):
        attention(q[0], k[0], v[0])  # rank 3 without cu_seqlens
    with pytest.raises(ValueError):
        attention(q, k[..., :8], v)  # head dim mismatch
    with pytest.raises(ValueError):
        attention(q, k, v, seqused_k=torch.tensor([9], dtype=torch.int32))  # more keys than exist


# --------------------------------------------------------------------------------------------
# learnable sink
# --------------------------------------------------------------------------------------------


def naive_sink_one(q, k, v, sink, scale=None, causal=False, left=None, right=None, softcap=0.0):
    """One sequence with a learnable sink, float64: the sink is one more column of the score
    matrix (never masked) whose value row is zero."""
    q, k, v = q.double(), k.double(), v.double()
    sq, hq, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    visible = _mask(sq, sk, causal, left, right)
    out = torch.zeros(sq, hq, v.shape[2], dtype=torch.float64)
    lse = torch.empty(hq, sq, dtype=torch.float64)
    for h in range(hq):
        kv_head = (h * hk) // hq
        s = (q[:, h, :] @ k[:, kv_head, :].T) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = torch.where(visible, s, torch.full_like(s, NEG_INF))
        s = torch.cat([s, sink[h].double().expand(sq, 1)], dim=1)
        v_ext = torch.cat([v[:, kv_head, :], torch.zeros(1, v.shape[2], dtype=torch.float64)])
        out[:, h, :] = torch.softmax(s, dim=1) @ v_ext
        lse[h] = torch.logsumexp(s, dim=1)
    return out, lse


@pytest.mark.parametrize("hq,hk", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(37, 37), (45, 20)])
def test_learnable_sink(hq, hk, causal, sq, sk):
    q, k, v = make_qkv(2, sq, sk, hq, hk, 16, dv=8, seed=120)
    sink = rand(hq, seed=121, scale=2.0)
    out, lse = attention(q, k, v, causal=causal, softcap=4.0, learnable_sink=sink)
    refs = [naive_sink_one(q[b], k[b], v[b], sink, causal=causal, softcap=4.0) for b in range(2)]
    check(out, lse, torch.stack([r[0] for r in refs]), torch.stack([r[1] for r in refs]))


def test_learnable_sink_rows_without_keys():
    """A row that sees no key (causal, seqlen_q > seqlen_k; and seqlen_k 0) gets out = 0 and
    lse = the sink; a very negative sink changes nothing else."""
    q, k, v = make_qkv(1, 12, 5, 4, 4, 16, seed=122)
    sink = rand(4, seed=123)
    out, lse = attention(q, k, v, causal=True, learnable_sink=sink)
    empty = torch.arange(12) < 12 - 5
    assert torch.all(out[0, empty] == 0)
    torch.testing.assert_close(lse[0][:, empty], sink.view(4, 1).expand(4, int(empty.sum())))
    out0, lse0 = attention(q, k[:, :0], v[:, :0], learnable_sink=sink)
    assert torch.all(out0 == 0)
    torch.testing.assert_close(lse0[0], sink.view(4, 1).expand(4, 12))
    far = torch.full((4,), -1e4)
    out_far, lse_far = attention(q, k, v, causal=True, learnable_sink=far)
    out_none, lse_none = attention(q, k, v, causal=True)
    torch.testing.assert_close(out_far[0, ~empty], out_none[0, ~empty])
    torch.testing.assert_close(lse_far[0][:, ~empty], lse_none[0][:, ~empty])


def test_learnable_sink_varlen_matches_batched():
    q, k, v = make_qkv(2, 16, 16, 4, 2, 16, seed=124)
    sink = rand(4, seed=125)
    out, lse = attention(q, k, v, causal=True, learnable_sink=sink)
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)
    out_v, lse_v = attention(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), causal=True,
        cu_seqlens_q=cu, cu_seqlens_k=cu, learnable_sink=sink,
    )
    torch.testing.assert_close(out_v, out.flatten(0, 1))
    torch.testing.assert_close(lse_v, lse.permute(1, 0, 2).flatten(1, 2))


def test_learnable_sink_gradient_formula():
    """Autograd through the reference gives dsink = -sum_rows exp(sink - lse) * rowsum(dO * O),
    the formula the backward kernels use; dq, dk, dv match the float64 naive version."""
    q, k, v = make_qkv(2, 20, 24, 4, 2, 16, seed=126)
    sink = rand(4, seed=127).requires_grad_()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dout = rand(2, 20, 4, 16, seed=128)
    out, lse = attention(*leaves, causal=True, learnable_sink=sink)
    (out * dout).sum().backward()
    dpsum = (dout * out.detach()).sum(-1).permute(0, 2, 1)  # (batch, heads, seqlen_q)
    expected = -(torch.exp(sink.detach().view(1, 4, 1) - lse.detach()) * dpsum).sum(dim=(0, 2))
    torch.testing.assert_close(sink.grad, expected, atol=1e-5, rtol=1e-5)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.stack(
        [naive_sink_one(*(t[b] for t in leaves64), sink.detach(), causal=True)[0] for b in range(2)]
    )
    (ref * dout.double()).sum().backward()
    for a, b in zip(leaves, leaves64):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=5e-5, rtol=5e-5)


def test_learnable_sink_validation():
    q, k, v = make_qkv(1, 8, 8, 4, 2, 16, seed=0)
    with pytest.raises(ValueError, match="heads_q"):
        attention(q, k, v, learnable_sink=torch.zeros(2))
    with pytest.raises(ValueError, match="floating-point"):
        attention(q, k, v, learnable_sink=torch.zeros(4, dtype=torch.int32))
