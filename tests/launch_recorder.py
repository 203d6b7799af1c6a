"""CPU stand-in for the kernel launch, shared by the API tests.

``record_launches`` pretends CPU tensors sit on an sm_90a device and replaces
``ops.launch_forward`` (which the custom op and the explicit-plan path both call) with a
recorder, so a test sees what would reach the kernel: the plan, the scale and ``out``.
"""

import torch

from cuteattn import api
from cuteattn.runtime.arch import ARCH_ENV


def qkv(dim=64, dtype=torch.bfloat16):
    q = torch.randn(2, 16, 4, dim, dtype=dtype)
    k = torch.randn(2, 24, 2, dim, dtype=dtype)
    v = torch.randn(2, 24, 2, dim, dtype=dtype)
    return q, k, v


def record_launches(monkeypatch) -> list[dict]:
    """Each launch appends {"plan", "softmax_scale", "out", "sink"}; it returns a zero lse."""
    calls = []

    def fake_launch(q, k, v, out, softmax_scale, plan, sink=None):
        calls.append({"plan": plan, "softmax_scale": softmax_scale, "out": out, "sink": sink})
        return torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    monkeypatch.setenv(ARCH_ENV, "sm_90a")
    monkeypatch.setattr(api.validate, "check_devices", lambda *tensors: None)
    monkeypatch.setattr(api.ops, "launch_forward", fake_launch)
    return calls
