"""`sandgym tasks check` ends a phase as the episode rule says (sandgym/tasks/check.py): a lost
sandbox is an error with no reward, never 0.0 (a no-op "scored 0" would read as passed); an
oracle past the task's agent timeout (the agent's own failure) is scored by the verifier."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes.null import NullBackend, NullSandbox
from sandgym.tasks import load_task_dir
from sandgym.tasks.check import check_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


class DyingBackend(NullBackend):
    """Every sandbox it makes is dead by the time the check uses it (its engine lost it)."""

    async def create(self, spec: Any) -> NullSandbox:
        sb = await super().create(spec)
        sb.kill()
        return sb


async def test_a_lost_sandbox_is_an_error_without_a_reward() -> None:
    task = load_task_dir(FIXTURES / "harbor-legacy")
    check = await check_task(task, DyingBackend(), {}, 0)
    assert check.oracle is not None and check.noop is not None
    phases = [(p.phase, p.outcome, p.reward) for p in (check.oracle, check.noop)]
    assert phases == [("oracle", "error", None), ("noop", "error", None)]
    assert [e.error_type for e in check.phase_errors] == ["SandboxLostError"] * 2
    assert check.to_entry()["noop_reward"] is None and not check.ok


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
async def test_an_oracle_past_its_time_limit_is_scored_by_the_verifier(tmp_path: Path) -> None:
    from sandgym.sandboxes.local import LocalBackend

    task_dir = tmp_path / "slow-oracle"
    shutil.copytree(FIXTURES / "harbor-legacy", task_dir)
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 240.0", "timeout_sec = 1.0"))
    (task_dir / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 30\n")
    task = load_task_dir(task_dir)
    assert task.timeouts.agent_timeout_s == 1.0
    check = await check_task(task, LocalBackend(root=tmp_path / "local"), {}, 0)
    assert check.oracle is not None
    assert (check.oracle.error, check.oracle.solution_ran) == (None, True)
    assert check.oracle.solution_exit_code is None  # killed at its limit
    assert (check.oracle.outcome, check.oracle.reward) == ("wrong_reward", 0.0)
