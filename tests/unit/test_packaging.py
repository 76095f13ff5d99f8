"""The wheel ships the product packages only (issue 35): the package list setuptools finds with
pyproject.toml's own `include` holds every product package and nothing of the lab tooling
(`bench/`: benchmarks, their task families and 3.9 MB of results; `scripts/`; `tests/`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]
PRODUCT = {"sandboxes", "tasks", "envserver", "trainer", "integrations", "sandgym_cli"}
LAB = {"bench", "scripts", "tests", "images", "docs"}


def shipped() -> set[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return set(find_packages(where=str(REPO), include=include))


def test_the_wheel_ships_every_product_package_and_no_lab_tooling() -> None:
    packages = shipped()
    tops = {p.partition(".")[0] for p in packages}
    assert PRODUCT <= tops, f"expected {sorted(PRODUCT)} in the wheel, found {sorted(tops)}"
    assert not tops & LAB, f"lab tooling in the wheel: {sorted(tops & LAB)}"
    assert "sandboxes.docker" in packages and "trainer.engines" in packages
