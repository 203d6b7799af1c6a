"""Dependency floors: read from our own metadata, and too-old packages named with a fix."""

from cuteattn.runtime import deps


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
