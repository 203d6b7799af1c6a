"""What a kernel family is to the planner and the compiler, in plain Python (no DSL import).

A family is one way of computing attention on a class of GPUs (sm80: warp mma.sync + cp.async;
sm90: TMA + WGMMA). Each family module ``kernels/<family>/family.py`` exposes ``FAMILY``, an
instance of a ``KernelFamily`` subclass; ``cuteattn.plan`` walks them in preference order, and
``cuteattn.runtime.compile`` builds a plan's kernel through its family without knowing which
one it is. Kernel classes, and the DSL with them, are imported only inside ``kernel``.

Family descriptors read the planner's records (``Problem``, ``KernelPlan``) from
``cuteattn.plan``; the planner loads the descriptors lazily by module name, so neither imports
the other while loading.
"""

import abc
import dataclasses
import math
from typing import ClassVar

from cuteattn.arch import KNOWN_ARCHS, ArchCaps
from cuteattn.plan import KernelPlan, Problem


# Plan options that come from the problem's score features rather than from a family's tiling
# choices; every family's plans carry them the same way (``with_features``).
FEATURE_OPTIONS = ("dim", "dim_v", "lse", "seqused_k", "sink", "softcap", "varlen", "window")


def kernel_head_dim(head_dims: tuple[int, ...], head_dim: int) -> int | None:
    """The head dim of the kernel that runs inputs of ``head_dim``: itself, or the next one a
    family compiles (the kernel pads: ``KernelFamily.pads_head_dim``); None past the largest."""
    fitting = [dim for dim in head_dims if dim >= head_dim]
    return min(fitting) if fitting else None


def feature_options(problem: Problem, kind: str = "forward") -> tuple:
    """The (name, value) options of ``problem``'s score features for a ``kind`` plan:
    ("softcap", value) when soft-capping is on; ("sink", True) for a forward with a learnable
    sink (the backward reads the sink only through lse); ("lse", False) for a forward whose
    caller reads no lse (its kernel writes none)."""
    options = []
    if not problem.lse and kind == "forward":
        options.append(("lse", False))
    if problem.head_dim_v != problem.head_dim:
        options.append(("dim_v", problem.head_dim_v))
    if problem.sink and kind == "forward":
        options.append(("sink", True))
    if problem.softcap > 0:
        options.append(("softcap", float(problem.softcap)))
    if problem.window is not None:
        options.append(("window", tuple(problem.window)))
    if problem.varlen:
        options.append(("varlen", True))
        if problem.seqused_k:
            options.append(("seqused_k", True))
    return tuple(options)


def with_features(options: tuple, problem: Problem, kind: str = "forward") -> tuple:
    """A family's own options plus the problem's feature options, sorted by name."""
    return tuple(sorted(options + feature_options(problem, kind)))


def family_options(plan: KernelPlan) -> tuple:
    """``plan``'s options without the feature options: what the family itself chose."""
    return tuple(pair for pair in plan.options if pair[0] not in FEATURE_OPTIONS)


def features_well_formed(plan: KernelPlan) -> bool:
    """Whether ``plan``'s feature options hold values the kernels take (a positive finite
    softcap, or none)."""
    softcap = plan.option("softcap")
    sink = plan.option("sink")
    return (
        (softcap is None or (isinstance(softcap, float) and math.isfinite(softcap) and softcap > 0))
        and (sink is None or (sink is True and plan.kind == "forward"))
        and (plan.option("lse") is None or (plan.option("lse") is False and plan.kind == "forward"))
        and dim_well_formed(plan)
        and (
            plan.option("dim_v") is None
            or (type(plan.option("dim_v")) is int and plan.option("dim_v") != plan.head_dim
                and plan.option("dim") is None)
        )
        and window_well_formed(plan.option("window"), plan.causal)
        and plan.option("varlen") in (None, True)
        and plan.option("seqused_k") in (None, True)
        and (plan.option("seqused_k") is None or plan.option("varlen") is True)
    )


def dim_well_formed(plan: KernelPlan) -> bool:
    """No ("dim", d) option, or the inputs' head dim d: a multiple of 8 below the kernel's
    head dim (which it pads to)."""
    dim = plan.option("dim")
    return dim is None or (type(dim) is int and 0 < dim < plan.head_dim and dim % 8 == 0)


def window_well_formed(window, causal: bool) -> bool:
    """None, or a (left, right) pair of ints >= -1 that is neither unbounded on both sides
    nor the causal mask (-1, 0), on a plan that is not causal (``Problem.window``)."""
    if window is None:
        return True
    return (
        not causal
        and isinstance(window, tuple)
        and len(window) == 2
        and all(type(bound) is int and bound >= -1 for bound in window)
        and window not in ((-1, -1), (-1, 0))
    )


class KernelFamily(abc.ABC):
    """A kernel family's capabilities, tilings and kernels.

    Subclasses set ``name`` (the ``KernelPlan.family`` value) and ``head_dims`` (what its
    kernels compile), and implement ``supports``, ``candidates``, ``can_implement`` and
    ``kernel``.
    """

    name: ClassVar[str]
    head_dims: ClassVar[tuple[int, ...]]
    # Whether the forward takes inputs of a head dim between the compiled ones, padded to the
    # next one inside the kernel (never by copying the inputs).
    pads_head_dim: ClassVar[bool] = False
    # Whether the family has a backward kernel (``backward_candidates``, ``kind="backward"``
    # plans in ``can_implement`` and ``kernel``).
    has_backward: ClassVar[bool] = False
    # (head dim, dim_v) pairs with a dim_v of their own (plan option ("dim_v", d)), forward
    # and backward: MLA-style attention (DeepSeek: 192 for q and k, 128 for v).
    dim_v_pairs: ClassVar[tuple[tuple[int, int], ...]] = ()

    @abc.abstractmethod
    def supports(self, arch: ArchCaps) -> bool:
        """Whether the family's kernels run on ``arch``, judged by its capabilities."""

    def reject_reason(self, problem: Problem) -> str | None:
        """Why the family cannot take ``problem`` whatever the tiling, or None if it can.

        The default covers head dims; families add their own limits (grid sizes, say).
        """
        padded = self.pads_head_dim and kernel_head_dim(self.head_dims, problem.head_dim)
        if problem.head_dim not in self.head_dims and not padded:
            return f"head_dim {problem.head_dim} is not one of {self.head_dims}"
        pair = (problem.head_dim, problem.head_dim_v)
        if problem.head_dim_v != problem.head_dim and pair not in self.dim_v_pairs:
            pairs = ", ".join(str(p) for p in self.dim_v_pairs) or "none"
            return (
                f"dim_v {problem.head_dim_v} with head_dim {problem.head_dim}: the (dim, dim_v) "
                f"pairs of this family are {pairs}"
            )
        return None

    @abc.abstractmethod
    def candidates(self, problem: Problem) -> tuple[KernelPlan, ...]:
        """The plans the family would try for ``problem``, best first, before any fit test."""

    def backward_candidates(self, problem: Problem) -> tuple[KernelPlan, ...]:
        """The backward plans the family would try for ``problem``, best first."""
        return ()

    @abc.abstractmethod
    def can_implement(self, plan: KernelPlan, arch: ArchCaps) -> bool:
        """Whether ``plan`` compiles to a correct kernel that fits ``arch`` (shared memory)."""

    def plan_mismatch(self, plan: KernelPlan, problem: Problem) -> str | None:
        """What in ``plan``'s family options contradicts ``problem``, or None (``check_plan``
        compares the common fields). Backward plans carry the call's ``deterministic``."""
        if plan.kind == "backward" and plan.option("deterministic") != problem.deterministic:
            return (
                f"deterministic {plan.option('deterministic')!r} (the call asks for "
                f"{problem.deterministic!r})"
            )
        if plan.option("softcap", 0.0) != float(problem.softcap):
            return f"softcap {plan.option('softcap', 0.0)!r} (the call asks for {problem.softcap!r})"
        if plan.kind == "forward" and plan.option("sink", False) != problem.sink:
            return f"sink {plan.option('sink', False)!r} (the call asks for {problem.sink!r})"
        if plan.option("window") != problem.window:
            return f"window {plan.option('window')!r} (the call asks for {problem.window!r})"
        if (
            plan.option("varlen", False), plan.option("seqused_k", False)
        ) != (problem.varlen, problem.seqused_k):
            return (
                f"varlen / seqused_k {plan.option('varlen', False)!r} / "
                f"{plan.option('seqused_k', False)!r} (the call asks for {problem.varlen!r} / "
                f"{problem.seqused_k!r})"
            )
        return None

    @abc.abstractmethod
    def kernel(self, plan: KernelPlan):
        """The forward kernel object for ``plan``, ready for ``cute.compile``.

        Called as ``kernel(q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k,
        max_seqlen_q, softmax_scale, max_ctas, stream)`` with the arguments of
        ``fake_forward_args``; ``max_ctas`` (Int32, the SM count) sizes a persistent
        kernel's grid, and single-tile kernels ignore it.
        """

    @staticmethod
    def kernel_shape(plan: KernelPlan) -> dict:
        """The fields every kernel class takes from a plan (``kernels/common/kernel_base.py``'s
        ``AttentionKernel``): a family's ``kernel`` adds its own."""
        from cuteattn.kernels.common.compile_args import dsl_dtype

        return dict(
            dtype=dsl_dtype(plan.dtype),
            head_dim=plan.head_dim,
            tile_m=plan.tile_m,
            tile_n=plan.tile_n,
            causal=plan.causal,
            softcap=plan.option("softcap", 0.0),
            window=plan.option("window"),
            varlen=plan.option("varlen", False),
            head_dim_v=plan.option("dim_v"),
        )

    def fake_forward_args(self, plan: KernelPlan) -> tuple:
        """``compile_args.fake_forward_args``: the fake DSL arguments to compile ``plan``'s
        forward kernel with."""
        from cuteattn.kernels.common.compile_args import fake_forward_args

        return fake_forward_args(plan)

    def fake_backward_args(self, plan: KernelPlan) -> tuple:
        """(q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv, semaphore) fake DSL arguments to
        compile a backward plan's kernel with (semaphore None unless ``dq_counters``)."""
        from cuteattn.kernels.common.compile_args import fake_backward_args

        return fake_backward_args(
            plan, self.dq_accum_chunks(plan), counters=self.dq_counters(plan)
        )

    def planning_knobs(self, problem: Problem) -> tuple:
        """What the family's choice for ``problem`` reads besides the problem (a benchmark's
        environment override, say): part of the planner's memo key, so a change is seen."""
        return ()

    def uses_tile_counter(self, plan: KernelPlan) -> bool:
        """Whether ``plan``'s forward kernel hands out its work tiles from a global counter:
        the caller then passes a zeroed (1,) int32 tensor as its ``tile_counter``."""
        return False

    def fake_tile_counter(self, plan: KernelPlan):
        """The fake ``tile_counter`` argument to compile ``plan``'s forward kernel with."""
        if not self.uses_tile_counter(plan):
            return None
        import cutlass
        from cutlass.cute.runtime import make_fake_tensor

        return make_fake_tensor(cutlass.Int32, (1,), (1,), assumed_align=4)

    def dq_accum_chunks(self, plan: KernelPlan) -> tuple[int, int]:
        """(chunks, row_pad) of a backward plan's fp32 dq accumulator, laid out (batch,
        heads_q, chunks, rows, head_dim / chunks + row_pad): column chunks one after the other,
        rows padded by row_pad floats (the default, (1, 0), is plain (rows, head_dim))."""
        return 1, 0

    def stores_first_additions(self, plan: KernelPlan, seqlen_q: int, seqlen_k: int) -> bool:
        """Whether a fixed-length backward call of ``plan``'s kernel stores every query tile's
        first addition to dq_accum (a deterministic first turn, or the key tile that claims the
        query tile) instead of adding it, so that its accumulator needs no zero fill
        (``ops.dq_accum_needs_zeros``)."""
        return False

    def dq_counters(self, plan: KernelPlan) -> bool:
        """Whether a backward plan's kernel takes int32 counters per (batch, query head, query
        tile): the deterministic turns, or the claims of a query tile's first addition
        (``semaphore`` in ``ops.launch_backward``)."""
        return bool(plan.option("deterministic", False))

    def dq_counters_start(self, plan: KernelPlan, accum_zeroed: bool) -> int:
        """The value the counters start at (``dq_counters``): 0, the first turn (or a query
        tile nobody has claimed yet)."""
        return 0

    def dq_accum_fragment_order(self, plan: KernelPlan) -> tuple | None:
        """(this family's name, its layout...) when a backward plan's kernel adds each query
        tile of dq_accum in its dQ MMA's fragment order (the postprocess reads it back in that
        order: ``fragment_dq_postprocess``); None: plain rows (``dq_accum_chunks``)."""
        return None

    def fragment_dq_postprocess(self, layout: tuple, **shape):
        """The postprocess kernel object for ``dq_accum_fragment_order``'s ``layout`` (what
        follows the family's name) and ``shape`` (dtype, head_dim, kernel_dim, rows_tile)."""
        raise NotImplementedError(f"family {self.name!r} adds dq in plain rows")

    def choose(self, problem: Problem) -> KernelPlan | None:
        """The first candidate that ``can_implement`` on the problem's arch, or None."""
        for plan in self.candidates(problem):
            if self.can_implement(plan, problem.arch):
                return plan
        return None

    def choose_backward(self, problem: Problem) -> KernelPlan | None:
        """The first backward candidate that ``can_implement`` on the arch, or None."""
        for plan in self.backward_candidates(problem):
            if self.can_implement(plan, problem.arch):
                return plan
        return None

    def representative_problems(
        self, *, dtype: str, head_dim: int, causal: bool, arch: ArchCaps
    ) -> tuple[Problem, ...]:
        """Problems that reach every plan the family can choose on ``arch`` for these compile
        settings: short and long sequences, MHA and GQA. A family whose choice depends on
        other sizes overrides this."""
        return tuple(
            Problem(
                batch=1, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=heads_q, heads_kv=1,
                head_dim=head_dim, head_dim_v=head_dim, dtype=dtype, causal=causal, arch=arch,
            )
            for seqlen in (1, 2**14)
            for heads_q in (1, 8)
        )

    def every_plan(
        self, *, dtype: str, head_dim: int, causal: bool, run_on: ArchCaps
    ) -> tuple[KernelPlan, ...]:
        """Every distinct plan the family chooses on some known arch, retargeted to ``run_on``.

        Lets one GPU run each tiling that any architecture would get, once; plans that cannot
        run on ``run_on`` (tiles larger than its shared memory) are left out.
        """
        plans = []
        for arch in KNOWN_ARCHS.values():
            if not self.supports(arch):
                continue
            for problem in self.representative_problems(
                dtype=dtype, head_dim=head_dim, causal=causal, arch=arch
            ):
                if self.reject_reason(problem) is not None:
                    continue
                chosen = self.choose(problem)
                if chosen is None:
                    continue
                plan = dataclasses.replace(chosen, arch=run_on.name)
                if plan not in plans and self.can_implement(plan, run_on):
                    plans.append(plan)
        return tuple(plans)

    def __repr__(self) -> str:
        return f"<kernel family {self.name}>"
