import hashlib

import pytest
import torch


@pytest.fixture(autouse=True)
def seed_from_test_id(request):
    """Each test draws fresh inputs, reproducible from its id."""
    digest = hashlib.sha256(request.node.nodeid.encode()).digest()
    torch.manual_seed(int.from_bytes(digest[:8], "little"))


@pytest.fixture
def fresh_dynamo():
    """torch.compile state reset before and after the test (use with usefixtures)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
