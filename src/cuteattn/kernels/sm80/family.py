"""The sm80 family to the planner: warp mma.sync + cp.async, on every arch that has both
(sm_80/86/89, Hopper as a fallback, sm_120). Forward and backward kernels; plain Python, the
kernels are imported lazily."""

from cuteattn.arch import ArchCaps
from cuteattn.kernels.family import (
    KernelFamily, family_options, features_well_formed, kernel_head_dim, with_features,
)
from cuteattn.kernels.sm80 import tiling
from cuteattn.plan import DTYPES, KernelPlan, Problem

# CUDA caps grid dims y and z at 65535; the kernel puts heads on y and batch on z.
MAX_GRID_YZ = 65535

# Tiles per (head dim, causal), in order of preference: (tile_m, tile_n, threads).
# Measured on the H200 with scripts/tune_sm80.py (docs/PERF.md): causal d64 prefers narrower key
# tiles (less work wasted on the diagonal); d256 prefers 64x64 with 4 warps at every length.
# Later entries fit 99 KB of shared memory (sm_86/89/120).
SM80_TILES = {
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


# Backward tiles per head dim, in order of preference: (tile_m, tile_n, threads, Q/dO stages).
# dK and dV of a key tile live in registers (2 * tile_n * dim fp32 over the threads: at most
# 128 each); two stages load the next query tile during this one where shared memory allows
# (sm_80's 163 KB, Hopper's 227 KB); later entries fit 99 KB (sm_86/89/120).
SM80_BACKWARD_TILES = {
    # d64: FlashAttention-2's 128 x 128 (244 registers, no spills on sm_80) ran 1.08-1.10x
    # faster than 64 x 128 on the H200 (``scripts/tune_sm90.py --mode bwd --family sm80``,
    # docs/PERF.md); it needs sm_80's 163 KB, 64 x 128 fits 99 KB.
    64: ((128, 128, 256, 2), (64, 128, 256, 2)),
    96: ((64, 128, 256, 2), (64, 64, 256, 2)),
    128: ((64, 128, 256, 2), (64, 64, 256, 1)),
    192: ((64, 64, 256, 2), (64, 64, 256, 1), (64, 32, 128, 1)),
    256: ((64, 64, 256, 2), (64, 64, 256, 1), (32, 32, 128, 1)),
}


class Sm80Family(KernelFamily):
    name = "sm80"
    head_dims = tiling.SUPPORTED_HEAD_DIMS
    # Rows are copied in 16-byte chunks: the chunks past the inputs' columns are skipped and
    # hold zeros in shared memory (kernels/common/columns.py).
    pads_head_dim = True
    has_backward = True
    dim_v_pairs = ((192, 128),)

    def supports(self, arch: ArchCaps) -> bool:
        return arch.mma_sync and arch.cp_async

    def reject_reason(self, problem: Problem) -> str | None:
        reason = super().reject_reason(problem)
        if reason is None and (problem.batch > MAX_GRID_YZ or problem.heads_q > MAX_GRID_YZ):
            reason = (
                f"batch ({problem.batch}) and heads of q ({problem.heads_q}) must each be "
                f"<= {MAX_GRID_YZ} (one CTA per query tile, heads and batch on grid y and z)"
            )
        return reason

    def candidates(self, problem: Problem) -> tuple[KernelPlan, ...]:
        head_dim = kernel_head_dim(self.head_dims, problem.head_dim)
        tiles = SM80_TILES.get((head_dim, problem.causal), ())
        return tuple(self._plan(problem, *tile, kind="forward") for tile in tiles)

    def backward_candidates(self, problem: Problem) -> tuple[KernelPlan, ...]:
        tiles = SM80_BACKWARD_TILES.get(kernel_head_dim(self.head_dims, problem.head_dim), ())
        return tuple(self._plan(problem, *tile, kind="backward") for tile in tiles)

    def _plan(
        self, problem: Problem, tile_m: int, tile_n: int, num_threads: int, num_stages: int = 1,
        *, kind: str,
    ):
        # The backward's one switch: dq added in key-tile order (bitwise reproducible).
        options = (("deterministic", problem.deterministic),) if kind == "backward" else ()
        head_dim = kernel_head_dim(self.head_dims, problem.head_dim)
        if head_dim != problem.head_dim:
            options += (("dim", problem.head_dim),)
        return KernelPlan(
            family=self.name,
            arch=problem.arch.name,
            dtype=problem.dtype,
            head_dim=head_dim,
            causal=problem.causal,
            tile_m=tile_m,
            tile_n=tile_n,
            num_threads=num_threads,
            num_stages=num_stages,
            options=with_features(options, problem, kind),
            kind=kind,
        )

    def can_implement(self, plan: KernelPlan, arch: ArchCaps) -> bool:
        sizes = (plan.head_dim, plan.tile_m, plan.tile_n, plan.num_threads, arch.smem_per_block)
        head_dim_v = plan.option("dim_v")
        if plan.kind == "forward":
            # One stage of K and V in shared memory.
            fits = plan.num_stages == 1 and tiling.can_implement(*sizes, head_dim_v=head_dim_v)
        else:
            fits = tiling.can_implement_backward(
                *sizes, num_stages=plan.num_stages, head_dim_v=head_dim_v
            )
        return (
            plan.family == self.name
            and plan.arch == arch.name
            and self.supports(arch)
            and plan.dtype in DTYPES
            and family_options(plan) == self._options(plan)  # the backward's one switch
            and features_well_formed(plan)
            and fits
        )

    def dq_accum_fragment_order(self, plan: KernelPlan) -> tuple | None:
        warps_dq = tiling.backward_warp_layouts(plan.num_threads // 32, plan.head_dim)[2]
        return self.name, plan.tile_m, plan.num_threads, warps_dq

    def fragment_dq_postprocess(self, layout: tuple, **shape):
        from cuteattn.kernels.sm80.dq_postprocess import FragmentDqPostprocess

        tile_m, threads, warps_dq = layout
        return FragmentDqPostprocess(tile_m=tile_m, threads=threads, warps_dq=warps_dq, **shape)

    def kernel(self, plan: KernelPlan):
        sizes = dict(
            self.kernel_shape(plan), num_threads=plan.num_threads, input_dim=plan.option("dim")
        )
        if plan.kind == "forward":
            from cuteattn.kernels.sm80.forward import FlashForwardSm80

            return FlashForwardSm80(**sizes, sink=plan.option("sink", False))
        from cuteattn.kernels.sm80.backward import FlashBackwardSm80

        return FlashBackwardSm80(
            **sizes, num_stages=plan.num_stages, deterministic=plan.option("deterministic")
        )

    @staticmethod
    def _options(plan: KernelPlan) -> tuple:
        """The options a well-formed plan of its kind carries."""
        if plan.kind == "forward":
            return ()
        deterministic = plan.option("deterministic")
        return (("deterministic", deterministic),) if isinstance(deterministic, bool) else None


FAMILY = Sm80Family()
