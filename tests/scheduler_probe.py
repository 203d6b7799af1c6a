"""Probe kernels for tile schedulers, compiled on the CPU (tests/cpu) and run on the GPU
(tests/gpu): each work tile a CTA gets adds 1 to visits[m_block, head, batch]
(``compile_visit_counter``); the varlen scheduler's CTAs write the work tile they decode
(``compile_varlen_decoder``), and so do the linear scheduler's single-tile CTAs
(``compile_linear_decoder``: its in-kernel decode against ``decode_linear_tile``); the dynamic
scheduler's producer and consumer warps each count the tiles they walk
(``compile_dynamic_visit_counter``)."""

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.runtime import make_fake_tensor

from cuteattn.kernels.common.tile_scheduler import (
    DynamicTileScheduler,
    LinearTileCounts,
    LinearTileScheduler,
    SingleTileScheduler,
    TileCounts,
    VarlenTileScheduler,
    make_varlen_tile_counts,
)

TILE_M = 64


def compile_visit_counter(
    scheduler_cls, *, persistent: bool, longest_first: bool, arch="sm_90a", dump_dir=None
):
    """fn(visits, max_ctas, heads_per_section): visits is an int32 (m_blocks, heads, batches)
    tensor, zeroed. heads_per_section sizes the linear scheduler's sections (a power of two, as
    ``make_linear_tile_counts`` makes it: the divisors assume one; the single-tile scheduler
    ignores it)."""
    linear = scheduler_cls is LinearTileScheduler
    if not linear and scheduler_cls is not SingleTileScheduler:
        raise ValueError(f"no probe for {scheduler_cls.__name__}")
    counts_type = LinearTileCounts if linear else TileCounts

    class VisitCounter:
        @cute.jit
        def __call__(
            self, visits: cute.Tensor, max_ctas: Int32, heads_per_section: Int32, stream
        ):
            if cutlass.const_expr(linear):
                counts = LinearTileCounts(
                    num_m_blocks=visits.shape[0], num_heads=visits.shape[1],
                    num_batches=visits.shape[2], heads_per_section=heads_per_section,
                ).with_divisors()
            else:
                counts = TileCounts.create(
                    seqlen_q=visits.shape[0] * TILE_M, tile_m=TILE_M, num_heads=visits.shape[1],
                    num_batches=visits.shape[2],
                )
            grid = scheduler_cls.grid_shape(counts, persistent=persistent, max_ctas=max_ctas)
            self.kernel(visits, counts).launch(grid=grid, block=[32, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, visits: cute.Tensor, counts: counts_type):
            tidx, _, _ = cute.arch.thread_idx()
            scheduler = scheduler_cls.create(
                counts, longest_first=longest_first, persistent=persistent
            )
            work = scheduler.initial_work_tile()
            while work.is_valid:
                if tidx == 0:
                    offset = cute.crd2idx((work.m_block, work.head, work.batch), visits.layout)
                    cute.arch.atomic_add((visits.iterator + offset).llvm_ptr, Int32(1))
                work = scheduler.advance()

    visits = make_fake_tensor(
        Int32, (cute.sym_int(), cute.sym_int(), cute.sym_int()),
        (cute.sym_int64(), cute.sym_int64(), 1),
    )
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if dump_dir is not None:
        options += f" --keep-ptx --dump-dir {dump_dir}"
    return cute.compile(VisitCounter(), visits, Int32(1), Int32(1), stream, options=options)


def compile_linear_decoder(*, longest_first: bool, arch="sm_90a"):
    """fn(tiles, m_blocks, heads, batches, heads_per_section): tiles an int32 (m_blocks * heads *
    batches, 3) tensor; CTA i of the single-tile ``LinearTileScheduler`` writes (m_block, head,
    batch) of work index i to row i, decoded with the counts' divisors (the kernels' way;
    heads_per_section a power of two)."""

    class LinearDecoder:
        @cute.jit
        def __call__(
            self, tiles: cute.Tensor, m_blocks: Int32, heads: Int32, batches: Int32,
            heads_per_section: Int32, stream,
        ):
            counts = LinearTileCounts(
                num_m_blocks=m_blocks, num_heads=heads, num_batches=batches,
                heads_per_section=heads_per_section,
            ).with_divisors()
            grid = LinearTileScheduler.grid_shape(counts)
            self.kernel(tiles, counts).launch(grid=grid, block=[32, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, tiles: cute.Tensor, counts: LinearTileCounts):
            tidx, _, _ = cute.arch.thread_idx()
            cta, _, _ = cute.arch.block_idx()
            scheduler = LinearTileScheduler.create(counts, longest_first=longest_first)
            work = scheduler.initial_work_tile()
            if tidx == 0:
                tiles[cta, 0] = work.m_block
                tiles[cta, 1] = work.head
                tiles[cta, 2] = work.batch

    tiles = make_fake_tensor(Int32, (cute.sym_int(), 3), (3, 1))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(
        LinearDecoder(), tiles, Int32(1), Int32(1), Int32(1), Int32(1), stream,
        options=f"--enable-tvm-ffi --gpu-arch {arch}",
    )


def compile_varlen_decoder(
    *, tile: int, longest_first: bool, persistent: bool = False, heads_fastest: bool = False,
    sequences_longest_first: bool = False, arch="sm_90a", dump_dir=None,
):
    """fn(cu_seqlens, total_rows, max_length, num_heads, max_ctas, tiles): cu_seqlens int32
    (batches + 1,); tiles an int32 (bound, 4) tensor, bound = the single-tile grid's x for these
    counts. Single tile: CTA i writes (m_block, head, batch, is_valid) of its work tile to row i.
    Persistent (grid min(max_ctas, bound)): each CTA writes each work tile it visits to the row
    of its work index (CTA c's k-th visit: c + k * grid), valid ones only. ``heads_fastest``,
    ``sequences_longest_first``: ``VarlenTileScheduler``'s (persistent: heads fastest always)."""

    class VarlenDecoder:
        @cute.jit
        def __call__(
            self, cu_seqlens: cute.Tensor, total_rows: Int32, max_length: Int32,
            num_heads: Int32, max_ctas: Int32, tiles: cute.Tensor, stream,
        ):
            counts = make_varlen_tile_counts(
                total_rows=total_rows, max_length=max_length, tile=tile, num_heads=num_heads,
                num_batches=cu_seqlens.shape[0] - 1,
            )
            grid = VarlenTileScheduler.grid_shape(
                counts, persistent=persistent, max_ctas=max_ctas
            )
            self.kernel(cu_seqlens, tiles, counts).launch(grid=grid, block=[32, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, cu_seqlens: cute.Tensor, tiles: cute.Tensor, counts):
            tidx, _, _ = cute.arch.thread_idx()
            cta, _, _ = cute.arch.block_idx()
            scheduler = VarlenTileScheduler.create(
                counts, cu_seqlens, tile=tile, longest_first=longest_first,
                persistent=persistent, heads_fastest=heads_fastest,
                sequences_longest_first=sequences_longest_first,
            )
            work = scheduler.initial_work_tile()
            if cutlass.const_expr(persistent):
                row = Int32(cta)
                while work.is_valid:
                    if tidx == 0:
                        tiles[row, 0] = work.m_block
                        tiles[row, 1] = work.head
                        tiles[row, 2] = work.batch
                        tiles[row, 3] = Int32(work.is_valid)
                    row = row + Int32(cute.arch.grid_dim()[0])
                    work = scheduler.advance()
            else:
                if tidx == 0:
                    tiles[cta, 0] = work.m_block
                    tiles[cta, 1] = work.head
                    tiles[cta, 2] = work.batch
                    tiles[cta, 3] = Int32(work.is_valid)

    cu_seqlens = make_fake_tensor(Int32, (cute.sym_int(),), (1,))
    tiles = make_fake_tensor(Int32, (cute.sym_int(), 4), (4, 1))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if dump_dir is not None:
        options += f" --keep-ptx --dump-dir {dump_dir}"
    return cute.compile(
        VarlenDecoder(), cu_seqlens, Int32(1), Int32(1), Int32(1), Int32(1), tiles, stream,
        options=options,
    )


def compile_dynamic_visit_counter(*, longest_first: bool, arch="sm_90a", dump_dir=None):
    """fn(visits, max_ctas, heads_per_section, counter): visits an int32 (2, m_blocks, heads,
    batches) tensor, zeroed; counter a zeroed (1,) int32. Each CTA has a producer warp (it draws
    the tickets and passes the indices on) and a consumer warp; warp w adds 1 to
    visits[w, m_block, head, batch] for each work tile it walks (``DynamicTileScheduler`` as the
    sm90 forward uses it, its named barriers 8 and 9)."""

    class DynamicVisitCounter:
        @cute.jit
        def __call__(
            self, visits: cute.Tensor, max_ctas: Int32, heads_per_section: Int32,
            counter: cute.Tensor, stream,
        ):
            counts = LinearTileCounts(
                num_m_blocks=visits.shape[1], num_heads=visits.shape[2],
                num_batches=visits.shape[3], heads_per_section=heads_per_section,
            ).with_divisors()
            grid = DynamicTileScheduler.grid_shape(counts, max_ctas=max_ctas)
            self.kernel(visits, counts, counter).launch(grid=grid, block=[64, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, visits: cute.Tensor, counts: LinearTileCounts, counter: cute.Tensor):
            tidx, _, _ = cute.arch.thread_idx()
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

            @cute.struct
            class Storage:
                slot: cute.struct.MemRange[Int32, 1]

            storage = cutlass.memory.SmemAllocator().allocate(Storage)
            slot = storage.slot.get_tensor(cute.make_layout(1))
            if warp == 0:
                self.walk(visits, counts, counter, slot, 0, True, tidx)
            else:
                self.walk(visits, counts, counter, slot, 1, False, tidx)

        @cute.jit
        def walk(
            self, visits, counts, counter, slot, row: cutlass.Constexpr[int],
            producer: cutlass.Constexpr[bool], tidx,
        ):
            scheduler = DynamicTileScheduler.create(
                counts, longest_first=longest_first, counter=counter, slot=slot,
                producer=producer, consumer_threads=32, full_id=8, empty_id=9,
            )
            if cutlass.const_expr(not producer):
                scheduler.consumer_start()
            work = scheduler.initial_work_tile()
            while work.is_valid:
                if cutlass.const_expr(producer):
                    scheduler.prefetch_next()
                if tidx % 32 == 0:
                    offset = cute.crd2idx(
                        (row, work.m_block, work.head, work.batch), visits.layout
                    )
                    cute.arch.atomic_add((visits.iterator + offset).llvm_ptr, Int32(1))
                work = scheduler.advance()

    visits = make_fake_tensor(
        Int32, (2, cute.sym_int(), cute.sym_int(), cute.sym_int()),
        (cute.sym_int64(), cute.sym_int64(), cute.sym_int64(), 1),
    )
    counter = make_fake_tensor(Int32, (1,), (1,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if dump_dir is not None:
        options += f" --keep-ptx --dump-dir {dump_dir}"
    return cute.compile(
        DynamicVisitCounter(), visits, Int32(1), Int32(1), counter, stream, options=options
    )
