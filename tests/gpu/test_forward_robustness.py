"""Forward edge cases run through every family (the family override): a large GQA problem,
large logits that exercise the online rescale, a non-default stream, and bitwise-repeatable
results."""

import pytest
import torch

from cuteattn.plan import family_names

pytestmark = pytest.mark.gpu


def _skip_unless_supported(family):
    from cuteattn.plan import get_family
    from cuteattn.runtime.arch import device_arch

    if not get_family(family).supports(device_arch(torch.device("cuda"))):
        pytest.skip(f"family {family} does not run on this GPU")


def _check(got, lse, q, k, v, causal, softmax_scale=None):
    from cuteattn.reference import attention
    from cuteattn.testing import assert_close_to_reference

    out_ref, lse_ref = attention(q, k, v, softmax_scale=softmax_scale, causal=causal)
    out_pt, lse_pt = attention(q, k, v, softmax_scale=softmax_scale, causal=causal, upcast=False)
    assert_close_to_reference("out", got, out_ref, out_pt)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt)


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("family", family_names())
def test_gqa_batch2_seqlen8192_heads32_4(family, causal):
    from cuteattn import api
    from cuteattn.testing import poison_like

    _skip_unless_supported(family)
    q = torch.randn(2, 8192, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 8192, 4, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    got, lse = api.forward(q, k, v, causal=causal, out=poison_like(q), family=family)
    _check(got, lse, q, k, v, causal)


@pytest.mark.parametrize("where", ("first", "last"))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("family", family_names())
def test_planted_dominant_key_with_large_logits(family, head_dim, causal, where):
    """One key far above the rest, in the first or the last key tile, and every score scaled
    x30: the running max jumps by hundreds, so a missed or wrong O rescale shows at once."""
    from cuteattn import api
    from cuteattn.testing import poison_like

    _skip_unless_supported(family)
    seqlen = 1000
    q = (torch.randn(2, seqlen, 4, head_dim, device="cuda") + 0.5).bfloat16()
    k = torch.randn(2, seqlen, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    key = 3 if where == "first" else seqlen - 3
    k[:, key] = 2.0  # q . k[key] ~ head_dim, every other score ~ sqrt(head_dim)
    softmax_scale = 30 * head_dim**-0.5
    got, lse = api.forward(
        q, k, v, causal=causal, softmax_scale=softmax_scale, out=poison_like(q), family=family
    )
    _check(got, lse, q, k, v, causal, softmax_scale=softmax_scale)


@pytest.mark.parametrize("family", family_names())
def test_non_default_stream(family):
    from cuteattn import api

    _skip_unless_supported(family)
    q = torch.randn(3, 777, 8, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(3, 1234, 2, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    expected, expected_lse = api.forward(q, k, v, causal=True, family=family)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # A long kernel first on this stream: a launch on the default stream would not wait.
        torch.cuda._sleep(10_000_000)
        out = torch.full_like(q, float("nan"))
        got, lse = api.forward(q, k, v, causal=True, out=out, family=family)
    side.synchronize()
    assert torch.equal(got, expected) and torch.equal(lse, expected_lse)
    _check(got, lse, q, k, v, True)


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("family", family_names())
def test_repeat_calls_are_bitwise_equal(family, head_dim, causal):
    from cuteattn import api

    _skip_unless_supported(family)
    q = torch.randn(2, 1500, 6, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1700, 3, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    first, first_lse = api.forward(q, k, v, causal=causal, family=family)
    for _ in range(3):
        again, again_lse = api.forward(q, k, v, causal=causal, family=family)
        assert torch.equal(again, first) and torch.equal(again_lse, first_lse)
    _check(first, first_lse, q, k, v, causal)
