"""Planner: a Problem (shapes, dtypes, options, arch) -> a KernelPlan (family and tiling).

Pure Python. It reads shapes and flags, never tensor contents; it neither allocates nor
synchronises. A plan holds exactly what changes the generated code, so it is the compile-cache
key: batch and sequence lengths are runtime values and stay out of it.
"""

from dataclasses import dataclass

from cuteattn.kernels.sm80 import tiling
from cuteattn.kernels.sm80.tiling import SUPPORTED_HEAD_DIMS
from cuteattn.arch import ArchCaps

DTYPES = ("bf16", "fp16")


@dataclass(frozen=True)
class Problem:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    dtype: str  # "bf16" | "fp16"
    causal: bool
    arch: ArchCaps


@dataclass(frozen=True)
class KernelPlan:
    family: str  # "sm80"
    arch: str  # DSL target, e.g. "sm_90a"
    dtype: str
    head_dim: int
    causal: bool
    tile_m: int
    tile_n: int
    num_threads: int


# sm80 family tiles per (head dim, causal), in order of preference: (tile_m, tile_n, threads).
# Measured on the H200 with scripts/tune_sm80.py (docs/PERF.md): causal d64 prefers narrower key
# tiles (less work wasted on the diagonal); d256 prefers 64x64 with 4 warps at every length.
# Later entries fit 99 KB of shared memory (sm_86/89/120).
_SM80_TILES = {
    (64, False): ((128, 128, 128), (128, 64, 128)),
    (64, True): ((128, 64, 128),),
    (96, False): ((128, 64, 128), (64, 64, 128)),
    (96, True): ((128, 64, 128), (64, 64, 128)),
    (128, False): ((128, 64, 128), (64, 64, 128)),
    (128, True): ((128, 64, 128), (64, 64, 128)),
    (192, False): ((128, 64, 256), (64, 64, 128)),
    (192, True): ((128, 64, 256), (64, 64, 128)),
    (256, False): ((64, 64, 128),),
    (256, True): ((64, 64, 128),),
}


def plan_forward(problem: Problem) -> KernelPlan:
    if problem.head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {problem.head_dim} is not one of {SUPPORTED_HEAD_DIMS}")
    if problem.head_dim_v != problem.head_dim:
        raise NotImplementedError("dim_v != dim is not supported by any kernel yet")
    if problem.dtype not in DTYPES:
        raise ValueError(f"dtype {problem.dtype!r} is not one of {DTYPES}")
    if not problem.arch.mma_sync:
        raise NotImplementedError(f"no kernel family runs on {problem.arch.name}")
    for tile_m, tile_n, threads in _SM80_TILES[problem.head_dim, problem.causal]:
        if tiling.can_implement(
            problem.head_dim, tile_m, tile_n, threads, problem.arch.smem_per_block
        ):
            return KernelPlan(
                family="sm80",
                arch=problem.arch.name,
                dtype=problem.dtype,
                head_dim=problem.head_dim,
                causal=problem.causal,
                tile_m=tile_m,
                tile_n=tile_n,
                num_threads=threads,
            )
    raise NotImplementedError(
        f"no sm80 tiling of head_dim {problem.head_dim} fits {problem.arch.name}'s shared memory"
    )
