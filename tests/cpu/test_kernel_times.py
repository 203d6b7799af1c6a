"""CPU tests of scripts/kernel_times.py's plain-Python parts: the per-kernel aggregation of the
profiler's events and its table; --help without a GPU."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kernel_times.py"


@pytest.fixture(scope="module")
def script():
    return load_script("kernel_times")


def event(name, micros, device=torch.autograd.DeviceType.CUDA):
    return SimpleNamespace(
        name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: micros)
    )


def test_kernel_times_are_per_call_and_longest_first(script):
    events = [
        event("memset", 10.0), event("main", 300.0), event("memset", 14.0),
        event("main", 310.0), event("aten::mul", 99.0, torch.autograd.DeviceType.CPU),
    ]
    assert script.kernel_times(events, calls=2) == [("main", 1.0, 305.0), ("memset", 1.0, 12.0)]


def test_format_names_the_call_and_each_kernel(script):
    text = script.format_kernel_times([("main", 1.0, 305.0), ("x" * 200, 2.0, 12.0)], 0.4)
    lines = text.splitlines()
    assert lines[0] == "  call     400.0 us (CUDA events); kernels     317.0 us"
    assert lines[1] == "      305.0 us   1.0x  main"
    assert lines[2].endswith("x" * (script.NAME_WIDTH - 3) + "...") and "2.0x" in lines[2]


def test_help_runs_without_a_gpu():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0 and "--varlen" in proc.stdout, proc.stderr
