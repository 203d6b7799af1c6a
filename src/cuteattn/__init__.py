"""cuteattn: exact FlashAttention for NVIDIA GPUs, written in the CuTe DSL."""

from cuteattn.runtime.deps import check_dependencies

check_dependencies()

from cuteattn import reference  # noqa: E402
from cuteattn.api import flash_attn_func  # noqa: E402

__version__ = "0.1.0"

__all__ = ["flash_attn_func", "reference", "__version__"]
