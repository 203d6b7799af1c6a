"""Forward-attention benchmark: ``python -m cuteattn.bench --help``.

Compares cuteattn against PyTorch SDPA (flash and cuDNN kernels) and upstream FlashAttention-4
on the same inputs, in interleaved timing rounds; ``cuteattn-<family>`` backends time one kernel
family each. Backend libraries are imported only when a benchmark run loads them, so this
package imports without a GPU or the CuTe DSL.
"""

from .backends import BACKEND_NAMES, DEFAULT_BACKENDS
from .runner import attention_flops, build_grid

__all__ = ["BACKEND_NAMES", "DEFAULT_BACKENDS", "attention_flops", "build_grid"]
