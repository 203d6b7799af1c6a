"""GPU architectures described by capability, not by comparing version numbers.

``CUTEATTN_ARCH`` (read at call time, e.g. ``sm_120a``) overrides the detected device, which is
how tests cross-compile for GPUs this machine does not have.
"""

import os
from dataclasses import dataclass

ARCH_ENV = "CUTEATTN_ARCH"


@dataclass(frozen=True)
class ArchCaps:
    name: str  # the DSL's target name: "sm_80", "sm_90a", "sm_120a", ...
    mma_sync: bool  # warp-level mma.sync (the sm80 family)
    cp_async: bool
    wgmma: bool  # warpgroup MMA (the sm90 family, not written yet)
    tma: bool
    smem_per_block: int  # opt-in shared memory per CTA, bytes


# Shared memory per block (opt-in maximum) from the CUDA programming guide's table.
_KNOWN = {
    (8, 0): ArchCaps("sm_80", True, True, False, False, 163 * 1024),
    (8, 6): ArchCaps("sm_86", True, True, False, False, 99 * 1024),
    (8, 7): ArchCaps("sm_87", True, True, False, False, 163 * 1024),
    (8, 9): ArchCaps("sm_89", True, True, False, False, 99 * 1024),
    (9, 0): ArchCaps("sm_90a", True, True, True, True, 227 * 1024),
    (12, 0): ArchCaps("sm_120a", True, True, False, True, 99 * 1024),
    (12, 1): ArchCaps("sm_121a", True, True, False, True, 99 * 1024),
}


def arch_from_capability(major: int, minor: int) -> ArchCaps:
    try:
        return _KNOWN[(major, minor)]
    except KeyError:
        known = ", ".join(c.name for c in _KNOWN.values())
        raise NotImplementedError(
            f"compute capability {major}.{minor} is not supported by cuteattn (supported: {known})"
        ) from None


def arch_from_name(name: str) -> ArchCaps:
    for caps in _KNOWN.values():
        if caps.name == name or caps.name.rstrip("a") == name:
            return caps
    known = ", ".join(c.name for c in _KNOWN.values())
    raise ValueError(f"{ARCH_ENV}={name!r} is not a known arch (one of: {known})")


def device_arch(device) -> ArchCaps:
    override = os.environ.get(ARCH_ENV)
    if override:
        return arch_from_name(override)
    import torch

    return arch_from_capability(*torch.cuda.get_device_capability(device))
