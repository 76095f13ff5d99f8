"""A corpus of real Dockerfile environment patterns (tests/fixtures/tasks/dockerfile-env: `ENV
PATH` extended with `${PATH}` and `$PATH`, `ENV A=$B`, ARG-derived ENV, `${V:-d}` / `${V:+a}`, a
JAVA_HOME-style chain, a virtualenv first on PATH, USER and WORKDIR changes) run as a user runs
them, `sandgym tasks check --backend B --json`: the oracle scores 1 and a no-op 0, each.

On docker the built image's own configuration is the truth; before issue 58 every one of these
but user-workdir errored there ("rm: not found": the parser had made PATH `/opt/tools/bin:`). On
local (which builds no image) the parser expands the variables from the base image's known
environment; venv-first and user-workdir need their RUN lines (skipped on local) and are
checked on docker only. A base image sandgym does not know is refused on local by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes import BackendUnavailableError, get_backend
from tests.docker_engine import engine_answers

CORPUS = Path(__file__).parents[1] / "fixtures" / "tasks" / "dockerfile-env"
#: the fixtures whose check means something without RUN lines
LOCAL = ["path-braces", "path-plain-chain", "java-home-chain"]
#: every fixture: the docker backend builds the image (RUN lines included)
DOCKER = [*LOCAL, "venv-first", "user-workdir", "multi-stage-workdir"]


def _check(paths: list[Path], backend: str, tmp_path: Path) -> list[dict[str, Any]]:
    """`sandgym tasks check PATH... --backend B --json`, its one JSON document's task rows."""
    env = {**os.environ, "SANDGYM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "sandgym.cli", "tasks", "check", *map(str, paths)]
        + ["--backend", backend, "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.stdout.strip(), f"expected one JSON document on stdout, found none: {proc.stderr}"
    rows: list[dict[str, Any]] = json.loads(proc.stdout)["tasks"]
    return rows


def _scores(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, Any, Any]]:
    return {r["task_id"]: (r["oracle_reward"], r["noop_reward"], r["error"]) for r in rows}


def test_corpus_on_local_oracle_1_noop_0(tmp_path: Path) -> None:
    try:
        get_backend("local")
    except BackendUnavailableError as exc:
        pytest.skip(f"local backend unavailable: {exc}")
    rows = _check([CORPUS / name for name in LOCAL], "local", tmp_path)
    assert [r["task_id"] for r in rows] == LOCAL
    assert _scores(rows) == {name: (1.0, 0.0, None) for name in LOCAL}


def test_unknown_base_variable_is_refused_by_name_on_local(tmp_path: Path) -> None:
    """A `$PATH` of a base image sandgym knows nothing of: refused, naming the variable, the
    line and the image; never an environment with PATH cut to the task's own directory."""
    try:
        get_backend("local")
    except BackendUnavailableError as exc:
        pytest.skip(f"local backend unavailable: {exc}")
    task = tmp_path / "unknown-base"
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    for name in ("task.toml", "instruction.md", "tests/test.sh", "solution/solve.sh"):
        (task / name).write_bytes((CORPUS / "path-braces" / name).read_bytes())
    (task / "environment" / "Dockerfile").write_text(
        "FROM example.org/toolchains/rust:1.80\nWORKDIR /app\n"
        'ENV PATH="/usr/local/cargo/bin:${PATH}"\n'
    )
    [row] = _check([task], "local", tmp_path)
    assert row["oracle_reward"] is None and row["noop_reward"] is None
    assert "TaskUnsupportedError" in row["error"], row["error"]
    assert "Dockerfile line 3: ENV uses $PATH" in row["error"], row["error"]
    assert "'example.org/toolchains/rust:1.80'" in row["error"], row["error"]


@pytest.mark.docker
def test_corpus_on_docker_oracle_1_noop_0(tmp_path: Path) -> None:
    if not engine_answers():
        pytest.skip("no Docker engine answers")
    import docker

    try:
        docker.from_env().images.get("python:3.13-slim")
    except docker.errors.ImageNotFound:
        pytest.skip("python:3.13-slim missing (`sandgym images build` makes its stand-in)")
    rows = _check([CORPUS / name for name in DOCKER], "docker", tmp_path)
    assert [r["task_id"] for r in rows] == DOCKER
    assert _scores(rows) == {name: (1.0, 0.0, None) for name in DOCKER}
