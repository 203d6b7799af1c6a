"""Tile schedulers on the GPU: every work tile is handed out exactly once, whatever the grid."""

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("persistent", (False, True))
@pytest.mark.parametrize("longest_first", (False, True))
@pytest.mark.parametrize("m_blocks,heads,batches", [(1, 1, 1), (9, 5, 3), (33, 16, 2)])
@pytest.mark.parametrize("max_ctas", (1, 7, 132, 100000))
def test_every_tile_once(persistent, longest_first, m_blocks, heads, batches, max_ctas):
    from scheduler_probe import compile_visit_counter

    from cuteattn.kernels.common.tile_scheduler import (
        PersistentTileScheduler,
        SingleTileScheduler,
    )
    from cuteattn.runtime.arch import device_arch

    if not persistent and max_ctas != 132:
        pytest.skip("the single-tile grid does not depend on max_ctas")
    scheduler_cls = PersistentTileScheduler if persistent else SingleTileScheduler
    arch = device_arch(torch.device("cuda")).name
    fn = _compiled(scheduler_cls, longest_first, arch, compile_visit_counter)
    visits = torch.zeros(m_blocks, heads, batches, dtype=torch.int32, device="cuda")
    fn(visits, max_ctas)
    torch.cuda.synchronize()
    assert torch.all(visits == 1), f"visit counts {visits.unique(return_counts=True)}"


_cache = {}


def _compiled(scheduler_cls, longest_first, arch, compile_visit_counter):
    key = (scheduler_cls, longest_first, arch)
    if key not in _cache:
        _cache[key] = compile_visit_counter(scheduler_cls, longest_first=longest_first, arch=arch)
    return _cache[key]
