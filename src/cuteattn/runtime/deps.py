"""Checks installed dependencies against the floors declared in cuteattn's own metadata.

The floors live once, in pyproject.toml. An installed package reads them from its metadata; a
source checkout run through PYTHONPATH (as on the GPU machine) reads pyproject.toml directly.
"""

import importlib.metadata as metadata
import re
from pathlib import Path

# Packages whose version changes what the kernels compile to.
CHECKED = ("nvidia-cutlass-dsl", "apache-tvm-ffi", "torch")

# A requirement's name and optional extras; its version clauses follow, comma-separated, in any
# order (metadata writes "<4.9,>=4.8.1" for pyproject's ">=4.8.1,<4.9"), optionally in parentheses.
_NAME_AND_EXTRAS = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*(?:\[[^\]]*\])?\s*")
# Clauses that set a floor: >=X, ~=X (compatible release, at least X) and ==X without a wildcard.
_FLOOR_CLAUSE = re.compile(r"(>=|~=|===?)\s*([0-9][0-9A-Za-z.\-+!]*)")


def _normalize(name: str) -> str:
    """PEP 503 name ('Apache_TVM.FFI' -> 'apache-tvm-ffi')."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_floor(requirement: str) -> tuple[str, str | None] | None:
    """(normalized name, floor or None) of one requirement string; None if it has no name.

    Extras and upper bounds are allowed: 'nvidia-cutlass-dsl[cu13]<4.9,>=4.8.1' ->
    ('nvidia-cutlass-dsl', '4.8.1'). Environment markers (after ';') are ignored here.
    """
    requirement = requirement.split(";", 1)[0]
    match = _NAME_AND_EXTRAS.match(requirement)
    if not match:
        return None
    specifiers = requirement[match.end():].strip()
    if specifiers.startswith("(") and specifiers.endswith(")"):
        specifiers = specifiers[1:-1]
    floor = None
    for clause in specifiers.split(","):
        found = _FLOOR_CLAUSE.fullmatch(clause.strip())
        if found and (floor is None or _version_key(found.group(2)) > _version_key(floor)):
            floor = found.group(2)
    return _normalize(match.group(1)), floor


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
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: no floors from a source checkout
        return []

    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def declared_floors() -> dict[str, str]:
    floors = {}
    for requirement in _declared_requirements():
        # Requirements behind a marker (the extras: cu12, cu13, test) don't gate compiling; the
        # CUDA extras repeat the base requirement's specifiers.
        if ";" in requirement:
            continue
        parsed = requirement_floor(requirement)
        if parsed and parsed[1]:
            floors[parsed[0]] = parsed[1]
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
