"""`sandgym tasks prepare` on docker: every task's image built once, ahead of any episode, and
reused after (keyed by content, like the pool); a task that cannot build or load is reported
with its reason and the rest go on; a sandbox created afterwards builds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import docker_image_available

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="sandgym/terminal not built"),
]

REPO = Path(__file__).resolve().parents[2]


def _task(root: Path, name: str, run: str) -> None:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "environment" / "Dockerfile").write_text(f"FROM sandgym/terminal:latest\nRUN {run}\n")
    (d / "instruction.md").write_text("x\n")
    (d / "task.toml").write_text('version = "1.0"\n')
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")


def _prepare(root: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "sandgym.cli", "tasks", "prepare", str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    return json.loads(out.stdout)


async def test_prepare_builds_once_then_reuses(tmp_path: Path) -> None:
    token = uuid.uuid4().hex  # a content hash no earlier run has built
    _task(tmp_path, "a", f"echo {token} > /a")
    _task(tmp_path, "b", f"echo {token} > /b")
    _task(tmp_path, "broken", "exit 3")
    (tmp_path / "unloadable").mkdir()
    (tmp_path / "unloadable" / "task.toml").write_text("not = [valid\n")
    first = _prepare(tmp_path)
    by_id = {e["task_id"]: e for e in first["tasks"]}
    assert by_id["a"]["status"] == by_id["b"]["status"] == "built"
    assert by_id["broken"]["status"] == "failed" and "exit" in by_id["broken"]["error"].lower()
    assert by_id["unloadable"]["status"] == "failed" and "TOML" in by_id["unloadable"]["error"]
    assert first["summary"] == {"tasks": 4, "built": 2, "reused": 0, "none": 0, "failed": 2}
    second = _prepare(tmp_path)
    assert second["summary"]["reused"] == 2 and second["summary"]["built"] == 0

    # an episode's sandbox afterwards: the image is there, nothing is built in its creation
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.tasks.loaders import load_task_dir
    from sandgym.tasks.sandbox_spec import sandbox_spec_for

    backend = DockerBackend(owner_id="test-prep-" + os.urandom(4).hex())
    try:
        sb = await backend.create(sandbox_spec_for(load_task_dir(tmp_path / "a")))
        try:
            assert (await sb.exec("cat /a")).stdout.strip() == token
        finally:
            await sb.close()
        assert backend.builds == 0
    finally:
        await backend.aclose()
