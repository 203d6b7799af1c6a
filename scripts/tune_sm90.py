"""Time candidate sm90 plans against FlashAttention-4 and cuDNN on the same inputs (GPU only).

    python scripts/tune_sm90.py --dims 64,128 --seqlens 1024,4096 --causal both \\
        --tiles 128x128x2,192x128x2 --persistent both

Each candidate (tile_m x tile_n x num_stages, persistent or single-tile; ping-pong as the family
defaults it) is an explicit sm90 KernelPlan run through ``cuteattn.api.forward(plan=)``; a plan
the family cannot implement on this GPU (shared memory, tile_m not a multiple of 64, ...) is
skipped. Without --tiles the candidates are the family's own tiles for each (head dim, causal).
Candidates and the peers (fa4, sdpa-cudnn: those that load) get the same inputs and are timed in
interleaved rounds by the benchmark's runner; one line per shape gives TFLOP/s (bench
convention), the best candidate against the faster peer, and the planner's own choice.

With ``--mode bwd`` the candidates are a family's backward plans (``--family``: sm90, or sm80
forced on this GPU; ``--bwd-tile-m`` picks their query tiles; default: every one it offers),
each run through ``cuteattn.api.backward(plan=)`` on one forward's out and lse, against the
peers' backward through autograd (and SDPA's flash backward, sm80's peer):

    python scripts/tune_sm90.py --mode bwd --dims 256
    python scripts/tune_sm90.py --mode bwd --family sm80 --dims 64

``--deterministic true`` times the deterministic backward plans instead (named ``-det``, against
FA4's deterministic backward too), ``both`` the two side by side: the cost of determinism per
tile, in one process.
"""

import argparse
import dataclasses
import sys

import torch

from cuteattn import api
from cuteattn.bench.__main__ import DTYPES, load_available
from cuteattn.bench.backends import backward_binder
from cuteattn.bench.runner import (
    BACKWARD_FLOPS_FACTOR,
    CAUSAL_MODES,
    PEERS,
    Shape,
    ShapeResult,
    best_peer_ratio,
    build_grid,
    check_input_sizes,
    log_to_stderr,
    run_benchmark,
)
from cuteattn.kernels.sm90 import tiling
from cuteattn.kernels.sm90.family import (
    SM90_TILES,
    backward_do_stages,
    default_eager_rescale,
    default_hold_descriptors,
    keeps_one_q_stage,
)
from cuteattn.plan import KernelPlan, Problem, get_family, plan_backward, plan_forward
from cuteattn.runtime.arch import device_arch

PERSISTENT_MODES = {"both": (True, False), "true": (True,), "false": (False,)}


def int_list(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def share_list(text: str) -> list[int]:
    """``0,16,8`` -> [0, 16, 8]: every N-th exponential on the FMA pipe, 0 for none."""
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def tile_list(text: str) -> list[tuple[int, int, int]]:
    """``128x128x2,192x128x2`` -> [(tile_m, tile_n, num_stages), ...]."""
    tiles = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        try:
            tile = tuple(int(n) for n in item.lower().split("x"))
        except ValueError:
            tile = ()
        if len(tile) != 3 or min(tile) <= 0:
            raise argparse.ArgumentTypeError(f"expected tile_m x tile_n x stages like 128x128x2, got {item!r}")
        tiles.append(tile)
    if not tiles:
        raise argparse.ArgumentTypeError("no tile given")
    return tiles


def candidate_name(plan: KernelPlan) -> str:
    mode = "persistent" if plan.option("persistent") else "single"
    if plan.option("dynamic", False):
        mode = "dynamic"
    group = plan.option("pack_gqa", 1)
    packed = f"-pack{group}" if group > 1 else ""
    one_q = "-q1" if plan.option("q_stages") == 1 else ""
    poly = f"-poly{plan.option('exp2_poly')}" if plan.option("exp2_poly") else ""
    # Each switch named where the plan departs from the family's default (so the planner's
    # own plan carries no suffix and is named like its candidate).
    eager = switch_suffix(
        plan, "eager_rescale", default_eager_rescale(plan.head_dim), ("-eager", "-lazy")
    )
    early = switch_suffix(
        plan, "rescale_before_pv", (plan.option("dim_v") or plan.head_dim) > 128,
        ("-early", "-late"),
    )
    held = switch_suffix(
        plan, "hold_descriptors", default_hold_descriptors(plan.head_dim), ("-held", "-unheld")
    )
    return (
        f"{plan.tile_m}x{plan.tile_n}x{plan.num_stages}-{mode}{packed}{one_q}{poly}{eager}{early}"
        f"{held}"
    )


def switch_suffix(plan: KernelPlan, option: str, default: bool, names: tuple) -> str:
    """names[0] / names[1] where the plan turns ``option`` on / off against the family's
    ``default``, "" where it follows it."""
    value = bool(plan.option(option, default))
    if value == default:
        return ""
    return names[0] if value else names[1]


def with_options(
    plan: KernelPlan, exp2_poly: int, eager_rescale: bool | None,
    rescale_before_pv: bool | None = None, hold_descriptors: bool | None = None,
) -> KernelPlan:
    """``plan`` with every ``exp2_poly``-th exponential on the FMA pipe (0: none), O rescaled
    eagerly or lazily, before the next P V or after the softmax, and the GEMM descriptors held
    in registers or not (None: as the family chose)."""
    options = dict(plan.options)
    if exp2_poly:
        options["exp2_poly"] = exp2_poly
    if eager_rescale is not None:
        options["eager_rescale"] = eager_rescale
    if rescale_before_pv is not None:
        options["rescale_before_pv"] = rescale_before_pv
    if hold_descriptors is not None:
        options["hold_descriptors"] = hold_descriptors
    return dataclasses.replace(plan, options=tuple(sorted(options.items())))


def candidates(
    arch, shape: Shape, dtype: str, tiles, persistent_modes, pack_modes=(False,),
    one_q_stage_modes=None, exp2_poly=(0,), eager_modes=(None,), early_modes=(None,),
    held_modes=(None,),
) -> tuple[dict, list]:
    """The plans to time for ``shape`` by name, and the names of those the family cannot
    implement on ``arch``; ``one_q_stage_modes`` (True): persistent plans that would take two
    Q stages are timed with one ("-q1"); None: as the planner chooses (``keeps_one_q_stage``);
    ``exp2_poly``: each plan with every that-many-th exponential on the FMA pipe (0: none);
    ``eager_modes``: each plan with O rescaled at every key tile (True, "-eager"), lazily
    (False, "-lazy") or as the family chose (None); ``early_modes``: likewise, O rescaled
    while the next S is in flight (True, "-early") or after the softmax (False, "-late");
    ``held_modes``: likewise, the GEMM descriptors held in registers ("-held") or not."""
    if one_q_stage_modes is None:
        one_q_stage_modes = (keeps_one_q_stage(shape.dim, shape.causal, None),)
    family = get_family("sm90")
    # The family's entries lead with (tile_m, tile_n, num_stages); what follows is its own
    # persistence policy, which --persistent replaces here.
    tiles = tiles or [entry[:3] for entry in SM90_TILES.get((shape.dim, shape.causal), ())]
    plans, skipped = {}, []
    group = shape.heads // shape.heads_kv
    groups = sorted({group if pack else 1 for pack in pack_modes})
    for tile_m, tile_n, num_stages in tiles:
        for persistent, pack_gqa in ((p, g) for p in persistent_modes for g in groups):
            # Persistent causal: the static stride and the dynamic hand-out, both.
            two_q_stages = persistent and tiling.separate_o_fits(
                shape.dim, tile_m, tile_n, num_stages, arch.smem_per_block
            ) and tiling.separate_o_q_stages(
                shape.dim, tile_m, tile_n, num_stages, arch.smem_per_block
            ) == 2
            for dynamic, one_q_stage in (
                (d, one) for d in ((False, True) if persistent and shape.causal else (False,))
                for one in (one_q_stage_modes if two_q_stages else (False,))
            ):
                base = family.plan(
                    arch, dtype=dtype, head_dim=shape.dim, causal=shape.causal, tile_m=tile_m,
                    tile_n=tile_n, num_stages=num_stages, persistent=persistent, pingpong=None,
                    pack_gqa=pack_gqa, dynamic=dynamic, one_q_stage=one_q_stage,
                    # As the bench's calls (no grad, no return_lse): the kernel writes no lse.
                    features=(("lse", False),),
                )
                for plan in (
                    with_options(base, every, eager, early, held)
                    for every in exp2_poly for eager in eager_modes for early in early_modes
                    for held in held_modes
                ):
                    if family.can_implement(plan, arch):
                        plans[candidate_name(plan)] = plan
                    else:
                        skipped.append(candidate_name(plan))
    return plans, skipped


def shape_problem(arch, shape: Shape, dtype: str, deterministic: bool = False) -> Problem:
    return Problem(
        batch=shape.batch, seqlen_q=shape.seqlen, seqlen_k=shape.seqlen_k, heads_q=shape.heads,
        heads_kv=shape.heads_kv, head_dim=shape.dim, head_dim_v=shape.dim, dtype=dtype,
        causal=shape.causal, arch=arch, deterministic=deterministic,
    )


def planner_choice(arch, shape: Shape, dtype: str, mode: str = "fwd", family: str = "sm90") -> str:
    problem = shape_problem(arch, shape, dtype)
    try:
        if mode == "bwd":
            return backward_name(plan_backward(problem, family=family))
        return candidate_name(plan_forward(problem, family="sm90"))
    except NotImplementedError:
        return "n/a"


def backward_name(plan: KernelPlan) -> str:
    stages = ""
    if plan.family == "sm90":
        do_stages = backward_do_stages(plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages)
        # Named where dO keeps fewer stages than Q (d192's 64 x 96 comes with one of each too).
        stages = f"-q{plan.num_stages}do{do_stages}" if do_stages != plan.num_stages else ""
    return (
        f"bwd-{plan.tile_m}x{plan.tile_n}{stages}"
        + ("" if plan.family == "sm90" else f"-{plan.family}")
        + ("-det" if plan.option("deterministic", False) else "")
        + switch_suffix(
            plan, "hold_descriptors", default_hold_descriptors(plan.head_dim, "backward"),
            ("-held", "-unheld"),
        )
    )


def backward_candidates(
    arch, shape: Shape, dtype: str, tile_ms=None, family: str = "sm90", deterministic=(False,),
    held_modes=(None,),
) -> dict:
    """A family's backward plans for ``shape`` by name: every one it offers and can implement
    on ``arch``, or those whose tile_m is in ``tile_ms``; for each of ``deterministic``, and
    with the GEMM descriptors held in registers or not (``held_modes``; None: as offered)."""
    family = get_family(family)
    plans = {}
    for det in deterministic:
        for offered in family.backward_candidates(shape_problem(arch, shape, dtype, det)):
            for held in held_modes:
                plan = offered
                if held is not None:
                    options = tuple(sorted(dict(offered.options, hold_descriptors=held).items()))
                    plan = dataclasses.replace(offered, options=options)
                if family.can_implement(plan, arch) and (tile_ms is None or plan.tile_m in tile_ms):
                    plans[backward_name(plan)] = plan
    return plans


def backward_plan_binder(plan: KernelPlan):
    deterministic = plan.option("deterministic", False)

    def bind(q, k, v, causal):
        out, lse = api.forward(q, k, v, causal=causal)
        dout = torch.randn_like(out)
        return lambda: api.backward(
            dout, q, k, v, out, lse, causal=causal, deterministic=deterministic, plan=plan
        )

    return bind


def plan_binder(plan: KernelPlan):
    def bind(q, k, v, causal):
        return lambda: api.forward(q, k, v, causal=causal, plan=plan, return_lse=False)[0]

    return bind


def shape_line(shape: Shape, result: ShapeResult, names, planner: str, peers=PEERS) -> str:
    """The row's TFLOP/s per name, the fastest candidate (a name not in ``peers``) against the
    faster of fa4 and cuDNN, and against each other peer that ran (sdpa-flash: sm80's), and the
    planner's choice."""
    measured = ", ".join(f"{name} {result.tflops(name):.1f}" for name in names if name in result.ms_by_backend)
    seqlens = f"s{shape.seqlen}" + (f"/{shape.seqlen_k}" if shape.seqlen_k != shape.seqlen else "")
    line = f"d{shape.dim} {seqlens} causal={shape.causal} heads={shape.heads}/{shape.heads_kv}: {measured or 'nothing ran'}"
    timed = [name for name in names if name in result.ms_by_backend and name not in peers]
    if timed:
        best = min(timed, key=result.ms_by_backend.__getitem__)
        ratio = best_peer_ratio(result, subject=best)
        versus = "no peer" if ratio is None else f"{ratio.value:.2f}x {ratio.peer}"
        for other in (peer for peer in peers if peer not in PEERS):
            extra = best_peer_ratio(result, peers=(other,), subject=best)
            if extra is not None:
                versus += f", {extra.value:.2f}x {extra.peer}"
        line += f" | best {best}: {versus}"
    return line + f" | planner {planner}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int_list, default=[64, 128, 256], help="default: 64,128,256")
    parser.add_argument("--seqlens", type=int_list, default=[1024, 4096, 16384], help="default: 1024,4096,16384")
    parser.add_argument("--causal", choices=tuple(CAUSAL_MODES), default="both")
    parser.add_argument("--tiles", type=tile_list, default=None,
                        help="tile_m x tile_n x stages, comma-separated, e.g. 128x128x2,192x128x2 "
                             "(default: the family's tiles for each head dim and causal)")
    parser.add_argument("--persistent", choices=tuple(PERSISTENT_MODES), default="both",
                        help="persistent and/or single-tile scheduling (default: both)")
    parser.add_argument("--pack-gqa", choices=tuple(PERSISTENT_MODES), default="false",
                        help="packed GQA candidates (query heads per KV head in one tile): "
                             "true, false or both (default: false)")
    parser.add_argument("--one-q-stage", choices=("planner", *PERSISTENT_MODES), default="planner",
                        help="persistent plans that fit two Q stages: with one (true), two "
                             "(false), both, or as the planner chooses (default)")
    parser.add_argument("--exp2-poly", type=share_list,
                        default=[0], help="forward: time each plan with every N-th softmax "
                        "exponential on the FMA pipe, for each N given (0: none; default 0)")
    parser.add_argument("--eager-rescale", choices=("planner", *PERSISTENT_MODES),
                        default="planner", help="forward: plans that rescale O at every key "
                        "tile (true), lazily (false), both, or as the family chose (default)")
    parser.add_argument("--rescale-before-pv", choices=("planner", *PERSISTENT_MODES),
                        default="planner", help="forward: plans that rescale O while the next "
                        "S = Q K^T is in flight (true), after the softmax (false), both, or as "
                        "the family chose (default)")
    parser.add_argument("--hold-descriptors", choices=("planner", *PERSISTENT_MODES),
                        default="planner", help="plans (forward, or --mode bwd) "
                        "whose GEMM descriptors are computed once and held in registers (true), "
                        "rebuilt at each GEMM (false), both, or as the family chose (default)")
    parser.add_argument("--mode", choices=("fwd", "bwd"), default="fwd",
                        help="time forward plans (default) or backward plans")
    parser.add_argument("--family", choices=("sm90", "sm80"), default="sm90",
                        help="--mode bwd: the family whose backward plans are timed (default: sm90)")
    parser.add_argument("--bwd-tile-m", type=int_list, default=None,
                        help="--mode bwd: the backward query tiles to time (default: every one "
                             "the family offers for the head dim)")
    parser.add_argument("--deterministic", choices=tuple(PERSISTENT_MODES), default="false",
                        help="--mode bwd: deterministic plans (true), or both kinds side by side")
    parser.add_argument("--seqlen-k", type=int, default=None,
                        help="keys per sequence (default: the row's seqlen)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--tokens", type=int, default=32768, help="batch = tokens // seqlen (default: 32768)")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden // dim (default: 2048)")
    parser.add_argument("--heads-kv", type=int, default=None, help="k/v heads, GQA / MQA (default: MHA)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is reported")
    parser.add_argument("--iters", type=int, default=10, help="calls per timed window")
    args = parser.parse_args(argv)
    try:
        shapes = build_grid(
            args.dims, args.seqlens, CAUSAL_MODES[args.causal], args.tokens, args.hidden, heads_kv=args.heads_kv
        )
        if args.seqlen_k is not None:
            shapes = [dataclasses.replace(shape, seqlen_k=args.seqlen_k) for shape in shapes]
        check_input_sizes(shapes)
    except ValueError as exc:
        parser.error(str(exc))
    if not torch.cuda.is_available():
        print("tune_sm90: needs a CUDA GPU", file=sys.stderr)
        return 2

    arch = device_arch(torch.device("cuda"))
    peers = load_available(PEERS)
    if args.mode == "bwd":
        return tune_backward(args, shapes, arch, peers)
    for shape in shapes:
        plans, skipped = candidates(
            arch, shape, args.dtype, args.tiles, PERSISTENT_MODES[args.persistent],
            PERSISTENT_MODES[args.pack_gqa], PERSISTENT_MODES.get(args.one_q_stage),
            args.exp2_poly, PERSISTENT_MODES.get(args.eager_rescale, (None,)),
            PERSISTENT_MODES.get(args.rescale_before_pv, (None,)),
            PERSISTENT_MODES.get(args.hold_descriptors, (None,)),
        )
        if skipped:
            log_to_stderr(f"{shape.label()}: sm90 cannot implement {', '.join(skipped)} on {arch.name}; skipped")
        if not plans:
            print(f"d{shape.dim} s{shape.seqlen} causal={shape.causal}: no candidate plan", flush=True)
            continue
        binders = {name: plan_binder(plan) for name, plan in plans.items()} | peers
        (result,) = run_benchmark([shape], binders, dtype=DTYPES[args.dtype], rounds=args.rounds, iters=args.iters)
        print(shape_line(shape, result, list(binders), planner_choice(arch, shape, args.dtype)), flush=True)
    return 0


def tune_backward(args, shapes, arch, peers) -> int:
    peer_names = PEERS
    if args.family == "sm80":
        peer_names = PEERS + ("sdpa-flash",)
        peers = peers | load_available(["sdpa-flash"])
    deterministic = PERSISTENT_MODES[args.deterministic]
    if True in deterministic:
        peer_names = peer_names + ("fa4-deterministic",)
        peers = peers | load_available(["fa4-deterministic"])
    peers = {name: backward_binder(bind) for name, bind in peers.items()}
    for shape in shapes:
        plans = backward_candidates(
            arch, shape, args.dtype, args.bwd_tile_m, args.family, deterministic,
            PERSISTENT_MODES.get(args.hold_descriptors, (None,)),
        )
        if not plans:
            print(f"d{shape.dim} s{shape.seqlen} causal={shape.causal}: no backward candidate", flush=True)
            continue
        binders = {name: backward_plan_binder(plan) for name, plan in plans.items()} | peers
        (result,) = run_benchmark(
            [shape], binders, dtype=DTYPES[args.dtype], rounds=args.rounds, iters=args.iters,
            flops_factor=BACKWARD_FLOPS_FACTOR,
        )
        planner = planner_choice(arch, shape, args.dtype, "bwd", args.family)
        print(shape_line(shape, result, list(binders), planner, peer_names), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
