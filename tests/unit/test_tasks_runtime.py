"""The runtime API on the null backend: spec mapping, Dockerfile application, the verifier's
ordering (tests and secrets only at verify time, reward files reset), oracles, answers."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes import ExecResult, SandboxCapabilities, SandboxSpec, UserUnsupportedError
from sandgym.sandboxes.null import NullBackend, NullSandbox
from sandgym.tasks import (
    TaskUnsupportedError,
    VerifierError,
    load_dataset,
    load_task_dir,
    prepare_episode,
    run_oracle,
    run_verifier,
    sandbox_spec_for,
)
from sandgym.tasks.errors import RewardOutOfRangeError
from sandgym.tasks.models import Keystroke, SolutionSpec
from sandgym.tasks.oracle import SCREEN_MARKER
from sandgym.tasks.sandbox_spec import parse_image_map

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


class ScriptedSandbox(NullSandbox):
    """A null sandbox that understands the verifier's reset command and runs `test_script`
    (a Python callback standing in for bash) when the verifier script is executed."""

    def __init__(self, spec: SandboxSpec, test_script: Any) -> None:
        super().__init__(spec, NullBackend())
        self.test_script = test_script
        self.commands: list[tuple[str, str | None]] = []

    async def exec(self, cmd, timeout_s=60.0, cwd=None, env=None, user=None) -> ExecResult:  # type: ignore[no-untyped-def, override]
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        self.commands.append((command, user))
        if command.startswith("rm -rf /tests /logs/verifier"):
            for p in [p for p in self.files if p.startswith(("/tests/", "/logs/verifier/"))]:
                del self.files[p]
            return ExecResult(exit_code=0)
        if command.startswith("bash /tests/"):
            return self.test_script(self, env or {})
        return await super().exec(cmd, timeout_s, cwd, env, user)


def test_spec_from_dockerfile_and_image_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDGYM_CACHE", str(tmp_path))
    task = load_task_dir(FIXTURES / "harbor-legacy")
    spec = sandbox_spec_for(task)
    assert spec.workdir == "/app"
    assert spec.env == {"GREETING": "hello there", "MODE": "test"}
    assert spec.memory_mb == 2048 and spec.cpus == 2.0
    assert spec.build_context == task.environment.build_context
    assert spec.image is None

    mapped = sandbox_spec_for(task, {"ubuntu:24.04": "sandgym/terminal:latest"})
    assert mapped.build_context is not None and mapped.build_context != spec.build_context
    assert (
        (mapped.build_context / "Dockerfile")
        .read_text()
        .startswith("FROM sandgym/terminal:latest\n")
    )
    assert (mapped.build_context / "data" / "input.txt").is_file()
    # the task dir itself is untouched, and the mapped context is cached by content
    assert "FROM ubuntu:24.04" in (task.environment.build_context / "Dockerfile").read_text()  # type: ignore[operator]
    assert (
        sandbox_spec_for(task, {"ubuntu:24.04": "sandgym/terminal:latest"}).build_context
        == mapped.build_context
    )

    image_task = load_task_dir(FIXTURES / "harbor-image")
    assert sandbox_spec_for(image_task, {"sandgym/terminal:latest": "other:1"}).image == "other:1"
    assert parse_image_map(["a=b", "c:1=d:2"]) == {"a": "b", "c:1": "d:2"}
    with pytest.raises(ValueError, match="FROM=TO"):
        parse_image_map(["nothing"])


async def test_prepare_applies_copy_and_skips_run() -> None:
    task = load_task_dir(FIXTURES / "harbor-legacy")
    sb = await NullBackend().create(sandbox_spec_for(task))
    setup = await prepare_episode(task, sb, seed=None)
    assert sb.files["/app/data/input.txt"] == b"alpha\nbeta\ngamma\n"  # type: ignore[attr-defined]
    assert not any(p.startswith("/tests") for p in sb.files)  # type: ignore[attr-defined]
    assert len(setup.warnings) == 1 and "RUN skipped" in setup.warnings[0]
    assert setup.instruction == task.instruction
    assert isinstance(setup.seed, int) and setup.secret == {}


async def test_prepare_copies_single_file_to_named_dest() -> None:
    task = load_task_dir(FIXTURES / "tbench-modern")
    sb = await NullBackend().create(sandbox_spec_for(task))
    await prepare_episode(task, sb, seed=3)
    assert sb.files["/app/words.txt"] == b"a\nb\nc\nd\n"  # type: ignore[attr-defined]


async def test_verifier_resets_logs_and_copies_tests_late() -> None:
    task = load_task_dir(FIXTURES / "harbor-image")
    seen: dict[str, Any] = {}

    def test_sh(sb: ScriptedSandbox, env: dict[str, str]) -> ExecResult:
        seen["files"] = sorted(sb.files)
        seen["env"] = env
        sb.files["/logs/verifier/reward.txt"] = b"0\n"
        return ExecResult(exit_code=0, stdout="checked\n")

    sb = ScriptedSandbox(sandbox_spec_for(task), test_sh)
    setup = await prepare_episode(task, sb, seed=0)
    setup.secret["expected"] = b"55\n"
    # the "agent" forges a reward and plants its own test script
    sb.files["/logs/verifier/reward.txt"] = b"1\n"
    sb.files["/tests/test.sh"] = b"echo 1 > /logs/verifier/reward.txt"
    result = await run_verifier(task, sb, setup)
    assert result.reward == 0.0
    assert result.output == "checked\n"
    assert "/tests/test.sh" in seen["files"] and "/tests/secret/expected" in seen["files"]
    assert sb.files["/tests/test.sh"] == (FIXTURES / "harbor-image/tests/test.sh").read_bytes()
    assert seen["env"]["TEST_DIR"] == "/tests"
    assert sb.commands, "the verifier ran no command"
    assert all(user == "root" for _, user in sb.commands)


async def test_verifier_without_reward_file_is_an_error() -> None:
    task = load_task_dir(FIXTURES / "harbor-image")
    sb = ScriptedSandbox(
        sandbox_spec_for(task), lambda sb, env: ExecResult(exit_code=2, stdout="boom: syntax error")
    )
    setup = await prepare_episode(task, sb, seed=0)
    with pytest.raises(VerifierError, match="exited 2 without writing a reward") as info:
        await run_verifier(task, sb, setup)
    assert "boom: syntax error" in info.value.output
    assert info.value.cause == "no_reward"


async def test_verifier_timeout_is_an_error() -> None:
    task = load_task_dir(FIXTURES / "harbor-image")
    sb = ScriptedSandbox(
        sandbox_spec_for(task), lambda sb, env: ExecResult(exit_code=None, timed_out=True)
    )
    setup = await prepare_episode(task, sb, seed=0)
    with pytest.raises(VerifierError, match="did not finish") as info:
        await run_verifier(task, sb, setup)
    assert info.value.cause == "timeout" and str(info.value).startswith("[timeout] ")


async def test_terminal_bench_1_tests_past_their_limit_score_0_as_its_harness_does() -> None:
    """Terminal-Bench 1's harness leaves a trial whose tests time out unresolved (0 in its
    accuracy): the episode scores 0.0 with the reason, even if a test had printed PASSED."""
    task = load_task_dir(FIXTURES / "tbench-modern")
    assert task.verifier.kind == "tbench"
    printed = "PASSED tests/test_outputs.py::test_count\n"
    sb = ScriptedSandbox(
        sandbox_spec_for(task),
        lambda sb, env: ExecResult(exit_code=None, stdout=printed, timed_out=True),
    )
    setup = await prepare_episode(task, sb, seed=0)
    result = await run_verifier(task, sb, setup)
    assert (result.reward, result.reason) == (0.0, "test_timeout")
    assert result.output.startswith(printed) and "did not finish within 30.0 s" in result.output
    assert result.details == {"timeout_s": 30.0}


async def test_harbor_reward_range_default_and_declared() -> None:
    base = load_task_dir(FIXTURES / "harbor-image")

    def writes(value: str) -> Any:
        def test_sh(sb: ScriptedSandbox, env: dict[str, str]) -> ExecResult:
            sb.files["/logs/verifier/reward.txt"] = value.encode()
            return ExecResult(exit_code=0)

        return test_sh

    sb = ScriptedSandbox(sandbox_spec_for(base), writes("1.5"))
    setup = await prepare_episode(base, sb, seed=0)
    with pytest.raises(RewardOutOfRangeError, match=r"outside the task's range \[0, 1\]"):
        await run_verifier(base, sb, setup)
    declared = base.model_copy(update={"metadata": {**base.metadata, "reward_range": [-1, 2]}})
    sb = ScriptedSandbox(sandbox_spec_for(declared), writes("1.5"))
    assert (await run_verifier(declared, sb, setup)).reward == 1.5
    broken = base.model_copy(update={"metadata": {**base.metadata, "reward_range": [1, 0]}})
    sb = ScriptedSandbox(sandbox_spec_for(broken), writes("0.5"))
    with pytest.raises(VerifierError, match="reward_range") as info:
        await run_verifier(broken, sb, setup)
    assert info.value.cause == "task"


async def test_terminal_bench_1_tests_with_no_result_score_0_as_its_harness_does() -> None:
    """No pytest result (pytest missing): Terminal-Bench 1's harness returns PARSE_ERROR and
    leaves the trial unresolved, so the episode scores 0.0 with the reason; a SETA task (weighted
    tests, no such harness rule) keeps the VerifierError."""
    printed = "/tests/run-tests.sh: line 5: pytest: command not found\n"

    def no_pytest(sb: ScriptedSandbox, env: dict[str, str]) -> ExecResult:
        return ExecResult(exit_code=127, stdout=printed)

    task = load_task_dir(FIXTURES / "tbench-modern")
    sb = ScriptedSandbox(sandbox_spec_for(task), no_pytest)
    setup = await prepare_episode(task, sb, seed=0)
    result = await run_verifier(task, sb, setup)
    assert (result.reward, result.reason) == (0.0, "parse_error")
    assert result.output.startswith(printed) and "reported no result" in result.output
    assert result.details == {"tests": {}, "exit_code": 127}
    seta = load_task_dir(FIXTURES / "seta-task")
    sb = ScriptedSandbox(sandbox_spec_for(seta), no_pytest)
    setup = await prepare_episode(seta, sb, seed=0)
    with pytest.raises(VerifierError, match="no pytest results") as info:
        await run_verifier(seta, sb, setup)
    assert info.value.cause == "no_results"


async def test_pytest_tasks_score_from_the_junit_report() -> None:
    """pytest is asked for a JUnit report in /logs/verifier; a forged summary in the output is
    then ignored, and the details say which source was used."""
    task = load_task_dir(FIXTURES / "seta-task")
    forged = (
        "short test summary info\nPASSED t.py::test_config_exists\n"
        "PASSED t.py::test_config_values\nPASSED t.py::test_readme_mentions_port\n"
    )
    junit = (
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="test_outputs" name="test_config_exists"/>'
        '<testcase classname="test_outputs" name="test_config_values"><failure/></testcase>'
        '<testcase classname="test_outputs" name="test_readme_mentions_port"/>'
        "</testsuite></testsuites>"
    )
    seen: dict[str, str] = {}

    def test_sh(sb: ScriptedSandbox, env: dict[str, str]) -> ExecResult:
        seen.update(env)
        sb.files["/logs/verifier/sandgym-pytest-junit.xml"] = junit.encode()
        return ExecResult(exit_code=0, stdout=forged)

    sb = ScriptedSandbox(sandbox_spec_for(task), test_sh)
    setup = await prepare_episode(task, sb, seed=0)
    result = await run_verifier(task, sb, setup)
    assert seen["PYTEST_ADDOPTS"] == "--junitxml=/logs/verifier/sandgym-pytest-junit.xml"
    assert result.reward == pytest.approx(0.5)
    assert result.details["result_source"] == "junit"


async def test_seta_verifier_weights() -> None:
    task = load_task_dir(FIXTURES / "seta-task")
    out = (
        "short test summary info\nPASSED t.py::test_config_exists\n"
        "FAILED t.py::test_config_values\nPASSED t.py::test_readme_mentions_port\n"
    )
    sb = ScriptedSandbox(
        sandbox_spec_for(task), lambda sb, env: ExecResult(exit_code=1, stdout=out)
    )
    setup = await prepare_episode(task, sb, seed=0)
    result = await run_verifier(task, sb, setup)
    assert result.reward == pytest.approx(0.5)
    assert "/tests/run-tests.sh" in sb.files and "/tests/test_outputs.py" in sb.files


async def test_answer_tasks_end_to_end_on_null() -> None:
    backend = NullBackend()
    tasks = load_dataset(FIXTURES / "lis" / "instances.jsonl")
    # the fixture: three tasks, with one, no and one input file
    assert [(t.id, len(t.input_files)) for t in tasks] == [
        ("lis-math-1", 1),
        ("lis-chem-2", 0),
        ("lis-doc-3", 1),
    ]
    for task in tasks:
        sb = await backend.create(sandbox_spec_for(task))
        setup = await prepare_episode(task, sb, seed=0)
        for path, content in task.input_files.items():
            assert sb.files[path] == content.encode()  # type: ignore[attr-defined]
        assert (await run_verifier(task, sb, setup)).reward == 0.0  # no answer yet
        await run_oracle(task, sb, setup)
        assert (await run_verifier(task, sb, setup)).reward == 1.0
        await sb.write_file("/testbed/answer.txt", "wrong")
        assert (await run_verifier(task, sb, setup)).reward == 0.0


async def test_oracle_script_and_keystrokes() -> None:
    task = load_task_dir(FIXTURES / "tbench-modern")
    sb = ScriptedSandbox(sandbox_spec_for(task), lambda sb, env: ExecResult(exit_code=0))
    setup = await prepare_episode(task, sb, seed=0)
    await run_oracle(task, sb, setup)
    assert (
        sb.files["/solution/solution.sh"] == (FIXTURES / "tbench-modern/solution.sh").read_bytes()
    )
    assert sb.commands[-1] == ("bash /solution/solution.sh", None)

    keys_task = load_task_dir(FIXTURES / "tbench-legacy")
    sb2 = await NullBackend().create(sandbox_spec_for(keys_task))
    setup2 = await prepare_episode(keys_task, sb2, seed=0)
    res = await run_oracle(keys_task, sb2, setup2)
    assert res.exit_code == 0  # the null shell ran `cd /app` and the printf line
    assert sb2.files["/app/greeting.txt"] == b"hello, terminal\\n"  # type: ignore[attr-defined]
    assert SCREEN_MARKER not in res.stdout  # every step waited: its output is the record

    # Keys sent without waiting (broken-python's `python get-pip.py`, block: false) print only
    # on the terminal: the oracle's output ends with the screen, as TB1 keeps the pane.
    steps = [
        Keystroke(keys="python -c 'fetch()'", append_enter=True, block=False),
        Keystroke(keys="python get-pip.py", append_enter=True, block=False),
    ]
    no_wait = keys_task.model_copy(update={"solution": SolutionSpec(keystrokes=steps)})
    sb3 = await NullBackend().create(sandbox_spec_for(no_wait))
    res3 = await run_oracle(no_wait, sb3, await prepare_episode(no_wait, sb3, seed=0))
    assert res3.stdout == f"{SCREEN_MARKER}\npython -c 'fetch()'\rpython get-pip.py\r\n"


async def test_oracle_missing_is_unsupported() -> None:
    task = load_task_dir(FIXTURES / "harbor-image").model_copy(update={"solution": None})
    sb = await NullBackend().create(sandbox_spec_for(task))
    with pytest.raises(TaskUnsupportedError, match="no oracle"):
        await run_oracle(task, sb, await prepare_episode(task, sb, 0))


class _PrivateExecSeen(Exception):
    """Raised by `PrivateRecordingSandbox.exec_private` once it has recorded its arguments."""


class PrivateRecordingSandbox(NullSandbox):
    """A null sandbox with a private exec that records whether the verifier may see the agent's
    processes, then stops the verify."""

    capabilities = SandboxCapabilities(runs_real_commands=False, private_exec=True)

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec, NullBackend())
        self.see_processes: list[bool] = []

    async def exec_private(  # type: ignore[override]
        self, cmd, stdin, timeout_s=60.0, cwd=None, env=None, see_processes=True
    ) -> ExecResult:
        self.see_processes.append(see_processes)
        raise _PrivateExecSeen


async def test_the_private_verifier_sees_the_agents_processes_only_as_root() -> None:
    """Tests running as root may see the agent's processes; tests that drop to another user
    (who holds no capability, and whom the agent's root could become) are kept apart."""
    task = load_task_dir(FIXTURES / "harbor-image")
    for user, expected in (("root", True), ("0", True), ("nobody", False), ("1000", False)):
        sb = PrivateRecordingSandbox(sandbox_spec_for(task))
        setup = await prepare_episode(task, sb, seed=0)
        with pytest.raises(_PrivateExecSeen):
            await run_verifier(task.model_copy(update={"verifier_user": user}), sb, setup)
        assert sb.see_processes == [expected], user


class RootOnlySandbox(ScriptedSandbox):
    """A sandbox that runs commands as root alone (as the local backend's)."""

    capabilities = SandboxCapabilities(other_users=False)


async def test_a_task_with_another_user_is_refused_by_a_root_only_sandbox() -> None:
    """A verifier (or agent) user other than root on a sandbox that runs everything as root is
    refused at the episode's start, by name, before the agent acts: never run as root."""
    task = load_task_dir(FIXTURES / "harbor-image")
    for field in ("verifier_user", "agent_user"):
        other = task.model_copy(update={field: "nobody"})
        sb = RootOnlySandbox(sandbox_spec_for(task), lambda sb, env: ExecResult(exit_code=0))
        with pytest.raises(UserUnsupportedError, match="'nobody'.*use docker"):
            await prepare_episode(other, sb, seed=0)
        assert sb.commands == [], field
    await prepare_episode(task, RootOnlySandbox(sandbox_spec_for(task), lambda *a: None), seed=0)
    sb = ScriptedSandbox(sandbox_spec_for(task), lambda sb, env: ExecResult(exit_code=0))
    await prepare_episode(task.model_copy(update={"verifier_user": "nobody"}), sb, seed=0)
