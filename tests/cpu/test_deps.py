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


def test_a_capped_requirement_gives_its_floor_in_either_clause_order():
    """pyproject writes '>=4.8.1,<4.9'; installed metadata writes '<4.9,>=4.8.1'."""
    for requirement in (
        "nvidia-cutlass-dsl>=4.8.1,<4.9",
        "nvidia-cutlass-dsl<4.9,>=4.8.1",
        "nvidia-cutlass-dsl >= 4.8.1 , < 4.9",
        "nvidia-cutlass-dsl (<4.9,>=4.8.1)",
    ):
        assert deps.requirement_floor(requirement) == ("nvidia-cutlass-dsl", "4.8.1"), requirement
    assert deps.requirement_floor("apache-tvm-ffi<0.2,>=0.1.15") == ("apache-tvm-ffi", "0.1.15")
    assert deps.requirement_floor("Apache_TVM.FFI~=0.1.15") == ("apache-tvm-ffi", "0.1.15")
    assert deps.requirement_floor("torch==2.13.0") == ("torch", "2.13.0")
    assert deps.requirement_floor("torch==2.*") == ("torch", None)
    assert deps.requirement_floor("apache-tvm-ffi<0.2") == ("apache-tvm-ffi", None)
    assert deps.requirement_floor("pytest") == ("pytest", None)


def test_extras_are_parsed_and_extra_only_requirements_do_not_gate_compiling(monkeypatch):
    assert deps.requirement_floor("nvidia-cutlass-dsl[cu13]<4.9,>=4.8.1") == (
        "nvidia-cutlass-dsl", "4.8.1")
    assert deps.requirement_floor("nvidia-cutlass-dsl [cu13, qnx] >=4.8.1,<4.9") == (
        "nvidia-cutlass-dsl", "4.8.1")
    assert deps.requirement_floor('nvidia-cutlass-dsl[cu13]<4.9,>=4.8.1; extra == "cu13"') == (
        "nvidia-cutlass-dsl", "4.8.1")
    # What importlib.metadata.requires returns for an install with the extras declared.
    metadata_requires = [
        "torch>=2.4",
        "nvidia-cutlass-dsl<4.9,>=4.8.1",
        "apache-tvm-ffi<0.2,>=0.1.15",
        'nvidia-cutlass-dsl<4.9,>=4.8.1; extra == "cu12"',
        'nvidia-cutlass-dsl[cu13]<4.9,>=4.9.0; extra == "cu13"',
        'pytest>=8; extra == "test"',
    ]
    monkeypatch.setattr(deps, "_declared_requirements", lambda: metadata_requires)
    assert deps.declared_floors() == {
        "torch": "2.4", "nvidia-cutlass-dsl": "4.8.1", "apache-tvm-ffi": "0.1.15",
    }


def test_cuda_extras_repeat_the_base_dsl_requirement():
    """`pip install cuteattn[cu12]` / `[cu13]` must not loosen or shift the DSL floor and cap."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]
    base = [r for r in project["dependencies"] if r.startswith("nvidia-cutlass-dsl")]
    assert len(base) == 1 and base[0].startswith("nvidia-cutlass-dsl>=")  # no CUDA extra forced
    extras = project["optional-dependencies"]
    assert extras["cu12"] == base
    assert extras["cu13"] == [base[0].replace("nvidia-cutlass-dsl", "nvidia-cutlass-dsl[cu13]")]
    # The DSL and tvm-ffi are capped below their next minor (pyproject says why).
    tvm_ffi = [r for r in project["dependencies"] if r.startswith("apache-tvm-ffi")]
    assert all("<" in r for r in base + tvm_ffi) and len(tvm_ffi) == 1


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
