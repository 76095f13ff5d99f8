"""Running a task's verifier and scoring what it leaves (`run_verifier`): in the sandbox's
private verifier namespace where the backend has one (sandgym/tasks/private_verify.py), in the shared
file system where it has not, or in a sandbox of its own (`sandgym.tasks.verifier.separate`); the text
it leaves is turned into a reward by the pure rules of `sandgym.tasks.verifier.rewards`."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping

from sandgym.sandboxes import Sandbox, SandboxBackend, SandboxError, SandboxFileNotFoundError
from sandgym.sandboxes.common.users import as_user_argv, is_root_user
from sandgym.tasks import private_verify
from sandgym.tasks.commands import run_checked
from sandgym.tasks.episode_models import EpisodeSetup, VerifierResult
from sandgym.tasks.errors import VerifierError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.paths import SECRET_DIR, TESTS_DIR, VERIFIER_LOGS
from sandgym.tasks.sandbox_spec import resolve_env_templates
from sandgym.tasks.steps import step_view
from sandgym.tasks.verifier.ctrf import ctrf_tests
from sandgym.tasks.verifier.rewards import (
    DEFAULT_REWARD_RANGE,
    answer_reward,
    reward_from_files,
    seta_reward,
    tbench_reward,
)
from sandgym.tasks.verifier.separate import separate_verifier_sandbox

log = logging.getLogger(__name__)


async def _read_optional(sandbox: Sandbox, path: str) -> str | None:
    try:
        return (await sandbox.read_file(path, max_bytes=1_000_000)).decode("utf-8", "replace")
    except SandboxFileNotFoundError:
        return None


async def run_verifier(
    task: TaskSpec,
    sandbox: Sandbox,
    setup: EpisodeSetup,
    stop_agent_processes: bool = False,
    backend: SandboxBackend | None = None,
    image_map: Mapping[str, str] | None = None,
) -> VerifierResult:
    """Score the episode. Runs after the agent has finished: tests and secrets are copied in
    only now, `/logs/verifier` is emptied first (a reward file the agent wrote counts for
    nothing), and the script runs as the verifier user (root) under the verifier timeout.

    Where the sandbox has a private exec, tests and reward files live where nothing the agent
    left running can reach them (sandgym/tasks/private_verify.py): local, the verifier's own mount
    namespace; docker, a container of its own started from a snapshot of the sandbox, sharing
    its network and process namespaces (`DockerSandbox.exec_private`). `stop_agent_processes`
    is then ignored.
    Elsewhere (e2b) they are shared with whatever the agent left running; `stop_agent_processes`
    then kills all of it first (every process but the sandbox's init), at the price of tasks
    whose tests need a service the agent started."""
    start = time.perf_counter()
    task = await asyncio.to_thread(step_view, task, setup)
    if task.verifier_environment is not None:  # Harbor's separate verifier
        async with separate_verifier_sandbox(task, sandbox, setup, backend, image_map) as sep:
            result = await run_verifier(sep.task, sep.sandbox, sep.setup)
            result.details["verifier_sandbox"] = {"id": sep.sandbox.id, "artifacts": sep.artifacts}
            return result
    v = task.verifier
    if v.kind == "answer":
        assert v.answer is not None
        answer = await _read_optional(sandbox, v.answer.answer_path)
        reward, details = answer_reward(answer, v.answer)
        return VerifierResult(
            reward=reward,
            output=answer or "",
            duration_s=time.perf_counter() - start,
            details=details,
        )

    assert v.script_path is not None
    if setup.network is not None:  # the verifier phase's network (Harbor [verifier])
        await sandbox.set_network(setup.network.verifier)
    script = f"{TESTS_DIR}/{v.script or v.script_path.name}"
    env = {**resolve_env_templates(v.env, f"task {task.id}: verifier.env"), "TEST_DIR": TESTS_DIR}
    if v.kind in ("tbench", "seta"):
        # pytest's own report, written into the verifier's private /logs/verifier: scored
        # instead of the printed summary, which code the tests import can forge
        opt = f"--junitxml={VERIFIER_LOGS}/{private_verify.JUNIT_FILE}"
        env["PYTEST_ADDOPTS"] = (
            f"{env['PYTEST_ADDOPTS']} {opt}" if env.get("PYTEST_ADDOPTS") else opt
        )
    argv = ["bash", script]
    as_root = is_root_user(task.verifier_user)
    if not as_root:
        user = task.verifier_user
        argv = as_user_argv(user, argv)
    if sandbox.supports_private_exec:
        return await _run_private_verifier(task, sandbox, setup, argv, env, start, as_root)
    # No private exec on this backend (e2b): tests go into the shared file system and the
    # script runs next to whatever the agent left running (see sandgym/tasks/private_verify.py).
    if stop_agent_processes:
        try:
            await sandbox.kill_agent_processes()
        except SandboxError as exc:  # this backend has no safe way: say so, score anyway
            log.warning("verifier: agent processes not stopped: %s", exc)
    # Anything the agent left at /tests or /logs/verifier (files, symlinks) is removed.
    await run_checked(
        sandbox,
        f"rm -rf {TESTS_DIR} {VERIFIER_LOGS} && mkdir -p {TESTS_DIR} {VERIFIER_LOGS} "
        f"&& chmod 777 {VERIFIER_LOGS}",
        "resetting /tests and /logs/verifier",
        timeout_s=60,
    )
    if v.tests_dir is not None and v.tests_dir.is_dir():
        await sandbox.upload(v.tests_dir, TESTS_DIR)
    if v.kind in ("tbench", "seta"):
        await sandbox.upload(v.script_path, f"{TESTS_DIR}/{v.script_path.name}")
    for name, data in setup.secret.items():
        await sandbox.write_file(f"{SECRET_DIR}/{name}", data, mode=0o600)
    res = await sandbox.exec(
        ["bash", script],
        timeout_s=task.timeouts.verifier_timeout_s,
        cwd=setup.workdir,
        env=env,
        user=task.verifier_user,
    )
    output = res.stdout + (("\n" + res.stderr) if res.stderr else "")
    if res.timed_out:
        return _timed_out(task, output, start)
    txt = js = junit = ctrf = None
    if v.kind == "harbor":
        txt = await _read_optional(sandbox, f"{VERIFIER_LOGS}/reward.txt")
        js = await _read_optional(sandbox, f"{VERIFIER_LOGS}/reward.json")
        ctrf = await _read_optional(sandbox, f"{VERIFIER_LOGS}/{private_verify.CTRF_FILE}")
    else:
        junit = await _read_optional(sandbox, f"{VERIFIER_LOGS}/{private_verify.JUNIT_FILE}")
    return _score(task, output, res.exit_code, txt, js, start, junit, ctrf)


async def _run_private_verifier(
    task: TaskSpec,
    sandbox: Sandbox,
    setup: EpisodeSetup,
    argv: list[str],
    env: dict[str, str],
    start: float,
    as_root: bool,
) -> VerifierResult:
    """The test script in the sandbox's private verifier namespace (sandgym/tasks/private_verify.py)."""
    v = task.verifier
    assert v.script_path is not None
    extra = {f"secret/{name}": (data, 0o600) for name, data in setup.secret.items()}
    if v.kind in ("tbench", "seta"):
        extra[v.script_path.name] = (v.script_path.read_bytes(), 0o755)
    nonce = private_verify.new_nonce()
    payload = await asyncio.to_thread(private_verify.build_payload, nonce, v.tests_dir, extra)
    res = await sandbox.exec_private(
        private_verify.wrapper_argv(argv),
        payload,
        timeout_s=task.timeouts.verifier_timeout_s,
        cwd=setup.workdir,
        env=env,
        # tests that drop to another user hold no capability: kept apart from the agent's
        # processes, which could become that user (sandgym.sandboxes.base.Sandbox.exec_private)
        see_processes=as_root,
    )
    output = res.stdout
    if res.timed_out:
        return _timed_out(task, output, start)
    if res.exit_code in (private_verify.NO_PAYLOAD, private_verify.SETUP_FAILED):
        raise VerifierError(
            f"task {task.id}: the private verifier could not be set up in sandbox {sandbox.id} "
            f"(exit {res.exit_code}): {res.stderr.strip()[-1500:]}",
            output,
            cause="setup",
        )
    report = private_verify.parse_report(res.stderr, nonce, output)
    return _score(
        task,
        output,
        report.exit_code,
        report.files.get("reward.txt"),
        report.files.get("reward.json"),
        start,
        report.files.get(private_verify.JUNIT_FILE),
        report.files.get(private_verify.CTRF_FILE),
    )


def _timed_out(task: TaskSpec, output: str, start: float) -> VerifierResult:
    """A verifier past its timeout. The agent can cause it (a FIFO where the tests read, a
    service that hangs, a server it never started that the tests' client keeps retrying), so it
    is never masked and never run again.

    A Terminal-Bench 1 task (`kind == "tbench"`) is scored as that benchmark's own harness
    scores it: `Harness._run_tests` returns `FailureMode.TEST_TIMEOUT` when the tests run past
    `max_test_timeout_sec`, the trial is left unresolved (`is_resolved` never set), and the
    run's accuracy counts it among its trials as not resolved (terminal-bench 0.2.11 and 0.2.18,
    harness.py/models.py): reward 0.0, `reason="test_timeout"`. Every other kind raises
    `VerifierError` (cause `timeout`), as Harbor (0.26.0) raises `VerifierTimeoutError`: no
    valid reward (not retried, left out of the job's mean); sandgym's trainer scores it 0."""
    limit = task.timeouts.verifier_timeout_s
    if task.verifier.kind == "tbench":
        log.info("task %s: the tests ran past %s s: unresolved (test_timeout), 0.0", task.id, limit)
        return VerifierResult(
            reward=0.0,
            output=output + f"\n[sandgym: the tests did not finish within {limit} s: unresolved]",
            duration_s=time.perf_counter() - start,
            details={"timeout_s": limit},
            reason="test_timeout",
        )
    raise VerifierError(
        f"task {task.id}: the verifier did not finish within {limit} s", output, cause="timeout"
    )


def _parse_error(
    task: TaskSpec, output: str, exit_code: int | None, start: float
) -> VerifierResult:
    """A Terminal-Bench 1 task's tests that reported no result (pytest missing or not run, the
    test script stopped before it): that benchmark's harness finds no `short test summary info`
    in the pane, returns `FailureMode.PARSE_ERROR` from `_parse_results`, leaves the trial
    unresolved, and counts it in the run's accuracy (terminal-bench 0.2.18, harness.py and
    models.py). So it scores 0.0 here with `reason="parse_error"`, like `test_timeout`: the
    agent can cause it (by removing pytest, say), so it is never an error to retry or mask."""
    log.info("task %s: the tests reported no result: unresolved (parse_error), 0.0", task.id)
    return VerifierResult(
        reward=0.0,
        output=output + "\n[sandgym: the tests reported no result (no pytest report): unresolved]",
        duration_s=time.perf_counter() - start,
        details={"tests": {}, "exit_code": exit_code},
        reason="parse_error",
    )


def reward_range(task: TaskSpec) -> tuple[float, float]:
    """The rewards the task's verifier may give: [0, 1] unless `metadata.reward_range = [lo, hi]`."""
    declared = task.metadata.get("reward_range")
    if declared is None:
        return DEFAULT_REWARD_RANGE
    ok = (
        isinstance(declared, list | tuple)
        and len(declared) == 2
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in declared)
        and all(math.isfinite(x) for x in declared)
        and declared[0] < declared[1]
    )
    if not ok:
        raise VerifierError(
            f"task {task.id}: metadata.reward_range must be [low, high] with finite low < high, "
            f"found {declared!r}",
            cause="task",
        )
    return float(declared[0]), float(declared[1])


def _score(
    task: TaskSpec,
    output: str,
    exit_code: int | None,
    txt: str | None,
    js: str | None,
    start: float,
    junit: str | None = None,
    ctrf: str | None = None,
) -> VerifierResult:
    """The reward from what the verifier left. A Harbor task's CTRF report (`ctrf`), where its
    tests wrote one, adds per-test results to the details (`tests`, `tests_source: "ctrf"`)
    for naming failing tests; the reward file alone scores."""
    v = task.verifier
    if v.kind == "harbor":
        if txt is None and js is None and exit_code not in (None, 0):
            raise VerifierError(
                f"task {task.id}: the test script exited {exit_code} without writing a reward "
                "(it crashed, or its checker could not run)",
                output,
                cause="no_reward",
            )
        reward, details = reward_from_files(txt, js, output, reward_range(task))
        tests = ctrf_tests(ctrf)
        if tests is not None:
            details["tests"], details["tests_source"] = tests, "ctrf"
    elif v.kind == "seta":
        assert v.weights is not None
        reward, details = seta_reward(output, v.weights, junit, exit_code)
    else:
        try:
            reward, details = tbench_reward(output, junit, exit_code)
        except VerifierError as exc:
            if exc.cause != "no_results":
                raise
            return _parse_error(task, output, exit_code, start)
    details["exit_code"] = exit_code
    return VerifierResult(
        reward=reward, output=output, duration_s=time.perf_counter() - start, details=details
    )
