"""Fixes found by running real public Harbor tasks (lab/bench/harbor_compat.py): `${VAR}` templates
in the env tables are resolved from the host, schema 1.1's `[task]` table loads, and a
multi-step task is refused with a message that says so."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes import ExecResult, SandboxSpec
from sandgym.sandboxes.null import NullBackend, NullSandbox
from sandgym.tasks import (
    TaskUnsupportedError,
    load_task_dir,
    prepare_episode,
    run_oracle,
    run_verifier,
    sandbox_spec_for,
)
from sandgym.tasks.sandbox_spec import resolve_env_templates

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


def test_multi_step_task_loads_its_steps() -> None:
    task = load_task_dir(FIXTURES / "harbor-multistep")
    assert [s.name for s in task.steps] == ["01-write", "02-append"]
    assert task.multi_step_reward == "final"
    assert task.steps[0].verifier_timeout_s == 30.0 and task.steps[1].agent_timeout_s == 60.0
    assert all(s.solution is not None and s.tests_overlay is not None for s in task.steps)


def test_tasks_check_reports_an_unset_template_per_task(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sandgym.cli import main

    monkeypatch.delenv("SANDGYM_FIXTURE_API_KEY", raising=False)
    code = main(
        ["tasks", "check", str(FIXTURES / "harbor-env-template"), "--backend", "null", "--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    [entry] = doc["tasks"]
    assert entry["oracle_reward"] is None and entry["noop_reward"] is None
    assert "SANDGYM_FIXTURE_API_KEY" in entry["error"]


def test_heredocs_rewritten_for_the_classic_builder(tmp_path: Path) -> None:
    from sandgym.tasks.dockerfile.heredoc import has_heredoc, rewrite_heredocs

    plain = "FROM x\nRUN echo hi > /a\n"
    assert rewrite_heredocs(plain) == plain
    root = tmp_path / "root"
    df = (
        "FROM x\n"
        f"RUN mkdir -p {root}/bin && \\\n"
        f"    cat > {root}/bin/greet <<'EOF'\n"
        "#!/bin/sh\n"
        'echo "hello $NAME"\n'
        "EOF\n"
        "RUN <<EOF\n"
        "set -e\n"
        f'echo "built for $NAME" > {root}/info.txt\n'
        "EOF\n"
        f"COPY --chmod=600 <<EOF {root}/etc/app.conf\n"
        "key=value\n"
        "EOF\n"
        "RUN cat <<-EOT\n"
        "\tindented\n"
        "\tEOT\n"
    )
    out = rewrite_heredocs(df)
    run_lines = [ln for ln in out.splitlines() if ln.startswith("RUN ")]
    assert len(out.splitlines()) == 5 and len(run_lines) == 4
    assert "EOF" not in out.splitlines() and "#!/bin/sh" not in out
    # the classic builder runs each RUN line with `/bin/sh -c`: do the same here
    import subprocess

    outputs = []
    for ln in run_lines:
        res = subprocess.run(
            ["/bin/sh", "-c", ln[4:]],
            env={"NAME": "world", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.append(res.stdout)
    assert (root / "bin" / "greet").read_text() == '#!/bin/sh\necho "hello $NAME"\n'
    assert (root / "info.txt").read_text() == "built for world\n"
    assert (root / "etc" / "app.conf").read_text() == "key=value\n"
    assert oct((root / "etc" / "app.conf").stat().st_mode & 0o777) == "0o600"
    assert outputs[-1] == "indented\n"
    assert has_heredoc(df) and not has_heredoc(plain)


def test_heredoc_task_builds_from_a_rewritten_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDGYM_CACHE", str(tmp_path))
    task = load_task_dir(FIXTURES / "harbor-heredoc")
    spec = sandbox_spec_for(task)
    assert spec.build_context is not None and spec.build_context != task.environment.build_context
    text = (spec.build_context / "Dockerfile").read_text()
    assert text.startswith("FROM ubuntu:24.04\n") and "<<" not in text
    mapped = sandbox_spec_for(task, {"ubuntu:24.04": "sandgym/base:bookworm"})
    assert mapped.build_context is not None
    assert (
        (mapped.build_context / "Dockerfile").read_text().startswith("FROM sandgym/base:bookworm\n")
    )


def test_image_map_reaches_every_stage_and_copy_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDGYM_CACHE", str(tmp_path))
    task = load_task_dir(FIXTURES / "harbor-copy-from")
    # a multi-stage Dockerfile: the spec still gets the last stage's WORKDIR and ENV
    spec = sandbox_spec_for(task)
    assert spec.workdir == "/workspace" and spec.env["PYTHONUNBUFFERED"] == "1"
    assert spec.build_context == task.environment.build_context  # nothing to rewrite
    image_map = {
        "python:3.13-slim-bookworm": "sandgym/terminal:latest",
        "ubuntu:24.04": "sandgym/base:bookworm",
        "ghcr.io/astral-sh/uv:latest": "local/uv:1",
    }
    mapped = sandbox_spec_for(task, image_map)
    assert mapped.build_context is not None
    lines = (mapped.build_context / "Dockerfile").read_text().splitlines()
    assert lines[0] == "FROM sandgym/terminal:latest AS builder"
    assert "FROM sandgym/base:bookworm" in lines
    assert "COPY --from=local/uv:1 /uv /uvx /bin/" in lines
    assert "COPY --from=builder /wheels /wheels" in lines  # a stage name is not an image


async def test_local_backends_still_refuse_what_needs_a_build() -> None:
    task = load_task_dir(FIXTURES / "harbor-copy-from")
    sb = await NullBackend().create(sandbox_spec_for(task))
    with pytest.raises(TaskUnsupportedError, match="multi-stage"):
        await prepare_episode(task, sb, seed=0)


def test_heredoc_dockerfile_parses_for_local_backends() -> None:
    from sandgym.tasks.dockerfile.load import task_dockerfile

    df = task_dockerfile(load_task_dir(FIXTURES / "harbor-heredoc"))
    assert df is not None and df.workdir == "/app" and df.env["NAME"] == "world"
    assert len(df.run_steps) == 4  # the three heredoc instructions + chmod, one RUN each


async def test_check_task_survives_a_close_that_fails() -> None:
    """An engine restart mid-check makes `close()` raise: the task's entry says so and the
    run goes on (it used to abort the whole `tasks check`)."""
    from sandgym.tasks.cli import check_task

    class FailingClose(NullBackend):
        async def create(self, spec: SandboxSpec) -> NullSandbox:  # type: ignore[override]
            sb = await super().create(spec)

            async def close() -> None:
                raise ConnectionError("Connection aborted.")

            sb.close = close  # type: ignore[method-assign]
            return sb

    task = load_task_dir(FIXTURES / "harbor-heredoc")
    check = await check_task(task, FailingClose(), {}, 0)
    assert check.error is not None
    assert "oracle: close: ConnectionError" in check.error
    assert "noop: close: ConnectionError" in check.error
    assert [(e.phase, e.error_type) for e in check.phase_errors] == [
        ("oracle", "TaskError"),  # the null backend runs no shell
        ("oracle close", "ConnectionError"),
        ("noop", "TaskError"),
        ("noop close", "ConnectionError"),
    ]
