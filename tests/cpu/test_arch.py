"""Arch records: lookup by capability and by name, and the CUTEATTN_ARCH override."""

import pytest
import torch

from cuteattn.arch import KNOWN_ARCHS, arch_from_capability, arch_from_name
from cuteattn.runtime.arch import ARCH_ENV, device_arch


def test_names_and_capabilities_agree():
    for (major, minor), caps in KNOWN_ARCHS.items():
        assert arch_from_capability(major, minor) is caps
        assert arch_from_name(caps.name) is caps
    assert arch_from_name("sm_90") is arch_from_name("sm_90a")


def test_unknown_arch_names_the_known_ones():
    with pytest.raises(ValueError, match=r"'sm_70' is not a known arch .*sm_80"):
        arch_from_name("sm_70")
    with pytest.raises(NotImplementedError, match=r"compute capability 7.5"):
        arch_from_capability(7, 5)


def test_override_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv(ARCH_ENV, "sm_120a")
    assert device_arch(torch.device("cpu")).name == "sm_120a"
    monkeypatch.setenv(ARCH_ENV, "sm_86")
    assert device_arch(torch.device("cpu")).name == "sm_86"
    monkeypatch.setenv(ARCH_ENV, "bogus")
    with pytest.raises(ValueError, match=rf"{ARCH_ENV}: 'bogus' is not a known arch"):
        device_arch(torch.device("cpu"))
