"""cuteattn: exact FlashAttention for NVIDIA GPUs, written in the CuTe DSL.

Importing the package needs no CuTe DSL: the dependency floors are checked, and the DSL
imported, when the first kernel compiles (cuteattn.runtime.compile).
"""

from cuteattn import reference
from cuteattn.api import flash_attn_func, flash_attn_varlen_func

__version__ = "0.1.0"

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "reference", "__version__"]
