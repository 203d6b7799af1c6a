"""How much of a launch's time its order of work tiles leaves idle at the end, in plain Python.

A work tile's duration is the number of tiles it visits on the other side (a forward query
tile: key tiles up to its diagonal when causal; a backward key tile: query tiles from its
diagonal) plus a fixed overhead of one; the model ignores everything else (memory, L2). Three
ways to place the tiles on ``--sms`` SMs: a static stride (CTA c takes tiles c, c + SMs, ...:
the persistent ``LinearTileScheduler``), dynamic (each tile to the SM that frees first: the
hardware's dispatch of a one-tile-per-CTA grid, or ``DynamicTileScheduler``), and the ideal
(total / SMs). Prints makespan / ideal per order; e.g. 1.04 = 4% of the launch idle.

    python scripts/simulate_tails.py --mode fwd --dims 64,128 --seqlens 1024,4096,16384
    python scripts/simulate_tails.py --mode bwd --varlen --causal both

Packed batches (``--varlen``) also in the order ``VarlenTileScheduler``'s
``sequences_longest_first`` takes: the sequences by tile count, most first.
"""

import argparse
import heapq
import math


def static_makespan(durations, sms: int) -> float:
    loads = [0.0] * sms
    for index, duration in enumerate(durations):
        loads[index % sms] += duration
    return max(loads)


def dynamic_makespan(durations, sms: int) -> float:
    free_at = [0.0] * sms
    for duration in durations:
        heapq.heappush(free_at, heapq.heappop(free_at) + duration)
    return max(free_at)


def section_order(pairs: int, section: int, ranks: int):
    """(rank, pair) in ``decode_linear_tile``'s order: sections of pairs, rank by rank."""
    for first in range(0, pairs, section):
        for rank in range(ranks):
            for pair in range(first, min(first + section, pairs)):
                yield rank, pair


def longest_first(lengths, tile: int) -> list:
    """The sequences by tile count, most first, ties in their given order
    (``varlen_tile_order(..., sequences_longest_first=True)``)."""
    return sorted(lengths, key=lambda length: -math.ceil(length / tile))


def forward_tiles(lengths, heads, tile_m, tile_n, causal, heads_fastest=True, section=None):
    """Durations of the forward's query tiles: a packed batch's sequences one after another
    (heads fastest within each, or each head's tiles together), longest first when causal;
    a fixed-length batch (one length) in L2 sections of ``section`` pairs."""
    def duration(m, length):
        keys = min((m + 1) * tile_m, length) if causal else length
        return math.ceil(keys / tile_n) + 1.0

    if section is not None:
        length, = set(lengths)
        ranks = math.ceil(length / tile_m)
        return [
            duration(ranks - 1 - rank if causal else rank, length)
            for rank, _ in section_order(len(lengths) * heads, section, ranks)
        ]
    out = []
    for length in lengths:
        blocks = list(range(math.ceil(length / tile_m)))[::-1 if causal else 1]
        order = (
            [m for m in blocks for _ in range(heads)] if heads_fastest
            else [m for _ in range(heads) for m in blocks]
        )
        out += [duration(m, length) for m in order]
    return out


def backward_tiles(
    lengths, heads, tile_m, tile_n, causal, heads_fastest=True, section=None, group=1
):
    """Durations of the backward's key tiles (key tile 0, which sees the most queries, first);
    orders as ``forward_tiles``; ``heads`` the KV heads, each key tile visiting the query tiles
    of ``group`` query heads."""
    def duration(n, length):
        first_query = (n * tile_n) // tile_m if causal else 0
        return group * (math.ceil(length / tile_m) - first_query) + 1.0

    if section is not None:
        length, = set(lengths)
        ranks = math.ceil(length / tile_n)
        return [duration(rank, length) for rank, _ in section_order(len(lengths) * heads, section, ranks)]
    out = []
    for length in lengths:
        blocks = range(math.ceil(length / tile_n))
        order = (
            [n for n in blocks for _ in range(heads)] if heads_fastest
            else [n for _ in range(heads) for n in blocks]
        )
        out += [duration(n, length) for n in order]
    return out


def l2_section(mode: str, dim: int, seqlen: int, pairs: int) -> int:
    """``make_linear_tile_counts``'s section: the largest power of two of pairs whose streamed
    rows fit 32 MB (forward: K and V; backward: Q, dO, the dq accumulator, lse and dpsum), at
    most the pairs there are."""
    per_row = 4 * dim if mode == "fwd" else 4 * dim + 4 * dim + 8
    fit = max(1, (32 << 20) // (seqlen * per_row))
    return min(1 << (fit.bit_length() - 1), pairs)


def tail_section(ranks: int, group: int, pairs: int) -> int:
    """``make_tail_section_counts``' section: GQA (``group`` > 1), the fewest pairs (a power of
    two) whose key tiles reach 128; MHA one pair (the grid order); at most the pairs there are."""
    section = 1
    while group > 1 and ranks * section < 128:
        section *= 2
    return min(section, pairs)


def planner_tiles(mode: str, dim: int, seqlen: int) -> tuple[int, int]:
    """(tile_m, tile_n) the sm90 planner takes for causal attention."""
    if mode == "fwd":
        if dim == 64:
            return (128, 128) if seqlen <= 2048 else (192, 128)
        return {128: (128, 128), 256: (128, 64)}[dim]
    return {64: (128, 128), 128: (64, 128), 256: (64, 64)}[dim]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("fwd", "bwd"), default="fwd")
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--varlen", action="store_true",
                        help="the benchmark's packed batch (cuteattn.bench's varlen_lengths)")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--causal", choices=("true", "false", "both"), default="true")
    parser.add_argument("--heads-kv", type=int, default=0,
                        help="backward, fixed length: KV heads (GQA / MQA; default: as many "
                             "as query heads); adds the order of ``make_tail_section_counts``")
    parser.add_argument("--section", type=int, default=0,
                        help="fixed length: (batch, head) pairs per L2 section (default: as "
                             "the kernels size it, ``l2_section``)")
    args = parser.parse_args(argv)
    tiles_of = forward_tiles if args.mode == "fwd" else backward_tiles
    causal_modes = {"true": (True,), "false": (False,), "both": (True, False)}[args.causal]
    rows = []
    for dim in (int(d) for d in args.dims.split(",")):
        heads = max(1, args.hidden // dim)
        if args.varlen:
            from cuteattn.bench.runner import varlen_lengths

            shapes = [("varlen", list(varlen_lengths(args.tokens)))]
        else:
            shapes = [
                (seqlen, [seqlen] * max(1, args.tokens // seqlen))
                for seqlen in (int(s) for s in args.seqlens.split(","))
            ]
        for name, lengths in shapes:
            tile_m, tile_n = planner_tiles(args.mode, dim, max(lengths))
            pairs = len(lengths) * (args.heads_kv or heads if args.mode == "bwd" else heads)
            section = args.section or l2_section(args.mode, dim, max(lengths), pairs)
            # The sequences' tile: query tiles in the forward, key tiles in the backward.
            sorted_lengths = longest_first(lengths, tile_m if args.mode == "fwd" else tile_n)
            orders = (
                {
                    "heads-last": (lengths, dict(heads_fastest=False)),
                    "heads-fastest": (lengths, {}),
                    "longest first, heads-last": (sorted_lengths, dict(heads_fastest=False)),
                    "longest first, heads-fastest": (sorted_lengths, {}),
                }
                if args.varlen
                else {
                    "pair by pair": (lengths, dict(section=1)),
                    f"sections of {section}": (lengths, dict(section=section)),
                }
            )
            heads_kv = heads
            if args.heads_kv and args.mode == "bwd" and not args.varlen:
                heads_kv = args.heads_kv
                group = heads // heads_kv
                tail = tail_section(math.ceil(max(lengths) / tile_n), group, len(lengths) * heads_kv)
                orders = {
                    order: (ordered, options | dict(group=group))
                    for order, (ordered, options) in orders.items()
                }
                orders[f"tail sections of {tail}"] = (lengths, dict(section=tail, group=group))
            for causal in causal_modes:
                for order, (ordered, options) in orders.items():
                    durations = tiles_of(ordered, heads_kv, tile_m, tile_n, causal, **options)
                    ideal = sum(durations) / args.sms
                    rows.append(
                        f"{args.mode} d{dim} {name} {'causal' if causal else 'dense'} {order}: "
                        f"static {static_makespan(durations, args.sms) / ideal:.4f}, dynamic "
                        f"{dynamic_makespan(durations, args.sms) / ideal:.4f}"
                    )
    print("\n".join(rows))
    return rows


if __name__ == "__main__":
    main()
