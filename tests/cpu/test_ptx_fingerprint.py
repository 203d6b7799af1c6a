"""CPU tests of scripts/ptx_fingerprint.py: its case syntax, and one backward kernel's PTX
fingerprint (a compile: the compile marker)."""

import pytest

from conftest import load_script


@pytest.fixture(scope="module")
def fingerprint():
    return load_script("ptx_fingerprint")


def test_cases_parse(fingerprint):
    assert fingerprint.parse_case("128:causal:1024") == (128, True, 1024, False, 4, 4)
    assert fingerprint.parse_case("96:dense:16384:det") == (96, False, 16384, True, 4, 4)
    assert fingerprint.parse_case("128:causal:8192:gqa32x4") == (128, True, 8192, False, 32, 4)
    assert fingerprint.parse_case("64:dense:1024:det:gqa8x1") == (64, False, 1024, True, 8, 1)
    for bad in (
        "128:causal", "128:masked:1024", "128:dense:1024:fast", "128:dense:1024:det:x",
        "128:dense:1024:gqa32", "128:dense:1024:gqa4x2:gqa8x2", "x:dense:1024",
    ):
        with pytest.raises(ValueError, match="dim:causal"):
            fingerprint.parse_case(bad)


@pytest.mark.compile
def test_fingerprint_of_one_backward_kernel(tmp_path):
    """In a process of its own (the DSL reads its dump settings on import)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("cutlass")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", PYTHONPATH=str(root / "src"))
    run = subprocess.run(
        [sys.executable, str(root / "scripts" / "ptx_fingerprint.py"), "--out", str(tmp_path),
         "--cases", "64:causal:1024"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    line = run.stdout.strip().splitlines()[-1]
    assert line.startswith("d64-causal-1024: ") and " md5 " in line, line
    assert (tmp_path / "d64-causal-1024.ptx").read_text().lstrip().startswith("//")
