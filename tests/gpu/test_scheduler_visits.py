"""Tile schedulers on the GPU: every work tile is handed out exactly once, whatever the grid and,
for the linear scheduler, whatever the section size (residual last sections included)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

SCHEDULES = [
    pytest.param("SingleTileScheduler", False, id="single"),
    pytest.param("LinearTileScheduler", False, id="linear"),
    pytest.param("LinearTileScheduler", True, id="linear-persistent"),
]


# (9, 5, 3): 15 pairs, so sections of 2 and 4 leave a residual one, and 64 is one short section;
# (33, 16, 2): 32 pairs, 2 and 4 divide them, 64 is one short section.
@pytest.mark.parametrize("scheduler_name,persistent", SCHEDULES)
@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches", [(1, 1, 1), (9, 5, 3), (33, 16, 2)])
@pytest.mark.parametrize("max_ctas", (1, 7, 132, 100000))
@pytest.mark.parametrize("heads_per_section", (1, 2, 4, 64))
def test_every_tile_once(
    scheduler_name, persistent, longest_first, m_blocks, heads, batches, max_ctas,
    heads_per_section,
):
    from scheduler_probe import compile_visit_counter

    from cuteattn.kernels.common import tile_scheduler
    from cuteattn.runtime.arch import device_arch

    if not persistent and max_ctas != 132:
        pytest.skip("a single-tile grid does not depend on max_ctas")
    if scheduler_name == "SingleTileScheduler" and heads_per_section != 1:
        pytest.skip("SingleTileScheduler has no sections")
    scheduler_cls = getattr(tile_scheduler, scheduler_name)
    arch = device_arch(torch.device("cuda")).name
    fn = _compiled(scheduler_cls, persistent, longest_first, arch, compile_visit_counter)
    visits = torch.zeros(m_blocks, heads, batches, dtype=torch.int32, device="cuda")
    fn(visits, max_ctas, heads_per_section)
    torch.cuda.synchronize()
    assert torch.all(visits == 1), f"visit counts {visits.unique(return_counts=True)}"


_cache = {}


def _compiled(scheduler_cls, persistent, longest_first, arch, compile_visit_counter):
    key = (scheduler_cls, persistent, longest_first, arch)
    if key not in _cache:
        _cache[key] = compile_visit_counter(
            scheduler_cls, persistent=persistent, longest_first=longest_first, arch=arch
        )
    return _cache[key]
