"""The sm90 family to the planner: TMA + WGMMA + warp specialisation, on archs with WGMMA and
TMA (sm_90a: H100, H200). Plain Python; the kernel is imported lazily.

Plan options (compile-time switches, ``KernelPlan.options``):
  - ``pingpong``: consumer warpgroups take turns issuing GEMMs (named barriers), so one
    warpgroup's softmax overlaps the other's GEMMs;
  - ``persistent``: one CTA per SM walks the work tiles; the next tile's loads overlap this
    tile's epilogue (its Q too where O has a buffer of its own in shared memory or takes V's
    stages, else after O's store: ``tiling.separate_o_fits``, ``tiling.o_in_v_fits``; with a
    buffer of its own, two Q stages where they fit, so the next Q loads while this tile runs:
    ``tiling.separate_o_q_stages``); ``q_stages`` 1 (absent: as many as fit) keeps one
    where two fit (``keeps_one_q_stage``);
  - ``pack_gqa``: query heads per KV head stacked in one tile's rows (1: off). With GQA and
    short queries, a tile of one head is mostly padding and every query head reloads the same
    K and V; packed, one tile serves the whole group (``should_pack_gqa``).
"""

import math
import os


from cuteattn.arch import ArchCaps, arch_from_name
from cuteattn.kernels.family import (
    KernelFamily, family_options, features_well_formed, kernel_head_dim, with_features,
)
from cuteattn.kernels.sm90 import tiling
from cuteattn.plan import DTYPES, KernelPlan, Problem

# Query lengths up to this are short: per-tile prologue and epilogue are a large share of a
# tile's time, and a persistent kernel hides them behind the next tile (docs/PERF.md).
SHORT_SEQLEN_Q = 2048
ALWAYS = 2**62  # persistent at every length

# Tiles per (head dim, causal), in order of preference: (tile_m, tile_n, num_stages, persistent
# up to this seqlen_q). Measured on the H200 (docs/PERF.md, scripts/tune_sm90.py); tile_m is 64
# rows per consumer warpgroup; 0: never persistent. d192 and d256 tiles leave no room for an O
# buffer of its own: their persistent kernels put O in V's stages (the thresholds below were
# measured with O in Q's buffer).
SM90_TILES = {
    # Persistent at every length since the R2P masks (eighth session, docs/PERF.md): 192x128
    # 421 / 517 / 544 TFLOP/s at 1k / 4k / 16k against single-tile's 362 / 477 / 507.
    (64, False): ((192, 128, 2, ALWAYS), (128, 128, 2, ALWAYS)),
    # Causal: 192x128 from 4k (432 / 521 against 128x128's 386 / 418 at 4k / 16k); short
    # queries take 128x128 (SM90_SHORT_TILES: 315 against 289 at 1k).
    (64, True): ((192, 128, 2, ALWAYS), (128, 128, 2, ALWAYS)),
    (96, False): ((128, 128, 2, SHORT_SEQLEN_Q),),
    (96, True): ((128, 128, 2, SHORT_SEQLEN_Q),),
    # Persistent 1.05-1.14x single-tile at every length measured (eighth session).
    (128, False): ((128, 128, 2, ALWAYS),),
    (128, True): ((128, 128, 2, ALWAYS),),
    # Ninth session: persistent (O in Q's buffer) 741 against single-tile's 716 at 16k; short
    # queries take 128x96 (SM90_SHORT_TILES: 583 against 128x112's 550 / 545 at 1k).
    (192, False): ((128, 112, 2, ALWAYS), (128, 96, 2, ALWAYS)),
    # Causal single-tile from 4k (590 / 690 at 4k / 16k, dynamic 589 / 674); short queries
    # take 128x96 persistent with tiles handed out (438 against 409 single at 1k).
    (192, True): ((128, 112, 2, 0), (128, 96, 2, 0)),
    # 128x80 persistent best dense at 16k (739; single 717, 128x64 719); short queries take
    # 128x64 persistent (572 against 128x80's 556 / 554 at 1k).
    (256, False): ((128, 80, 2, ALWAYS), (128, 64, 2, ALWAYS)),
    # Causal: 128x64 persistent with tiles handed out up to 4k (455 / 613 against single's
    # 440 / 608 at 1k / 4k); single-tile at 16k (695 against 691).
    (256, True): ((128, 64, 2, 4096), (128, 80, 2, 0)),
}
# Packed (varlen) batches persistent where measured faster (eighth session, 17 sequences up to
# 5590, cuteattn / FA4 on the same inputs, persistent against single-tile): d64 dense 0.96 vs
# 0.94, causal 0.98 vs 0.84, d128 dense 0.98 vs 0.96. Not d128 causal (0.92 vs 1.07): a static
# stride over tiles of mixed lengths is less balanced than the hardware's dispatch of the
# longest-first single-tile grid.
# Head dims whose persistent forwards keep the static stride past this many queries.
DYNAMIC_SEQLEN_Q_UP_TO = {128: 8192}
SM90_VARLEN_PERSISTENT = {(64, False), (64, True), (128, False)}
# Tiles that go first when seqlen_q <= SHORT_SEQLEN_Q: fewer rows per tile, more tiles to
# spread over the SMs.
SM90_SHORT_TILES = {
    (64, True): ((128, 128, 2, ALWAYS),),
    (192, False): ((128, 96, 2, ALWAYS),),
    (192, True): ((128, 96, 2, ALWAYS),),
    (256, False): ((128, 64, 2, ALWAYS),),
}
# (head dim, dim_v) pairs: V's smaller tiles leave room for wider key tiles (unmeasured: the
# d192 tiles follow as the fallback).
SM90_DIM_V_TILES = {(192, 128): ((128, 128, 2, 0),)}


# Soft-capped forwards: every that-many-th softmax exponential on the FMA pipe instead of MUFU,
# which also runs each score's tanh (``kernels/common/exp2_poly.py``). Measured on the H200
# (d64 / d128 causal s8k softcap 50, TFLOP/s; docs/PERF.md): every 2nd 319 / 469, every 4th
# 329 / 520, every 8th 340 / 531, none 331 / 508: a small share helps, a large one starves the
# FMA pipe. The environment variable overrides it for benchmarks (0: every exponential on MUFU).
SOFTCAP_EXP2_POLY_EVERY = 8
EXP2_POLY_ENV = "CUTEATTN_SOFTCAP_EXP2_POLY_EVERY"


def softcap_exp2_poly_every() -> int:
    """SOFTCAP_EXP2_POLY_EVERY, or the environment's value (a non-negative int)."""
    value = os.environ.get(EXP2_POLY_ENV)
    if value is None:
        return SOFTCAP_EXP2_POLY_EVERY
    if not value.isdigit():
        raise ValueError(f"{EXP2_POLY_ENV} must be a non-negative integer, got {value!r}")
    return int(value)


# Pack when the packed tiles' rows are at most this fraction as wasted as unpacked ones'.
PACK_GQA_MIN_GAIN = 0.9


def should_pack_gqa(seqlen_q: int, heads_q: int, heads_kv: int, tile_m: int) -> bool:
    """Whether packed GQA fills the query tiles better: unpacked, a tile holds tile_m positions
    of one head; packed, tile_m // group positions of all the group's heads. Their row use is
    compared (packing also reads K and V once per group rather than per head)."""
    group = heads_q // heads_kv
    if group == 1 or group > tile_m:
        return False
    positions = tile_m // group
    unpacked_use = seqlen_q / (math.ceil(seqlen_q / tile_m) * tile_m)
    packed_use = seqlen_q * group / (math.ceil(seqlen_q / positions) * tile_m)
    return unpacked_use < PACK_GQA_MIN_GAIN * packed_use


def hands_out_tiles(problem: Problem, tile_m: int) -> bool:
    """Whether a persistent forward hands out its tiles as CTAs ask (``DynamicTileScheduler``)
    instead of a static stride: fixed-length batches whose tiles differ in work (causal, a
    window) and whose heads have more than two query tiles (simulated on 132 SMs, a static
    stride leaves 2.5-6% of a causal launch idle at its end, a dynamic one 0.1-0.5%); shorter
    queries (decoding) keep the static stride (a few tiles per head leave little to balance).
    Not d128 past 8k queries, where the static stride measured faster (649 against 629
    TFLOP/s causal at 16k; 619 against 629 at 8k, ninth session)."""
    return (
        not problem.varlen
        and (problem.causal or problem.window is not None)
        and 2 * tile_m < problem.seqlen_q <= DYNAMIC_SEQLEN_Q_UP_TO.get(problem.head_dim, ALWAYS)
    )


def keeps_one_q_stage(head_dim: int, causal: bool, window) -> bool:
    """Whether a persistent forward keeps one Q stage where two fit: d128 without a mask
    (twelfth session, docs/PERF.md: two stages 616 / 626 against one's 686 / 691 TFLOP/s at
    4k, within 1% at 1k and 16k); masked d128 and d64 / d96 take two (d64 1k 1.02-1.03x,
    d128 causal 1k 1.02x)."""
    return head_dim == 128 and not causal and window is None


def default_eager_rescale(head_dim: int) -> bool:
    """Whether the forward rescales O at every key tile (FlashAttention-4's way) rather than
    lazily (``forward.RESCALE_THRESHOLD``: a row keeps its max while the new one is at most 2^8
    larger, and a warp whose rows all kept theirs skips the O multiply). At d64 the O multiply
    is 32 FMULs per thread and the lazy test, vote and branch cost more than they save
    (twentieth session, docs/PERF.md: 192 x 128 dense 1k / 4k / 16k +2 / +4 / +5%, causal
    +1-2.5%); from d96 on lazy wins or ties in most rows (eager d128 dense 0.5-2% slower, d192
    2-7%)."""
    return head_dim <= 64


def default_hold_descriptors(head_dim: int, kind: str = "forward") -> bool:
    """Whether a plan holds the GEMMs' shared-memory descriptors in registers
    (``warpgroup.HeldStages``; the plan option ("hold_descriptors", True)) rather than letting
    ptxas rebuild them at every key step (the persistent loop nest defeats its hoisting: d64
    forward 445 SASS instructions per key step against 417 held). Timed in one process each
    way (twenty-first session, docs/PERF.md): the d64 forward +0.7-1.9% in all six rows of
    1k / 4k / 16k x causal; d128 forward within +-1% and d256 dense 2-6% slower (the held
    descriptors take registers the wide tiles need), so the forward holds them at d64 (and the
    padded dims that run its kernel). The backward up to d128 +1% on average (d64 / d96 / d128
    long rows +1-4%, 1k rows -1-3%), the wide d192 / d256 kernels within +-1-3%: held up to
    d128."""
    return head_dim <= (64 if kind == "forward" else 128)


def default_pingpong(head_dim: int, tile_m: int) -> bool:
    """Ping-pong pays where softmax is a large share of a tile's time (head dims up to 128)."""
    return tiling.num_consumer_warpgroups(tile_m) >= 2 and head_dim <= 128


# The backward's tiles per head dim, (tile_m, tile_n, Q / dO stages), the planner's first; two
# consumer warpgroups. Head dims up to 128 (kernels/sm90/backward.py): 128 keys per CTA, 64 per
# warpgroup with their dK and dV rows in registers; d64 runs 128 queries per step
# (FlashAttention-3/4's tile: 1.04-1.13x faster than 64 on the H200), d128 keeps 64 (80, FA4's
# non-causal choice, ran 0.84-0.88x as fast here; 80 is no multiple of WGMMA's M: dQ computed
# transposed, ``FlashBackwardSm90.dq_transposed``). 192 and 256 (kernels/sm90/backward_wide.py):
# dK^T and dV^T with head_dim along WGMMA's M; d192 runs FlashAttention-4's tile, 96 keys per
# CTA with two Q stages and one dO stage (BACKWARD_DO_STAGES; 1.00-1.13x faster than one stage
# of each, which is 1.04-1.18x faster than 64 keys with two stages: twenty-first and
# twenty-second sessions), d256 64 keys with one stage (FlashAttention-4's choice: 1.10-1.20x
# faster than 48 keys with two). Timings: ``scripts/tune_sm90.py --mode bwd``, docs/PERF.md.
BACKWARD_TILES = {
    64: ((128, 128, 2), (64, 128, 2)),
    96: ((64, 128, 2),),
    128: ((64, 128, 2), (80, 128, 2)),
    192: ((64, 96, 2), (64, 96, 1), (64, 64, 2)),
    256: ((64, 64, 1), (64, 48, 2)),
}
BACKWARD_HEAD_DIMS = tuple(BACKWARD_TILES)
# Tiles whose dO keeps fewer stages than Q, (head_dim, tile_m, tile_n, Q stages): dO stages.
# d192's 64 x 96 with two Q stages and one dO stage is FlashAttention-4's d192 tile: the next
# step's Q loads while a step runs (its S GEMM comes first), dO only after the step's dV and
# dK GEMMs have read it; two stages of both do not fit (244 KB).
BACKWARD_DO_STAGES = {(192, 64, 96, 2): 1}
BACKWARD_THREADS = 384
# Wide head dims: whether the warpgroups split head_dim (else the keys) for dK / dV. dQ is
# always split by columns (WIDE_DQ_CHUNK).
WIDE_BACKWARD_SPLIT_DIM = {192: False, 256: True}
HOPPER_SMEM_PER_BLOCK = arch_from_name("sm_90a").smem_per_block
SMEM_ALIGN = 1024  # the backward's shared buffers start on 1024-byte boundaries (swizzles)
# Head dims up to 128 add dQ in the fragment order of the dQ GEMM's accumulator
# (FlashAttention-4's way): each consumer warpgroup's share of a query tile is one flat block,
# thread t's values 4i..4i+3 at floats (128 i + t) * 4: 16-byte stores without bank conflicts
# and no row padding (the postprocess, kernels/sm90/dq_postprocess.py, puts the values back in
# rows). The wide kernels (192, 256) add padded rows: 8 floats (32 bytes) per row, so that a
# warp's 64-bit accumulator stores take the minimum two wavefronts (rows start 8 banks apart).
BACKWARD_DQ_ROW_PAD = 8
# The wide kernels' dQ columns per chunk of dq_accum: each consumer warpgroup computes its
# chunks over all the tile's keys (d256 two of 64, d192 one of 96: K's swizzle atom is 32
# columns there so that the second starts on one). d192 used to split dQ by keys, each
# warpgroup adding its keys' share of all 192 columns: twice the L2 reduction traffic
# (0.46x FlashAttention-4, docs/PERF.md "twenty-first session").
WIDE_DQ_CHUNK = {192: 96, 256: 64}


def backward_dq_splits_rows(head_dim: int, tile_m: int) -> bool:
    """Whether the two consumer warpgroups split dQ's rows (d64's 128-row query tile: each its
    64 queries x every column, FlashAttention-4's d64 split): half the dQ WGMMAs of a column
    split (m64n64 instead of twice m64n32) and K keeps its full-width swizzle. Not past d64: a
    warpgroup's 64 x d128 fp32 share would leave ptxas too few registers (C7512)."""
    return head_dim <= 64 and tile_m == 2 * tiling.WARPGROUP_ROWS


def backward_dq_chunks(head_dim: int, tile_m: int = 64) -> tuple[int, int]:
    """(chunks, row_pad) of dq_accum for the sm90 backward. Up to d128 the two consumer
    warpgroups split dQ's rows in d64's 128-row query tiles (one chunk), else its columns where
    half the dim is whole 64- or 128-byte swizzle rows of K (d64, d128: a chunk each),
    otherwise warpgroup 0 alone computes every column over all keys (d96: one chunk, added
    once: ``backward_dq_single_wg``); unpadded rows (fragment order:
    ``backward_dq_fragment_order``). The wide variant adds dQ in padded chunks
    (``WIDE_DQ_CHUNK`` columns)."""
    if head_dim in WIDE_BACKWARD_SPLIT_DIM:
        return head_dim // WIDE_DQ_CHUNK[head_dim], BACKWARD_DQ_ROW_PAD
    if backward_dq_splits_rows(head_dim, tile_m):
        return 1, 0
    split = (head_dim // 2 * tiling.ELEM_BYTES) % 64 == 0
    return (2 if split else 1), 0


def backward_dq_single_wg(head_dim: int, tile_m: int) -> bool:
    """Whether consumer warpgroup 0 alone computes dQ (FlashAttention-4's ``dQ_single_wg``,
    its d96 choice): where dQ can be split neither by rows nor by columns (d96: half the dim
    is no whole swizzle row of K), one m64 x n(dim) x k(all keys) GEMM reading both
    warpgroups' dS^T, one buffer (per slot, ``backward_dq_slots``) and one bulk addition per
    step, instead of each warpgroup adding its own keys' share of the whole tile (twice the
    reduction traffic); warpgroup 1 skips the dQ GEMM and the hand-over."""
    if head_dim in WIDE_BACKWARD_SPLIT_DIM or backward_dq_splits_rows(head_dim, tile_m):
        return False
    return backward_dq_chunks(head_dim, tile_m)[0] == 1


def backward_dq_buffers(head_dim: int, tile_m: int) -> int:
    """Warpgroups that hand dQ over, each with its buffer (``backward_dq_slots`` of them) in
    the backward's shared memory: one where warpgroup 0 alone computes dQ, else two."""
    return 1 if backward_dq_single_wg(head_dim, tile_m) else 2


def backward_dq_fragment_order(head_dim: int) -> bool:
    """Whether the backward adds each warpgroup's dQ share in its accumulator's fragment order
    (every head dim but the wide kernels')."""
    return head_dim not in WIDE_BACKWARD_SPLIT_DIM


# Kernel head dims whose non-deterministic backward claims its first additions at every length:
# on the H200 (docs/PERF.md "twenty-seventh session") d64 and d256 ran as fast or faster in
# every row of issue 6's grid (seqlen 1k-16k, dense and causal; up to 9%, d64 causal 1k).
CLAIM_HEAD_DIMS = (64, 256)
# ... and those that claim up to CLAIM_MAX_KEYS keys only: d96 and d192 ran 1-7% faster with
# the claims at 1k and 4k, 1-6% slower at 16k (twenty-eighth session): the zero fill they save
# grows with seqlen_q, their per-step protocol with seqlen_q * seqlen_k. d128 lost 2-4% at 4k
# and 16k and gained nothing at 1k, whether its dQ writer or a warp of its own makes the claims
# (wip/README.md: dq-claims-early, dq-claims-warp).
SHORT_CLAIM_HEAD_DIMS = (96, 192)
CLAIM_MAX_KEYS = 4096


def claims_first_addition(
    *, deterministic: bool, varlen: bool, window, head_dim: int, seqlen_k: int | None = None
) -> bool:
    """Whether the non-deterministic backward kernel may claim each query tile's first addition
    to dq_accum (a compare-and-swap on the query tile's counter; the claimer stores its dQ,
    the others add once the store is performed), so that dq_accum needs no zero fill: 268 MB
    (~60 us) per call of 32 x 1024 tokens x 2048 features, 3-6% at d64 1k. Fixed length without
    a window only: there every query tile is reached by a key tile (causal with seqlen_q <=
    seqlen_k: ``ops.dq_accum_needs_zeros``); deterministic kernels store their first turns.
    ``head_dim``: the kernel's; ``seqlen_k``: the problem's keys, or None for whether any
    length claims (``CLAIM_HEAD_DIMS``, ``SHORT_CLAIM_HEAD_DIMS``)."""
    if deterministic or varlen or window is not None:
        return False
    if head_dim in CLAIM_HEAD_DIMS:
        return True
    return head_dim in SHORT_CLAIM_HEAD_DIMS and (seqlen_k is None or seqlen_k <= CLAIM_MAX_KEYS)


def backward_claims_first_addition(plan: KernelPlan) -> bool:
    """Whether a backward plan's kernel claims its first additions (its ``claims`` option,
    which the planner sets from ``claims_first_addition``)."""
    return plan.kind == "backward" and plan.option("claims", False) is True


def backward_dq_slots(
    head_dim: int, tile_m: int, tile_n: int, stages: int, deterministic: bool
) -> int:
    """dQ buffers per warpgroup that hands dQ over. Deterministic kernels up to d128 (dQ in
    fragment order): two where they fit Hopper's shared memory (all but d128's 80-row tile;
    d64's 128-row tile exactly), used in turn and each added by its own writer warp, so that
    a consumer writes a step's dQ while the previous step's additions are still on the L2
    round trip that must end before their turn passes (which short steps do not hide alone).
    Measured on the H200 at d128 (docs/PERF.md "nineteenth session", a process per variant),
    TFLOP/s of deterministic 64-row tiles with one buffer, two buffers and one writer, two
    buffers and two writers (the 80-row tile in the last process): s4k dense 532 / 536 / 546
    (535), causal 496 / 498 / 522 (469); s16k dense 563 / 569 / 575 (575), causal 553 / 556 /
    575 (553): so every deterministic d128 call runs 64 rows, like the others. d96, one / two
    buffers: s1k dense 383 / 417, causal 302 / 314; s4k 471 / 514, 458 / 479; s16k 495 / 528,
    504 / 526 (the non-deterministic kernel: 432-553). d64's 128-row tile: the same within
    noise (s4k dense 490 / 492), kept for one rule."""
    if not deterministic or not backward_dq_fragment_order(head_dim):
        return 1
    two_fit = backward_smem_bytes(head_dim, tile_m, tile_n, stages, 2) <= HOPPER_SMEM_PER_BLOCK
    return 2 if two_fit else 1


def backward_do_stages(head_dim: int, tile_m: int, tile_n: int, stages: int) -> int:
    """dO's stages in the backward tile (tile_m, tile_n) with ``stages`` Q stages: as many as
    Q's but where ``BACKWARD_DO_STAGES`` says fewer."""
    return BACKWARD_DO_STAGES.get((head_dim, tile_m, tile_n, stages), stages)


def backward_smem_bytes(
    head_dim: int, tile_m: int, tile_n: int, stages: int, dq_slots: int = 1,
    head_dim_v: int | None = None,
) -> int:
    """The backward kernel's shared storage, laid out as its SharedStorage is: the barriers (in
    the first 1024-byte block), then, each 1024-byte aligned, K and V (tile_n rows), the stages
    of Q and of dO (tile_m rows; ``backward_do_stages``), two bf16 tile_m x tile_n buffers (dS^T
    twice, or P and dS), a fp32 dQ buffer per consumer warpgroup that hands dQ over
    (``backward_dq_buffers``) and slot (``dq_slots``) for the bulk reductions; then lse per Q
    stage and dpsum per dO stage. V and dO have ``head_dim_v`` columns (default head_dim). The
    kernel asserts its struct's size equals this at compile time."""
    head_dim_v = head_dim_v or head_dim
    do_stages = backward_do_stages(head_dim, tile_m, tile_n, stages)
    chunks, row_pad = backward_dq_chunks(head_dim, tile_m)
    buffer_rows = tile_m // 2 if backward_dq_splits_rows(head_dim, tile_m) else tile_m
    buffers = (
        tile_n * head_dim * tiling.ELEM_BYTES,  # K
        tile_n * head_dim_v * tiling.ELEM_BYTES,  # V
        stages * tile_m * head_dim * tiling.ELEM_BYTES,  # Q
        do_stages * tile_m * head_dim_v * tiling.ELEM_BYTES,  # dO
        2 * tile_n * tile_m * tiling.ELEM_BYTES,  # P / dS
        # dQ: a buffer per warpgroup that hands dQ over and slot, each its half of the rows
        # or all.
        dq_slots * backward_dq_buffers(head_dim, tile_m) * buffer_rows
        * (head_dim // chunks + row_pad) * 4,
    )
    def align(nbytes: int) -> int:
        return -(-nbytes // SMEM_ALIGN) * SMEM_ALIGN

    # The struct's size is a whole number of its largest alignment.
    return align(
        SMEM_ALIGN + sum(align(nbytes) for nbytes in buffers) + (stages + do_stages) * tile_m * 4
    )


class Sm90Family(KernelFamily):
    name = "sm90"
    head_dims = tiling.SUPPORTED_HEAD_DIMS
    # TMA fills the missing columns with zeros and clips the O store: a padded head dim
    # costs no change in the kernel.
    pads_head_dim = True
    has_backward = True
    dim_v_pairs = ((192, 128),)  # forward, and the wide backward (d192 splits the keys)

    def supports(self, arch: ArchCaps) -> bool:
        return arch.wgmma and arch.tma

    def reject_reason(self, problem: Problem) -> str | None:
        reason = super().reject_reason(problem)
        if reason is None and problem.batch * problem.heads_q * problem.seqlen_q >= 2**31:
            reason = "more than 2^31 query rows in one launch (a 32-bit tile index)"
        return reason

    def planning_knobs(self, problem: Problem) -> tuple:
        return (softcap_exp2_poly_every(),) if problem.softcap > 0 else ()

    def plan(
        self, arch: ArchCaps, *, dtype, head_dim, causal, tile_m, tile_n, num_stages,
        persistent, pingpong=None, pack_gqa=1, features: tuple = (), dynamic=False,
        one_q_stage=False,
    ) -> KernelPlan:
        """A forward plan; ``features``: the problem's feature options (``with_features``).
        Soft-capped, it also carries ("exp2_poly", every) unless that is 0; ``dynamic``
        (persistent): ("dynamic", True), the tiles handed out from a counter; ``one_q_stage``
        (persistent): ("q_stages", 1); ("eager_rescale", True) where
        ``default_eager_rescale``, ("hold_descriptors", True) where
        ``default_hold_descriptors``."""
        if pingpong is None:
            pingpong = default_pingpong(head_dim, tile_m)
        tuning = (("dynamic", True),) if dynamic else ()
        tuning += (("q_stages", 1),) if one_q_stage else ()
        tuning += (("eager_rescale", True),) if default_eager_rescale(head_dim) else ()
        tuning += (("hold_descriptors", True),) if default_hold_descriptors(head_dim) else ()
        if dict(features).get("softcap", 0.0) > 0:
            every = softcap_exp2_poly_every()
            tuning += (("exp2_poly", every),) if every > 0 else ()
        return KernelPlan(
            family=self.name,
            arch=arch.name,
            dtype=dtype,
            head_dim=head_dim,
            causal=causal,
            tile_m=tile_m,
            tile_n=tile_n,
            num_threads=tiling.num_threads(tile_m),
            num_stages=num_stages,
            options=tuple(sorted((
                ("pack_gqa", pack_gqa),
                ("persistent", persistent),
                ("pingpong", pingpong),
                *tuning,
                *features,
            ))),
        )

    def candidates(self, problem: Problem) -> tuple[KernelPlan, ...]:
        plans = []
        head_dim = kernel_head_dim(self.head_dims, problem.head_dim)
        features = with_features((), problem)
        if head_dim != problem.head_dim:
            features = tuple(sorted(features + (("dim", problem.head_dim),)))
        tiles = SM90_TILES.get((head_dim, problem.causal), ())
        if problem.seqlen_q <= SHORT_SEQLEN_Q:
            short = SM90_SHORT_TILES.get((head_dim, problem.causal), ())
            tiles = short + tuple(tile for tile in tiles if tile not in short)
        if problem.head_dim_v != problem.head_dim:
            tiles = SM90_DIM_V_TILES.get((head_dim, problem.head_dim_v), ()) + tiles
        for tile_m, tile_n, num_stages, persistent_up_to in tiles:
            # Persistent first where it pays, single-tile as the fallback. A packed (varlen)
            # batch: not packed GQA.
            persistent_first = 0 < problem.seqlen_q <= persistent_up_to and (
                not problem.varlen or (head_dim, problem.causal) in SM90_VARLEN_PERSISTENT
            )
            pack = not problem.varlen and should_pack_gqa(
                problem.seqlen_q, problem.heads_q, problem.heads_kv, tile_m
            )
            for persistent in ((True, False) if persistent_first else (False,)):
                plans.append(
                    self.plan(
                        problem.arch, dtype=problem.dtype, head_dim=head_dim,
                        causal=problem.causal, tile_m=tile_m, tile_n=tile_n,
                        num_stages=num_stages, persistent=persistent,
                        pack_gqa=problem.heads_q // problem.heads_kv if pack else 1,
                        features=features,
                        dynamic=persistent and hands_out_tiles(problem, tile_m),
                        one_q_stage=persistent and keeps_one_q_stage(
                            head_dim, problem.causal, problem.window
                        ),
                    )
                )
        return tuple(plans)

    def backward_candidates(self, problem: Problem) -> tuple[KernelPlan, ...]:
        head_dim = kernel_head_dim(BACKWARD_HEAD_DIMS, problem.head_dim)
        if head_dim is None:
            return ()
        options = with_features((("deterministic", problem.deterministic),), problem, "backward")
        if claims_first_addition(
            deterministic=problem.deterministic, varlen=problem.varlen, window=problem.window,
            head_dim=head_dim, seqlen_k=problem.seqlen_k,
        ):
            options = tuple(sorted(options + (("claims", True),)))
        if default_hold_descriptors(head_dim, "backward"):
            options = tuple(sorted(options + (("hold_descriptors", True),)))
        if head_dim != problem.head_dim:
            # Padded as in the forward: TMA fills and clips the missing columns.
            options = tuple(sorted(options + (("dim", problem.head_dim),)))
        return tuple(
            KernelPlan(
                family=self.name, arch=problem.arch.name, dtype=problem.dtype,
                head_dim=head_dim, causal=problem.causal,
                tile_m=tile_m, tile_n=tile_n, num_threads=BACKWARD_THREADS,
                num_stages=stages, options=options, kind="backward",
            )
            for tile_m, tile_n, stages in BACKWARD_TILES[head_dim]
        )

    def representative_problems(
        self, *, dtype: str, head_dim: int, causal: bool, arch: ArchCaps
    ) -> tuple[Problem, ...]:
        """The default set (short / long, MHA / 8 query heads per KV head) and a short query
        with a group of 3, which does not divide a tile (packed rows left idle)."""
        odd_group = Problem(
            batch=1, seqlen_q=1, seqlen_k=1, heads_q=3, heads_kv=1, head_dim=head_dim,
            head_dim_v=head_dim, dtype=dtype, causal=causal, arch=arch,
        )
        base = super().representative_problems(
            dtype=dtype, head_dim=head_dim, causal=causal, arch=arch
        )
        return (*base, odd_group)

    def can_implement(self, plan: KernelPlan, arch: ArchCaps) -> bool:
        if plan.kind == "backward":
            return (
                plan.family == self.name
                and plan.arch == arch.name
                and self.supports(arch)
                and plan.dtype in DTYPES
                and plan.head_dim in BACKWARD_HEAD_DIMS
                and {name for name, _ in family_options(plan)} - {"claims"} in (
                    {"deterministic"}, {"deterministic", "hold_descriptors"},
                )
                and isinstance(plan.option("deterministic"), bool)
                and (plan.option("claims") is None or (
                    plan.option("claims") is True and claims_first_addition(
                        deterministic=plan.option("deterministic"),
                        varlen=bool(plan.option("varlen", False)), window=plan.option("window"),
                        head_dim=plan.head_dim,
                    )
                ))
                and type(plan.option("hold_descriptors")) in (type(None), bool)
                and features_well_formed(plan)
                and plan.num_threads == BACKWARD_THREADS
                and (plan.tile_m, plan.tile_n, plan.num_stages) in BACKWARD_TILES[plan.head_dim]
                and backward_smem_bytes(
                    plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages,
                    backward_dq_slots(
                        plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages,
                        plan.option("deterministic", False),
                    ),
                    plan.option("dim_v"),
                ) <= arch.smem_per_block
            )
        names = tuple(name for name, _ in family_options(plan))
        return (
            plan.family == self.name
            and plan.kind == "forward"
            and plan.arch == arch.name
            and self.supports(arch)
            and plan.dtype in DTYPES
            and tuple(
                name for name in names
                if name not in (
                    "dynamic", "q_stages", "eager_rescale", "rescale_before_pv",
                    "hold_descriptors",
                )
            ) in (
                ("pack_gqa", "persistent", "pingpong"),
                ("exp2_poly", "pack_gqa", "persistent", "pingpong"),
            )
            and (plan.option("dynamic") is None or (
                plan.option("dynamic") is True and bool(plan.option("persistent"))
                and not plan.option("varlen", False)
                and (plan.causal or plan.option("window") is not None)
            ))
            and (plan.option("q_stages") is None or (
                type(plan.option("q_stages")) is int and plan.option("q_stages") == 1
                and bool(plan.option("persistent"))
            ))
            and type(plan.option("eager_rescale")) in (type(None), bool)
            and type(plan.option("rescale_before_pv")) in (type(None), bool)
            and type(plan.option("hold_descriptors")) in (type(None), bool)
            and (plan.option("exp2_poly") is None or (
                type(plan.option("exp2_poly")) is int and plan.option("exp2_poly") > 0
            ))
            and features_well_formed(plan)
            and isinstance(plan.option("pack_gqa"), int)
            and 1 <= plan.option("pack_gqa") <= plan.tile_m
            and plan.num_threads == tiling.num_threads(plan.tile_m)
            and (not plan.option("pingpong") or tiling.num_consumer_warpgroups(plan.tile_m) >= 2)
            # Persistent kernels keep O in V's stages or Q's buffer where a buffer of its own
            # does not fit.
            and tiling.can_implement(
                plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages, separate_o=False,
                smem_capacity=arch.smem_per_block, head_dim_v=plan.option("dim_v"),
            )
            and (not plan.option("varlen") or plan.option("pack_gqa") == 1)
        )

    def uses_tile_counter(self, plan: KernelPlan) -> bool:
        return plan.kind == "forward" and bool(plan.option("dynamic", False))

    def dq_accum_chunks(self, plan: KernelPlan) -> tuple[int, int]:
        if plan.kind == "backward":
            return backward_dq_chunks(plan.head_dim, plan.tile_m)
        return super().dq_accum_chunks(plan)

    def stores_first_additions(self, plan: KernelPlan, seqlen_q: int, seqlen_k: int) -> bool:
        # Without a window every query row sees a key (seqlen_k > 0: ``ops.has_no_work``), with
        # the causal mask (bottom-right aligned) where seqlen_q <= seqlen_k.
        if plan.kind != "backward" or plan.option("window") is not None:
            return False
        if plan.option("deterministic", False):
            return not (plan.causal and seqlen_q > seqlen_k)
        if not backward_claims_first_addition(plan):
            return False
        # Claims pay where each key tile starts at a query tile of its own: key tiles that
        # start at one query tile together wait for the claimer's store (the fill costs less).
        # Causal, the key tiles wholly left of the diagonal all start at query tile 0 (and
        # seqlen_q > seqlen_k leaves rows without keys); dense, each key tile starts at its
        # share of the query tiles (``FlashBackwardSm90.step_tile``'s rotation).
        if plan.causal:
            return 0 <= seqlen_k - seqlen_q < plan.tile_n
        return -(-seqlen_q // plan.tile_m) >= -(-seqlen_k // plan.tile_n)

    def dq_counters(self, plan: KernelPlan) -> bool:
        return super().dq_counters(plan) or backward_claims_first_addition(plan)

    def dq_counters_start(self, plan: KernelPlan, accum_zeroed: bool) -> int:
        if backward_claims_first_addition(plan) and accum_zeroed:
            # Every query tile as if claimed and stored: each key tile adds, none waits.
            from cuteattn.kernels.common.turns import CLAIM_STORED

            return CLAIM_STORED
        return super().dq_counters_start(plan, accum_zeroed)

    def dq_accum_fragment_order(self, plan: KernelPlan) -> tuple | None:
        if plan.kind == "backward" and backward_dq_fragment_order(plan.head_dim):
            return self.name, plan.tile_m
        return None

    def fragment_dq_postprocess(self, layout: tuple, **shape):
        from cuteattn.kernels.sm90.dq_postprocess import FragmentDqPostprocess

        (tile_m,) = layout
        return FragmentDqPostprocess(tile_m=tile_m, **shape)

    def kernel(self, plan: KernelPlan):
        sizes = dict(self.kernel_shape(plan), num_stages=plan.num_stages)
        if plan.kind == "backward":
            if plan.head_dim in WIDE_BACKWARD_SPLIT_DIM:
                from cuteattn.kernels.sm90.backward_wide import (
                    FlashBackwardSm90Wide as FlashBackwardSm90,
                )
            else:
                from cuteattn.kernels.sm90.backward import FlashBackwardSm90

            return FlashBackwardSm90(
                **sizes, deterministic=plan.option("deterministic"),
                hold_descriptors=bool(plan.option("hold_descriptors", False)),
                claims=backward_claims_first_addition(plan),
            )
        from cuteattn.kernels.sm90.forward import FlashForwardSm90

        return FlashForwardSm90(
            **sizes,
            pingpong=plan.option("pingpong"),
            exp2_poly_every=plan.option("exp2_poly", 0),
            eager_rescale=bool(plan.option("eager_rescale", False)),
            rescale_before_pv=plan.option("rescale_before_pv"),
            hold_descriptors=bool(plan.option("hold_descriptors", False)),
            persistent=plan.option("persistent"),
            dynamic=self.uses_tile_counter(plan),
            separate_o=tiling.separate_o_fits(
                plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages,
                arch_from_name(plan.arch).smem_per_block, plan.option("dim_v"),
            ),
            o_in_v=tiling.o_in_v_fits(plan.tile_m, plan.tile_n, plan.num_stages),
            q_stages=plan.option("q_stages") or tiling.separate_o_q_stages(
                plan.head_dim, plan.tile_m, plan.tile_n, plan.num_stages,
                arch_from_name(plan.arch).smem_per_block, plan.option("dim_v"),
            ),
            pack_gqa=plan.option("pack_gqa"),
            sink=plan.option("sink", False),
        )

    def plan_mismatch(self, plan: KernelPlan, problem: Problem) -> str | None:
        mismatch = super().plan_mismatch(plan, problem)
        if mismatch is not None:
            return mismatch
        group = plan.option("pack_gqa", 1)
        if group > 1 and problem.heads_q != group * problem.heads_kv:
            return (
                f"pack_gqa {group} (the inputs have {problem.heads_q} query heads for "
                f"{problem.heads_kv} KV heads)"
            )
        return None


FAMILY = Sm90Family()
