"""The arch of a torch device, with an override for cross-compiling.

``CUTEATTN_ARCH`` (read at call time, e.g. ``sm_120a``) overrides the detected device, which is
how tests cross-compile for GPUs this machine does not have.
"""

import functools
import os

from cuteattn.arch import ArchCaps, arch_from_capability, arch_from_name

ARCH_ENV = "CUTEATTN_ARCH"

__all__ = ["ARCH_ENV", "device_arch"]


def device_arch(device) -> ArchCaps:
    override = os.environ.get(ARCH_ENV)
    if override:
        try:
            return arch_from_name(override)
        except ValueError as exc:
            raise ValueError(f"{ARCH_ENV}: {exc}") from None
    import torch

    index = device if isinstance(device, int) else torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    return _arch_of_index(index)


@functools.cache
def _arch_of_index(index: int) -> ArchCaps:
    # A device's capability never changes; asking torch costs ~10 us of every call's host time.
    import torch

    return arch_from_capability(*torch.cuda.get_device_capability(index))
