"""GPU architectures described by capability, not by comparing version numbers.

A leaf module (it imports nothing from cuteattn): the planner, the kernel families and the
runtime all read these records. ``cuteattn.runtime.arch.device_arch`` maps a torch device to
one of them.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchCaps:
    name: str  # the DSL's target name: "sm_80", "sm_90a", "sm_120a", ...
    mma_sync: bool  # warp-level mma.sync (the sm80 family)
    cp_async: bool
    wgmma: bool  # warpgroup MMA (the sm90 family)
    tma: bool
    smem_per_block: int  # opt-in shared memory per CTA, bytes
    pdl: bool = False  # programmatic dependent launch (griddepcontrol): sm_90 and later


# Shared memory per block (opt-in maximum) from the CUDA programming guide's table.
KNOWN_ARCHS = {
    (8, 0): ArchCaps("sm_80", True, True, False, False, 163 * 1024),
    (8, 6): ArchCaps("sm_86", True, True, False, False, 99 * 1024),
    (8, 7): ArchCaps("sm_87", True, True, False, False, 163 * 1024),
    (8, 9): ArchCaps("sm_89", True, True, False, False, 99 * 1024),
    (9, 0): ArchCaps("sm_90a", True, True, True, True, 227 * 1024, pdl=True),
    (12, 0): ArchCaps("sm_120a", True, True, False, True, 99 * 1024, pdl=True),
    (12, 1): ArchCaps("sm_121a", True, True, False, True, 99 * 1024, pdl=True),
}


def _known_names() -> str:
    return ", ".join(caps.name for caps in KNOWN_ARCHS.values())


def arch_from_capability(major: int, minor: int) -> ArchCaps:
    try:
        return KNOWN_ARCHS[(major, minor)]
    except KeyError:
        raise NotImplementedError(
            f"compute capability {major}.{minor} is not supported by cuteattn "
            f"(supported: {_known_names()})"
        ) from None


def arch_from_name(name: str) -> ArchCaps:
    """The arch of a DSL target name; "sm_90" names the same arch as "sm_90a"."""
    for caps in KNOWN_ARCHS.values():
        if caps.name == name or caps.name.rstrip("a") == name:
            return caps
    raise ValueError(f"{name!r} is not a known arch (one of: {_known_names()})")
