"""Head dims between the compiled kernels' (multiples of 8 from 8 to 248): every family pads
them inside the kernel, forward and backward (sm90: TMA fills the missing columns with zeros and
clips the stores; sm80: the copies skip those chunks, which hold zeros in shared memory); the
inputs are never copied. Against the fp32 reference with the dense tests' rule."""

import pytest
import torch

from cuteattn.plan import families
from cuteattn.testing import param_id, skip_unless_family_runs

pytestmark = pytest.mark.gpu

# 136: the sm90 d192 kernel with K's 32-column swizzle atoms partly past q's columns (160
# fills whole atoms).
DIMS = (8, 16, 40, 80, 136, 160, 248)
FAMILIES = [family.name for family in families()]
BACKWARD_FAMILIES = [family.name for family in families() if family.has_backward]


@pytest.mark.parametrize("seqlen_q,seqlen_k", ((1, 239), (113, 203), (1000, 1000), (16, 4096)))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("head_dim", DIMS)
@pytest.mark.parametrize("family", FAMILIES)
def test_padded_head_dim_forward(family, head_dim, dtype, causal, seqlen_q, seqlen_k):
    from cuteattn.testing import check_family_forward

    skip_unless_family_runs(family)
    # (16, 4096) with 8 query heads per KV head is packed GQA.
    heads_q, heads_kv = (8, 1) if seqlen_q == 16 else (8, 2)
    q = torch.randn(2, seqlen_q, heads_q, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    check_family_forward(q, k, v, causal=causal, family=family)


@pytest.mark.parametrize("deterministic", (False, True))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=param_id)
@pytest.mark.parametrize("head_dim", DIMS)
@pytest.mark.parametrize("family", BACKWARD_FAMILIES)
def test_padded_head_dim_backward(family, head_dim, dtype, causal, deterministic):
    """dq, dk, dv of the family's forward and backward against the reference's."""
    from cuteattn.testing import check_family_backward

    skip_unless_family_runs(family)
    q = torch.randn(2, 333, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, 517, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    check_family_backward(q, k, v, causal=causal, family=family, deterministic=deterministic)


def test_padded_head_dim_through_autograd_and_varlen():
    """flash_attn_func trains at a padded dim (the planner's family), and a packed batch pads
    the same way."""
    from cuteattn.testing import check_training_dense_and_packed

    q = torch.randn(2, 300, 8, 40, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 400, 2, 40, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    check_training_dense_and_packed(q, k, v, torch.randn_like(q))
