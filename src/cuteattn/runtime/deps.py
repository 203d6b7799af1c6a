"""Checks installed dependencies against the floors declared in cuteattn's own metadata.

The floors live once, in pyproject.toml. An installed package reads them from its metadata; a
source checkout run through PYTHONPATH (as on the GPU machine) reads pyproject.toml directly.
"""

import importlib.metadata as metadata
import re
from pathlib import Path

# Packages whose version changes what the kernels compile to.
CHECKED = ("nvidia-cutlass-dsl", "apache-tvm-ffi", "torch")

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.\-+]*)")


def _version_key(version: str) -> tuple[int, ...]:
    """Leading numeric release parts ('2.11.0+cu130' -> (2, 11, 0))."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def _declared_requirements() -> list[str]:
    try:
        return list(metadata.requires("cuteattn") or [])
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    if not pyproject.is_file():
        return []
    import tomllib

    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def declared_floors() -> dict[str, str]:
    floors = {}
    for requirement in _declared_requirements():
        if ";" in requirement:  # extras-only requirements (e.g. test) don't gate compiling
            continue
        match = _REQUIREMENT.match(requirement)
        if match:
            floors[match.group(1).lower()] = match.group(3)
    return floors


def find_too_old(floors: dict[str, str], installed: dict[str, str | None]) -> list[str]:
    """One message per package below its floor (missing packages count as too old)."""
    problems = []
    for name, floor in floors.items():
        if name not in CHECKED:
            continue
        have = installed.get(name)
        if have is None:
            problems.append(f"{name} is not installed; run: pip install '{name}>={floor}'")
        elif _version_key(have) < _version_key(floor):
            problems.append(
                f"{name} {have} is older than the required {floor}; "
                f"run: pip install --upgrade '{name}>={floor}'"
            )
    return problems


def installed_versions(names) -> dict[str, str | None]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def check_dependencies() -> None:
    floors = declared_floors()
    problems = find_too_old(floors, installed_versions(floors))
    if problems:
        raise ImportError("cuteattn: " + "; ".join(problems))
