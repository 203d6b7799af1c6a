"""Tile schedulers: the persistent order is a bijection with the promised locality and causal
order (checked on Python ints), and both schedulers compile in a kernel loop for sm_90a."""

import itertools

import cutlass
import cutlass.cute as cute
import pytest
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_tensor

from cuteattn.kernels.common.tile_scheduler import (
    PersistentTileScheduler,
    SingleTileScheduler,
    TileCounts,
    decode_tile_index,
)


@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches", [(1, 1, 1), (5, 3, 2), (4, 8, 1), (7, 1, 3)])
def test_decode_is_a_bijection_in_the_promised_order(m_blocks, heads, batches, longest_first):
    counts = TileCounts(num_m_blocks=m_blocks, num_heads=heads, num_batches=batches)
    order = [
        decode_tile_index(i, counts, longest_first=longest_first)
        for i in range(m_blocks * heads * batches)
    ]
    everything = set(itertools.product(range(m_blocks), range(heads), range(batches)))
    assert set(order) == everything and len(order) == len(everything)
    if longest_first:
        # Query tiles from the last (longest under causal) down; within one, heads of a batch
        # adjacent.
        assert [m for m, _, _ in order] == sorted((m for m, _, _ in order), reverse=True)
        first_row = order[: heads * batches]
        assert first_row == [(m_blocks - 1, h, b) for b in range(batches) for h in range(heads)]
    else:
        # All query tiles of one (batch, head) run back to back: they share its K and V.
        assert order[:m_blocks] == [(m, 0, 0) for m in range(m_blocks)]
        assert [(h, b) for _, h, b in order] == sorted(
            ((h, b) for _, h, b in order), key=lambda hb: (hb[1], hb[0])
        )


def compile_scheduler_loop(scheduler_cls, *, longest_first, persistent, dump_dir):
    """A kernel that writes 1 into out[m_block, head, batch] for every work tile it gets."""

    class Kernel:
        @cute.jit
        def __call__(self, out: cute.Tensor, max_ctas: Int32, stream):
            counts = TileCounts.create(
                seqlen_q=out.shape[0] * 64, tile_m=64, num_heads=out.shape[1],
                num_batches=out.shape[2],
            )
            if cutlass.const_expr(persistent):
                grid = scheduler_cls.grid_shape(counts, max_ctas=max_ctas)
            else:
                grid = scheduler_cls.grid_shape(counts)
            self.kernel(out, counts).launch(grid=grid, block=[32, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, out: cute.Tensor, counts: TileCounts):
            scheduler = scheduler_cls.create(counts, longest_first=longest_first)
            work = scheduler.initial_work_tile()
            while work.is_valid:
                out[work.m_block, work.head, work.batch] = Float32(1.0)
                work = scheduler.advance()

    out = make_fake_tensor(
        Float32, (cute.sym_int(), cute.sym_int(), cute.sym_int()),
        (cute.sym_int64(), cute.sym_int64(), 1),
    )
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(
        Kernel(), out, Int32(132), stream,
        options=f"--enable-tvm-ffi --gpu-arch sm_90a --keep-ptx --dump-dir {dump_dir}",
    )


@pytest.mark.parametrize("longest_first", (False, True))
def test_schedulers_compile_in_the_kernel_loop(longest_first, tmp_path):
    single = compile_scheduler_loop(
        SingleTileScheduler, longest_first=longest_first, persistent=False, dump_dir=tmp_path
    )
    persistent = compile_scheduler_loop(
        PersistentTileScheduler, longest_first=longest_first, persistent=True, dump_dir=tmp_path
    )
    # The single-tile loop folds into straight-line code (no branch at all); the persistent
    # one keeps its loop.
    assert "bra" not in single.__ptx__.split(".entry", 1)[1]
    assert "bra" in persistent.__ptx__.split(".entry", 1)[1]
