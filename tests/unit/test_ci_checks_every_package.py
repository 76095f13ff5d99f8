"""The lint and type-check steps of `scripts/test.sh` (what CI runs) cover every Python package of
the repository, and pyproject.toml's `[tool.mypy] packages` (a bare `mypy`) names the same ones:
a package added later, or one dropped from a command, is caught here rather than left unchecked."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def packages() -> set[str]:
    """The repository's top-level Python packages (folders with an `__init__.py`)."""
    return {p.parent.name for p in REPO.glob("*/__init__.py")}


def command_args(tool: str) -> set[str]:
    """The arguments of the one line of scripts/test.sh that runs `.venv/bin/<tool>`."""
    lines = [
        shlex.split(line)
        for line in (REPO / "scripts" / "test.sh").read_text(encoding="utf-8").splitlines()
        if line.startswith(f".venv/bin/{tool} ")
    ]
    assert len(lines) == 1, (
        f"expected one `.venv/bin/{tool}` line in scripts/test.sh, found {lines}"
    )
    return set(lines[0][1:])


def test_the_repository_has_the_packages_design_names() -> None:
    found = packages()
    assert {"sandgym", "lab"} <= found, found


def test_ruff_checks_every_package_and_the_tests() -> None:
    missing = (packages() | {"tests"}) - command_args("ruff")
    assert not missing, f"scripts/test.sh's ruff line leaves out {sorted(missing)}"


def test_mypy_checks_every_package() -> None:
    missing = packages() - command_args("mypy")
    assert not missing, f"scripts/test.sh's mypy line leaves out {sorted(missing)}"


def test_bare_mypy_checks_what_ci_checks() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert set(config["tool"]["mypy"]["packages"]) == command_args("mypy")
