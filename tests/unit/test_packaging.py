"""The wheel ships one import package, `sandgym` (issues 35, 57): the package list setuptools finds
with pyproject.toml's own `include` holds every part of sandgym and nothing of the lab tooling
(`lab/bench/`: benchmarks, their task families and 3.9 MB of results; `scripts/`; `tests/`)."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest
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


# -- install metadata (issue 57): a light plain install, ranges only ---------------------------

#: what the plain install (a trainer's environment) must not take: the server's, the backends'
#: and the lab's dependencies
NOT_IN_BASE = {
    "fastapi", "uvicorn", "pexpect", "pyte", "prometheus-client", "psutil", "docker", "pillow",
    "pydantic-settings", "tqdm", "pyyaml",
}  # fmt: skip


def _project() -> dict:  # type: ignore[type-arg]
    return dict(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"])


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_plain_install_is_the_client_only() -> None:
    base = {_name(r) for r in _project()["dependencies"]}
    assert base == {"pydantic", "websockets", "httpx", "gymnasium", "numpy"}, sorted(base)
    assert not base & NOT_IN_BASE, sorted(base & NOT_IN_BASE)
    server = {_name(r) for r in _project()["optional-dependencies"]["server"]}
    for needed in ("fastapi", "uvicorn", "pexpect", "pyte", "prometheus-client"):
        assert needed in server, f"expected {needed} in the server extra: {sorted(server)}"


def test_every_door_and_backend_has_its_extra() -> None:
    extras = set(_project()["optional-dependencies"])
    wanted = {"server", "docker", "e2b", "train", "openenv", "trl", "skyrl", "verl", "nemo-gym"}
    assert wanted <= extras, f"missing extras: {sorted(wanted - extras)}"


def test_no_cap_or_exact_pin_without_a_recorded_reason() -> None:
    """A `==`, `<`, `<=` or `~=` in the install metadata needs a comment beside it (on its line
    or the two above) saying what was measured; the tested versions go in constraints/."""
    project = _project()
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    capped = [r for r in reqs if re.search(r"==|<|~=", r.split(";")[0])]
    lines = (REPO / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    bare = []
    for req in capped:
        (i,) = [n for n, line in enumerate(lines) if f'"{req}"' in line]
        if not any("#" in line for line in lines[max(0, i - 2) : i + 1]):
            bare.append(req)
    assert not bare, f"caps or exact pins with no recorded reason beside them: {bare}"


# -- the `sandgym` command in a client-only install --------------------------------------------


def test_a_command_whose_extra_is_missing_names_it_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sandgym serve` where the server's dependencies are absent (its module imports lazily,
    so the missing module shows when it runs): one line naming the extra, exit 3."""
    cli = importlib.import_module("sandgym.cli.main")  # the module (sandgym.cli re-exports main)

    def missing() -> tuple[type[Exception], ...]:
        raise ModuleNotFoundError("No module named 'prometheus_client'", name="prometheus_client")

    monkeypatch.setattr(cli, "user_errors", missing)
    assert cli.main(["serve"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "sandgym serve: not in this install (no module named 'prometheus_client'): "
        "pip install 'sandgym[server]'"
    ], err


def test_a_subcommand_module_that_cannot_import_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = importlib.import_module("sandgym.cli.main")  # the module (sandgym.cli re-exports main)

    real = importlib.import_module

    def fake(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        if name in ("sandgym.tasks.cli", "sandgym.trainer.cli"):
            raise ModuleNotFoundError("No module named 'yaml'", name="yaml")
        return real(name, package)

    monkeypatch.setattr(cli.importlib, "import_module", fake)
    assert cli.main(["tasks", "list"]) == 3
    assert cli.main(["train", "x.yaml"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "sandgym tasks: not in this install (no module named 'yaml'): pip install 'sandgym[server]'",
        "sandgym train: not in this install (no module named 'yaml'): pip install 'sandgym[train]'",
    ], err


def test_a_missing_module_of_our_own_is_a_bug_not_an_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cli = importlib.import_module("sandgym.cli.main")  # the module (sandgym.cli re-exports main)

    def broken() -> tuple[type[Exception], ...]:
        raise ModuleNotFoundError("No module named 'sandgym.nope'", name="sandgym.nope")

    monkeypatch.setattr(cli, "user_errors", broken)
    with pytest.raises(ModuleNotFoundError, match="sandgym.nope"):
        cli.main(["serve"])
