"""Dependency floors: read from our own metadata, too-old packages named with a fix, checked at
the first compile rather than at import."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuteattn.plan import KernelPlan, family_names
from cuteattn.runtime import deps

SRC = Path(__file__).resolve().parents[2] / "src"


def test_floors_come_from_project_metadata():
    floors = deps.declared_floors()
    assert floors["nvidia-cutlass-dsl"] == "4.8.1"
    assert "apache-tvm-ffi" in floors and "torch" in floors


def test_too_old_and_missing_packages_are_named_with_the_upgrade_command():
    floors = {"nvidia-cutlass-dsl": "4.8.1", "torch": "2.4", "apache-tvm-ffi": "0.1.15"}
    installed = {"nvidia-cutlass-dsl": "4.7.0", "torch": "2.11.0+cu130", "apache-tvm-ffi": None}
    problems = deps.find_too_old(floors, installed)
    assert len(problems) == 2
    assert "nvidia-cutlass-dsl 4.7.0 is older than the required 4.8.1" in problems[0]
    assert "pip install --upgrade 'nvidia-cutlass-dsl>=4.8.1'" in problems[0]
    assert "apache-tvm-ffi is not installed" in problems[1]


def test_versions_compare_numerically():
    assert deps.find_too_old({"torch": "2.4"}, {"torch": "2.10.0"}) == []
    assert deps.find_too_old({"nvidia-cutlass-dsl": "4.8.1"}, {"nvidia-cutlass-dsl": "4.8.1"}) == []
    assert deps.find_too_old({"nvidia-cutlass-dsl": "4.8.1"}, {"nvidia-cutlass-dsl": "4.8.0"})


def test_this_environment_passes():
    deps.check_dependencies()


def test_package_imports_without_the_dsl():
    """The DSL is needed to compile, not to import: the reference, the planner and the benchmark
    CLI work where the CuTe DSL is missing (import of cutlass blocked in a fresh interpreter)."""
    code = "\n".join([
        "import sys",
        "sys.modules['cutlass'] = None",
        "import cuteattn, cuteattn.reference, cuteattn.plan, cuteattn.bench",
        "from cuteattn.arch import arch_from_name",
        "from cuteattn.plan import Problem, plan_forward",
        "plan = plan_forward(Problem(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1,",
        "    head_dim=128, head_dim_v=128, dtype='bf16', causal=True, arch=arch_from_name('sm_90a')))",
        "assert 'cutlass' not in sys.modules or sys.modules['cutlass'] is None",
        "print(plan.family)",
    ])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in family_names()


def test_dependencies_are_checked_before_the_first_compile(monkeypatch):
    """A too-old dependency fails the first compile with the upgrade command, not the import."""
    from cuteattn.runtime import compile as runtime_compile

    def too_old():
        raise ImportError("cuteattn: nvidia-cutlass-dsl 4.7.0 is older than the required 4.8.1")

    monkeypatch.setattr(runtime_compile, "check_dependencies", too_old)
    runtime_compile._check_dependencies_once.cache_clear()
    plan = KernelPlan(
        family="sm80", arch="sm_90a", dtype="bf16", head_dim=128, causal=False, tile_m=128,
        tile_n=64, num_threads=128,
    )
    monkeypatch.setattr(runtime_compile, "_compiled", {})
    try:
        with pytest.raises(ImportError, match=r"older than the required 4.8.1"):
            runtime_compile.compile_forward(plan)
    finally:
        runtime_compile._check_dependencies_once.cache_clear()
