"""Head dim 192 for q and k with 128 for v and out (MLA-style, DeepSeek) on the GPU, forward and
backward, through every family that has the pair, against the fp32 reference with the dense
tests' rule."""

import pytest
import torch

from cuteattn.plan import families
from cuteattn.testing import param_id, skip_unless_family_runs

pytestmark = pytest.mark.gpu

PAIR = (192, 128)
FAMILIES = [family.name for family in families() if PAIR in family.dim_v_pairs]
SEQLENS = ((1, 239), (113, 203), (1000, 1000))


def _inputs(seqlen_q, seqlen_k, dtype, heads):
    dim, dim_v = PAIR
    q = torch.randn(2, seqlen_q, heads[0], dim, device="cuda", dtype=dtype)
    k = torch.randn(2, seqlen_k, heads[1], dim, device="cuda", dtype=dtype)
    v = torch.randn(2, seqlen_k, heads[1], dim_v, device="cuda", dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("heads", ((8, 2), (8, 1)), ids=str)
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_dim_v_forward(family, dtype, causal, seqlen_q, seqlen_k, heads):
    from cuteattn.testing import check_family_forward

    skip_unless_family_runs(family)
    q, k, v = _inputs(seqlen_q, seqlen_k, dtype, heads)
    check_family_forward(q, k, v, causal=causal, family=family)


@pytest.mark.parametrize("deterministic", (False, True))
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS[1:])
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_dim_v_backward(family, dtype, causal, seqlen_q, seqlen_k, deterministic):
    from cuteattn.testing import check_family_backward

    skip_unless_family_runs(family)
    q, k, v = _inputs(seqlen_q, seqlen_k, dtype, (8, 2))
    check_family_backward(q, k, v, causal=causal, family=family, deterministic=deterministic)


def test_dim_v_through_autograd_and_varlen():
    """flash_attn_func trains with the pair (the planner's family), and a packed batch too."""
    from cuteattn.testing import check_training_dense_and_packed

    q, k, v = _inputs(300, 400, torch.bfloat16, (8, 2))
    dout = torch.randn(*q.shape[:3], v.shape[3], device="cuda", dtype=torch.bfloat16)
    check_training_dense_and_packed(q, k, v, dout)
