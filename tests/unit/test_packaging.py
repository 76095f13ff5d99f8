"""The wheel ships one import package, `sandgym` (issues 35, 57): the package list setuptools finds
with pyproject.toml's own `include` holds every part of sandgym and nothing of the lab tooling
(`lab/bench/`: benchmarks, their task families and 3.9 MB of results; `scripts/`; `tests/`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]
PARTS = {"wire", "client", "sandboxes", "tasks", "server", "trainer", "integrations", "cli"}
LAB = {"lab", "scripts", "tests", "images", "docs"}


def shipped() -> set[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return set(find_packages(where=str(REPO), include=include))


def test_the_wheel_ships_every_product_package_and_no_lab_tooling() -> None:
    packages = shipped()
    tops = {p.partition(".")[0] for p in packages}
    assert tops == {"sandgym"}, f"expected one top-level package, sandgym; found {sorted(tops)}"
    parts = {p.split(".")[1] for p in packages if p.count(".") >= 1}
    assert PARTS <= parts, f"expected {sorted(PARTS)} under sandgym, found {sorted(parts)}"
    assert not tops & LAB, f"lab tooling in the wheel: {sorted(tops & LAB)}"
    assert "sandgym.sandboxes.docker" in packages and "sandgym.trainer.engines" in packages
