"""Fixes found by running real public Harbor tasks (bench/harbor_compat.py): `${VAR}` templates
in the env tables are resolved from the host, schema 1.1's `[task]` table loads, and a
multi-step task is refused with a message that says so."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from sandboxes import ExecResult, SandboxSpec
from sandboxes.null import NullBackend, NullSandbox
from tasks import (
    TaskLoadError,
    TaskUnsupportedError,
    load_task_dir,
    prepare_episode,
    run_oracle,
    run_verifier,
    sandbox_spec_for,
)
from tasks.runtime import resolve_env_templates

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks" / "harbor-compat"


class RecordingSandbox(NullSandbox):
    """Null sandbox recording the env each script runs with; the verifier writes reward 1."""

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec, NullBackend())
        self.envs: dict[str, dict[str, str]] = {}

    async def exec(self, cmd, timeout_s=60.0, cwd=None, env=None, user=None) -> ExecResult:  # type: ignore[no-untyped-def, override]
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        if command.startswith("rm -rf /tests /logs/verifier"):
            return ExecResult(exit_code=0)
        if command.startswith(("bash /tests/", "bash /solution/")):
            self.envs[command.split()[1]] = dict(env or {})
            if command.startswith("bash /tests/"):
                self.files["/logs/verifier/reward.txt"] = b"1\n"
            return ExecResult(exit_code=0)
        return await super().exec(cmd, timeout_s, cwd, env, user)


def test_templates_resolve_from_host_with_defaults() -> None:
    env = {"KEY": "${API_KEY}", "LEVEL": "${LEVEL:-strict}", "MIX": "a-${NAME:-x}-b", "N": "1"}
    host = {"API_KEY": "k123", "NAME": "n"}
    assert resolve_env_templates(env, "environment.env", host) == {
        "KEY": "k123",
        "LEVEL": "strict",
        "MIX": "a-n-b",
        "N": "1",
    }
    with pytest.raises(TaskUnsupportedError, match=r"environment.env.KEY .*API_KEY.*unset"):
        resolve_env_templates({"KEY": "${API_KEY}"}, "environment.env", {})


def test_schema_1_1_task_table_loads() -> None:
    task = load_task_dir(FIXTURES / "harbor-env-template")
    assert task.id == "harbor-env-template"
    assert task.metadata["harbor_name"] == "sandgym-fixtures/env-template"
    assert task.metadata["schema_version"] == "1.1"
    # the loader keeps the template; it is resolved when a sandbox is made
    assert task.environment.env["SANDGYM_FIXTURE_API_KEY"] == "${SANDGYM_FIXTURE_API_KEY}"


def test_sandbox_never_sees_a_literal_template(monkeypatch: pytest.MonkeyPatch) -> None:
    task = load_task_dir(FIXTURES / "harbor-env-template")
    monkeypatch.delenv("SANDGYM_FIXTURE_API_KEY", raising=False)
    with pytest.raises(TaskUnsupportedError, match="SANDGYM_FIXTURE_API_KEY"):
        sandbox_spec_for(task)
    monkeypatch.setenv("SANDGYM_FIXTURE_API_KEY", "sk-test")
    spec = sandbox_spec_for(task)
    assert spec.env["SANDGYM_FIXTURE_API_KEY"] == "sk-test"
    assert spec.env["PLAIN"] == "literal"
    assert not any("${" in v for v in spec.env.values())


async def test_verifier_and_oracle_env_are_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDGYM_FIXTURE_API_KEY", "sk-test")
    monkeypatch.delenv("SANDGYM_FIXTURE_LEVEL", raising=False)
    monkeypatch.setenv("SANDGYM_FIXTURE_NAME", "sandgym")
    task = load_task_dir(FIXTURES / "harbor-env-template")
    sb = RecordingSandbox(sandbox_spec_for(task))
    setup = await prepare_episode(task, sb, seed=0)
    await run_oracle(task, sb, setup)
    result = await run_verifier(task, sb, setup)
    assert result.reward == 1.0
    envs: dict[str, Any] = sb.envs
    assert envs["/solution/solve.sh"]["GREETING"] == "hello sandgym"
    assert envs["/tests/test.sh"]["CHECK_LEVEL"] == "strict"  # the default, host var unset


def test_multi_step_task_is_refused_by_name() -> None:
    with pytest.raises(TaskLoadError, match="multi-step Harbor task"):
        load_task_dir(FIXTURES / "harbor-multistep")


def test_tasks_check_reports_an_unset_template_per_task(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from envserver.cli import main

    monkeypatch.delenv("SANDGYM_FIXTURE_API_KEY", raising=False)
    code = main(
        ["tasks", "check", str(FIXTURES / "harbor-env-template"), "--backend", "null", "--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    [entry] = doc["tasks"]
    assert entry["oracle_reward"] is None and entry["noop_reward"] is None
    assert "SANDGYM_FIXTURE_API_KEY" in entry["error"]
