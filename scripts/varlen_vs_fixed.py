"""One process, same GPU state: the sm90 backward on a fixed-length batch against the same work as
a packed (varlen) batch, and the bench's mixed batch, cuteattn and FA4 side by side. Isolates
what the varlen path itself costs (decode, per-sequence zeroing, row-store epilogue, pre / post
grids) from the mixed batch's work distribution (tails, partial tiles).

    source .devdeps/prelude.sh && python scripts/varlen_vs_fixed.py --dims 64,128 --causal both

Rows per (dim, causal): fixed 8 x 4096; varlen 8 x 4096 (whole tiles: no partial query / key
tile, no zeroing taken); varlen 7 x 4000 + 4768 (a partial last tile per sequence); the
bench's 17 sequences (varlen_lengths(32768)). TFLOP/s use each row's own useful FLOPs.
"""
import argparse
import sys

import torch

from cuteattn.bench.backends import backward_binder, load_backend
from cuteattn.bench.runner import (
    BACKWARD_FLOPS_FACTOR, Shape, format_table, run_benchmark, varlen_lengths,
)


def comparison_shapes(dims, causal_modes, hidden: int = 2048) -> list[Shape]:
    """Per (dim, causal): fixed 8 x 4096, then the packed batches 8 x 4096, 7 x 4000 + 4768
    and the bench's 17 sequences (32k tokens each), heads = hidden // dim."""
    shapes = []
    for dim in dims:
        heads = hidden // dim
        for causal in causal_modes:
            shapes.append(Shape(dim=dim, seqlen=4096, causal=causal, batch=8, heads=heads))
            for lengths in (
                varlen_lengths(32768, shortest=4096, longest=4096),
                varlen_lengths(32768, shortest=4000, longest=4000),
                varlen_lengths(32768),
            ):
                shapes.append(Shape(dim=dim, seqlen=max(lengths), causal=causal,
                                    batch=len(lengths), heads=heads, lengths=tuple(lengths)))
    return shapes


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--causal", choices=("true", "false", "both"), default="both")
    parser.add_argument("--backends", default="cuteattn,fa4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=2048)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    causal_modes = {"true": (True,), "false": (False,), "both": (False, True)}[args.causal]
    shapes = comparison_shapes([int(d) for d in args.dims.split(",")], causal_modes, args.hidden)
    binders = {}
    for name in args.backends.split(","):
        try:
            binders[name] = backward_binder(load_backend(name))
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: not loaded: {exc}", file=sys.stderr)
    results = run_benchmark(shapes, binders, dtype=torch.bfloat16, rounds=args.rounds,
                            iters=args.iters, flops_factor=BACKWARD_FLOPS_FACTOR)
    print(format_table(results, list(binders), "bwd"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
