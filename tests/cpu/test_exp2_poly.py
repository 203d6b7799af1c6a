"""The FMA-pipe exp2 (kernels/common/exp2_poly.py), step for step on float32 tensors: relative
error within fp16's half ulp over the softmax's range, exact zeros at and below -126."""

import torch

from cuteattn.kernels.common.exp2_poly import LOWEST, exp2_poly_reference


def test_relative_error_over_the_softmax_range():
    x = torch.cat([
        torch.linspace(-125.9, 8.0, 2_000_001, dtype=torch.float32),
        torch.tensor([0.0, -0.5, 0.5, -1.0, 1.0, -2.5, 7.99]),
    ])
    got = exp2_poly_reference(x).double()
    want = torch.exp2(x.double())
    relative = (got - want).abs() / want
    assert relative.max().item() < 8e-5  # fp16's half ulp is 2.4e-4
    assert torch.isfinite(got).all() and (got > 0).all()


def test_masked_scores_give_exact_zeros():
    x = torch.tensor([-float("inf"), -1e30, -200.0, LOWEST])
    assert (exp2_poly_reference(x) == 0.0).all()
