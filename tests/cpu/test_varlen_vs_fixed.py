"""CPU test of scripts/varlen_vs_fixed.py's rows: the same 32k tokens as a fixed-length batch,
a packed one of whole tiles, one with a partial last tile per sequence and the bench's mix."""

from conftest import load_script


def test_rows_hold_the_same_tokens_per_dim_and_causal_mode():
    script = load_script("varlen_vs_fixed")
    shapes = script.comparison_shapes([64, 128], (False, True))
    assert len(shapes) == 2 * 2 * 4
    fixed, whole, partial, mixed = shapes[:4]
    assert (fixed.batch, fixed.seqlen, fixed.heads, fixed.causal) == (8, 4096, 32, False)
    assert whole.lengths == (4096,) * 8
    assert partial.lengths == (4000,) * 7 + (4768,)
    assert len(mixed.lengths) > 8 and max(mixed.lengths) == mixed.seqlen
    for shape in shapes[1:4]:
        assert sum(shape.lengths) == 32768 and shape.seqlen == max(shape.lengths)
    assert {(s.dim, s.heads, s.causal) for s in shapes} == {
        (64, 32, False), (64, 32, True), (128, 16, False), (128, 16, True)
    }
