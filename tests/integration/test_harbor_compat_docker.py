"""Public-Harbor-task features on the real Docker engine: a task whose Dockerfile uses
heredocs builds with the classic builder (no BuildKit here) and passes `tasks check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.tasks import load_task_dir
from tests.docker_engine import engine_answers

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks" / "harbor-compat"


async def test_heredoc_task_oracle_and_noop_on_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not engine_answers():
        pytest.skip("no Docker engine answers")
    import docker

    if not docker.from_env().images.list(name="sandgym/base"):
        pytest.skip("sandgym/base:bookworm missing (images/bootstrap-base.sh builds it)")
    from sandgym.tasks.cli import check_tasks

    monkeypatch.setenv("SANDGYM_CACHE", str(tmp_path))
    task = load_task_dir(FIXTURES / "harbor-heredoc")
    [check] = await check_tasks(
        [task], "docker", {"ubuntu:24.04": "sandgym/base:bookworm"}, concurrency=1
    )
    assert check.error is None
    assert check.oracle_reward == 1.0 and check.noop_reward == 0.0
