import hashlib
import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """A script of scripts/ (``name``.py) imported as a module, for tests of its plain parts."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
