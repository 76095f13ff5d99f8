"""The task runtime: the API the env server and the trainer call.

    spec  = sandbox_spec_for(task, image_map)          # what sandbox to create
    setup = await prepare_episode(task, sandbox, seed)  # files, generator -> instruction, secret
    ...the agent acts...
    result = await run_verifier(task, sandbox, setup)   # tests copied in only now -> reward
    await run_oracle(task, sandbox, setup)              # the reference solution (checks)

On backends that build no image (local, null), `prepare_episode` applies the task's
Dockerfile as far as it can: WORKDIR, ENV (through the SandboxSpec), COPY/ADD of build-context
files; RUN lines are skipped with a warning unless the spec opts in (`allow_run`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import os
import posixpath
import random
import re
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandboxes import (
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxSpec,
)
from sandboxes.desktop import start_task_desktop
from sandboxes.errors import SandboxHealthcheckError
from sandboxes.network import NetworkPolicy, clamp
from tasks import private_verify
from tasks.dockerfile import CopyStep, Dockerfile, MkdirStep, RunStep, parse_dockerfile
from tasks.errors import TaskError, TaskLoadError, TaskUnsupportedError, VerifierError
from tasks.heredoc import has_heredoc, rewrite_heredocs
from tasks.models import NetworkPlan, StepSpec, TaskSpec
from tasks.verifier import (
    DEFAULT_REWARD_RANGE,
    answer_reward,
    reward_from_files,
    seta_reward,
    tbench_reward,
)

log = logging.getLogger(__name__)

DEFAULT_WORKDIR = "/app"
TESTS_DIR = "/tests"
VERIFIER_LOGS = "/logs/verifier"
SOLUTION_DIR = "/solution"
SECRET_DIR = "/tests/secret"
#: where a generator may write its seed's instruction (see `_run_generator`)
INSTRUCTION_FILE_ENV = "SANDGYM_INSTRUCTION_FILE"
#: the episode's instruction, given to the oracle solution of a procedural task
INSTRUCTION_ENV = "SANDGYM_INSTRUCTION"


class EpisodeSetup(BaseModel):
    """What `prepare_episode` hands back: the prompt, and what only the verifier may see."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    instruction: str = Field(description="the prompt shown to the agent")
    seed: int = Field(description="the seed this instance was generated from")
    secret: dict[str, bytes] = Field(
        default_factory=dict, description="files copied to /tests/secret/ for the verifier only"
    )
    workdir: str = DEFAULT_WORKDIR
    warnings: list[str] = Field(default_factory=list, description="e.g. RUN lines skipped")
    duration_s: float = 0.0
    desktop: Any = Field(
        None, description="sandboxes.desktop.Desktop of a desktop task (display started, app up)"
    )
    network: NetworkPlan | None = Field(
        None, description="each phase's network (after the server's clamp); info.network"
    )
    network_ceiling: NetworkPolicy | None = Field(None, description="the server's clamp")
    step_index: int = Field(0, description="multi-step tasks: the step being played")
    step_rewards: list[float] = Field(
        default_factory=list, description="multi-step tasks: the rewards of the steps scored"
    )


class VerifierResult(BaseModel):
    """The outcome of one verifier run."""

    reward: float
    output: str = Field("", description="the verifier's stdout+stderr")
    duration_s: float = 0.0
    details: dict[str, Any] = Field(default_factory=dict)


# -- sandbox spec -------------------------------------------------------------------------------


def parse_image_map(items: list[str] | None) -> dict[str, str]:
    """`["FROM=TO", ...]` -> dict; raises ValueError on an item without '='."""
    out: dict[str, str] = {}
    for item in items or []:
        src, eq, dst = item.partition("=")
        if not eq or not src or not dst:
            raise ValueError(f"expected --image-map FROM=TO, found {item!r}")
        out[src.strip()] = dst.strip()
    return out


_ENV_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env_templates(
    env: Mapping[str, str], where: str, host_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Resolve Harbor's `${VAR}` / `${VAR:-default}` templates in a task's env table from the
    host environment (Harbor does this at trial time, e.g. `OPENROUTER_API_KEY =
    "${OPENROUTER_API_KEY}"`), so the sandbox never sees the literal template. A variable that
    is unset on the host and has no default makes the task unrunnable here: a named error."""
    host = os.environ if host_env is None else host_env
    out: dict[str, str] = {}
    for key, value in env.items():

        def sub(m: re.Match[str], key: str = key) -> str:
            name, default = m.group(1), m.group(2)
            if name in host:
                return host[name]
            if default is not None:
                return default
            raise TaskUnsupportedError(
                f"{where}.{key} is the template {m.group(0)!r}: expected host variable {name} "
                "to be set (or a ${VAR:-default}), found it unset"
            )

        out[key] = _ENV_TEMPLATE.sub(sub, value)
    return out


def task_dockerfile(task: TaskSpec) -> Dockerfile | None:
    """The parsed Dockerfile of a task, or None when it runs on a prebuilt image."""
    env = task.environment
    if env.build_context is None:
        return None
    path = env.build_context / env.dockerfile
    try:
        st = os.stat(path)
        return _parsed_dockerfile(str(path), st.st_mtime_ns, st.st_size)
    except OSError as exc:
        raise TaskLoadError(f"task {task.id}: cannot read {path}: {exc}") from None


@functools.lru_cache(maxsize=1024)
def _parsed_dockerfile(path: str, _mtime_ns: int, _size: int) -> Dockerfile:
    """Parsed once per file version (a reset asks every time; read + parse was ~3 % of a
    reset's CPU); the stat signature in the key notices an edited file."""
    text = Path(path).read_text(encoding="utf-8")
    # heredoc bodies are not instructions: parse them as the one-line RUNs the build runs
    return parse_dockerfile(rewrite_heredocs(text))


_COPY_FROM = re.compile(r"(--from=)(\S+)")


def _map_images(text: str, image_map: Mapping[str, str]) -> str:
    """Every stage's `FROM IMAGE` and every `COPY --from=IMAGE` named in `image_map`, replaced
    (stage names, `AS` aliases and flags are kept)."""
    out = []
    for line in text.splitlines():
        tokens = line.split()
        if tokens and tokens[0].upper() == "FROM":
            for j in range(1, len(tokens)):
                if not tokens[j].startswith("--"):
                    if tokens[j] in image_map:
                        tokens[j] = image_map[tokens[j]]
                        line = " ".join(tokens)
                    break
        elif tokens and tokens[0].upper() in ("COPY", "ADD") and "--from=" in line:
            line = _COPY_FROM.sub(
                lambda m: m.group(1) + image_map.get(m.group(2), m.group(2)), line
            )
        out.append(line)
    return "\n".join(out) + "\n"


def _needs_rewrite(text: str, image_map: Mapping[str, str]) -> bool:
    return has_heredoc(text) or _map_images(text, image_map) != "\n".join(text.splitlines()) + "\n"


def _mapped_context(task: TaskSpec, image_map: Mapping[str, str]) -> Path:
    """A copy of the build context whose Dockerfile has its images mapped (`_map_images`) and
    its heredocs rewritten for the classic builder (`tasks.heredoc`); cached by content."""
    env = task.environment
    assert env.build_context is not None
    text = (env.build_context / env.dockerfile).read_text(encoding="utf-8")
    new_text = rewrite_heredocs(_map_images(text, image_map))
    from sandboxes.spec import hash_directory

    digest = hashlib.sha256((hash_directory(env.build_context) + new_text).encode()).hexdigest()[
        :16
    ]
    cache = Path(os.environ.get("SANDGYM_CACHE", Path.home() / ".cache" / "sandgym"))
    dest = cache / "contexts" / f"{task.id.replace('/', '_')}-{digest}"
    if not dest.exists():
        tmp = dest.with_name(dest.name + f".tmp{uuid.uuid4().hex[:6]}")
        shutil.copytree(env.build_context, tmp, symlinks=True)
        (tmp / env.dockerfile).write_text(new_text, encoding="utf-8")
        try:
            tmp.rename(dest)
        except OSError:  # a concurrent caller won the race; theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    log.debug("task %s: build context rewritten (images mapped, heredocs) at %s", task.id, dest)
    return dest


def _spec_dockerfile(task: TaskSpec) -> Dockerfile | None:
    """The Dockerfile as far as the spec needs it (WORKDIR, ENV). A multi-stage build or a
    `COPY --from` cannot be applied without building, but an image-building backend builds it:
    then the last stage, without its `--from` copies, still gives the WORKDIR and ENV."""
    try:
        return task_dockerfile(task)
    except TaskUnsupportedError:
        env = task.environment
        assert env.build_context is not None
        lines = (env.build_context / env.dockerfile).read_text(encoding="utf-8").splitlines()
        froms = [i for i, ln in enumerate(lines) if ln.strip().upper().startswith("FROM ")]
        last = lines[froms[-1] :] if froms else lines
        kept = [ln for ln in last if "--from=" not in ln]
        try:
            return parse_dockerfile("\n".join(kept) + "\n")
        except TaskError:
            return None


def sandbox_spec_for(
    task: TaskSpec,
    image_map: Mapping[str, str] | None = None,
    *,
    allow_run: bool = False,
    network_ceiling: NetworkPolicy | None = None,
) -> SandboxSpec:
    """The `SandboxSpec` a task's episodes need. `image_map` (FROM -> TO) replaces base images
    that cannot be pulled here with local ones, in `docker_image` and in the Dockerfile's FROM.
    `allow_run` opts in to executing Dockerfile RUN lines on backends that build no image.
    The sandbox starts with the environment's network and can switch to the agent's and the
    verifier's (`TaskSpec.network_plan`), each made no more open than `network_ceiling`."""
    image_map = dict(image_map or {})
    env = task.environment
    df = _spec_dockerfile(task)
    build_context = env.build_context
    image = None
    if env.build_context is None:
        image = image_map.get(env.image or "", env.image)
    else:
        text = (env.build_context / env.dockerfile).read_text(encoding="utf-8")
        if _needs_rewrite(text, image_map):
            build_context = _mapped_context(task, image_map)
    workdir = env.workdir or (df.workdir if df else None) or DEFAULT_WORKDIR
    task_env = resolve_env_templates(env.env, f"task {task.id}: environment.env")
    spec_env = {**(df.env if df else {}), **task_env}
    policies = [clamp(p, network_ceiling) for p in task.network_policies()]
    later = tuple(dict.fromkeys(p for p in policies[1:] if p != policies[0]))
    return SandboxSpec(
        image=image,
        build_context=build_context,
        dockerfile=env.dockerfile,
        workdir=workdir,
        env=spec_env,
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        storage_mb=env.storage_mb,
        network=policies[0],
        network_later=later,
        user=task.agent_user,
        labels={"sandgym.task": task.id[:63]},
        allow_run=allow_run,
        services=env.services,
        service_name=env.service_name,
        healthcheck=env.healthcheck,
    )


# -- episode preparation ------------------------------------------------------------------------


async def _check(sandbox: Sandbox, cmd: str, what: str, **kw: Any) -> ExecResult:
    res = await sandbox.exec(cmd, user="root", **kw)
    if res.exit_code != 0:
        raise TaskError(
            f"{what} failed in sandbox {sandbox.id} (exit {res.exit_code}, "
            f"timed_out={res.timed_out}): {(res.stderr or res.stdout)[-1500:]}"
        )
    return res


def _context_sources(context: Path, pattern: str, line: int) -> list[Path]:
    """Build-context paths a COPY source names (globs allowed), refusing escapes."""
    real_ctx = Path(os.path.realpath(context))
    rel = pattern.lstrip("/")
    matches = sorted(context.glob(rel)) if any(c in rel for c in "*?[") else [context / rel]
    out = []
    for m in matches:
        real = Path(os.path.realpath(m))
        if real != real_ctx and real_ctx not in real.parents:
            raise TaskLoadError(
                f"Dockerfile line {line}: COPY source {pattern!r} leaves the context"
            )
        if not m.exists():
            raise TaskLoadError(
                f"Dockerfile line {line}: COPY source {pattern!r} not found in {context}"
            )
        out.append(m)
    if not out:
        raise TaskLoadError(f"Dockerfile line {line}: COPY source {pattern!r} matched nothing")
    return out


async def _apply_copy(sandbox: Sandbox, context: Path, step: CopyStep) -> None:
    sources = [s for pat in step.sources for s in _context_sources(context, pat, step.line)]
    into_dir = step.dest.endswith("/") or len(sources) > 1
    dest = step.dest.rstrip("/") or "/"
    for src in sources:
        if src.is_dir():
            target = dest  # docker copies a directory's contents, not the directory
        elif into_dir:
            target = posixpath.join(dest, src.name)
        else:
            target = dest
        await sandbox.upload(src, target)
        if not sandbox.runs_real_commands:
            continue  # e.g. the null backend's fake shell: no chmod/chown
        if step.chmod:
            await _check(
                sandbox, f"chmod -R {shlex.quote(step.chmod)} {shlex.quote(target)}", "COPY --chmod"
            )
        if step.chown:
            await _check(
                sandbox, f"chown -R {shlex.quote(step.chown)} {shlex.quote(target)}", "COPY --chown"
            )


async def _apply_dockerfile(task: TaskSpec, sandbox: Sandbox, warnings: list[str]) -> None:
    df = task_dockerfile(task)
    context = task.environment.build_context
    if df is None or context is None:
        return
    for step in df.steps:
        if isinstance(step, MkdirStep):
            # a fake shell (null) keeps files in a dict: directories need no creating there
            if sandbox.runs_real_commands:
                await _check(sandbox, f"mkdir -p {shlex.quote(step.path)}", "WORKDIR")
        elif isinstance(step, CopyStep):
            await _apply_copy(sandbox, context, step)
        elif isinstance(step, RunStep):
            if sandbox.spec.allow_run:
                await _check(
                    sandbox,
                    step.command,
                    f"Dockerfile RUN (line {step.line})",
                    cwd=step.workdir,
                    env=step.env,
                    timeout_s=task.timeouts.build_timeout_s,
                )
            else:
                msg = (
                    f"task {task.id}: Dockerfile line {step.line}: RUN skipped on backend "
                    f"{sandbox.backend_name!r} (opt in with allow_run): {step.command[:120]}"
                )
                log.warning("%s", msg)
                warnings.append(msg)


async def prepare_episode(
    task: TaskSpec,
    sandbox: Sandbox,
    seed: int | None,
    network_ceiling: NetworkPolicy | None = None,
) -> EpisodeSetup:
    """Make a fresh sandbox ready for the agent: environment files, input files, and (for a
    procedural task) this seed's instance. Tests are *not* copied: they arrive at verify time.
    The set-up runs under the environment's network; the sandbox is then switched to the
    agent's (both clamped by `network_ceiling`, as in `sandbox_spec_for`)."""
    start = time.perf_counter()
    seed = random.randrange(2**31) if seed is None else int(seed)
    warnings: list[str] = []
    if not sandbox.builds_images:
        await _apply_dockerfile(task, sandbox, warnings)
    for path, content in task.input_files.items():
        await sandbox.write_file(path, content)
    secret: dict[str, bytes] = {}
    generated_instruction = None
    if task.generator is not None:
        secret["expected"], generated_instruction = await _run_generator(task, sandbox, seed)
        if generated_instruction is not None and task.steps:
            raise TaskError(
                f"task {task.id}: its generator wrote an instruction, which only a single-step "
                f"task may have (found {len(task.steps)} steps)"
            )
    # Desktop tasks: the display, window manager and the task's app are part of the instance.
    desktop = await start_task_desktop(sandbox, task.metadata, user=task.agent_user)
    first = task.steps[0] if task.steps else None
    if first is not None:
        await _begin_step(task, sandbox, first)
    plan = task.network_plan(first).clamp(network_ceiling)
    await sandbox.set_network(plan.agent)
    return EpisodeSetup(
        instruction=(
            generated_instruction
            if generated_instruction is not None
            else first.instruction
            if first is not None
            else task.instruction
        ),
        seed=seed,
        secret=secret,
        workdir=sandbox.spec.workdir,
        warnings=warnings,
        duration_s=time.perf_counter() - start,
        desktop=desktop,
        network=plan,
        network_ceiling=network_ceiling,
    )


async def _run_generator(task: TaskSpec, sandbox: Sandbox, seed: int) -> tuple[bytes, str | None]:
    """(the expected answer, the instance's own instruction or None). A generator may write the
    seed's instruction to the file `$SANDGYM_INSTRUCTION_FILE` names: it then replaces
    instruction.md as the agent's prompt (and reaches the oracle as `$SANDGYM_INSTRUCTION`)."""
    assert task.generator is not None
    # A random name outside the workdir, removed right after: the agent never sees it.
    gen_dir = f"/tmp/.sandgym-gen-{uuid.uuid4().hex[:10]}"
    script = f"{gen_dir}/{task.generator.script.name}"
    instruction_file = f"{gen_dir}/instruction.md"
    await sandbox.upload(task.generator.script, script)
    instruction = None
    try:
        res = await sandbox.exec(
            ["python3", script, "--seed", str(seed)],
            timeout_s=task.generator.timeout_s,
            cwd=sandbox.spec.workdir,
            env={INSTRUCTION_FILE_ENV: instruction_file},
            user="root",
        )
        if res.exit_code == 0:
            try:
                raw = await sandbox.read_file(instruction_file, max_bytes=100_000)
            except SandboxFileNotFoundError:
                raw = None
            if raw is not None:
                instruction = raw.decode("utf-8", "replace")
                if not instruction.strip():
                    raise TaskError(
                        f"task {task.id}: generator wrote an empty instruction for seed {seed}"
                    )
    finally:
        await sandbox.exec(["rm", "-rf", gen_dir], user="root", timeout_s=30)
    if res.exit_code != 0:
        raise TaskError(
            f"task {task.id}: generator failed for seed {seed} (exit {res.exit_code}, "
            f"timed_out={res.timed_out}): {res.stderr[-1500:]}"
        )
    return res.stdout.encode(), instruction


# -- verifier -----------------------------------------------------------------------------------


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
    left running can reach them (tasks/private_verify.py): local, the verifier's own mount
    namespace; docker, a container of its own started from a snapshot of the sandbox, sharing
    only its network (`DockerSandbox.exec_private`). `stop_agent_processes` is then ignored.
    Elsewhere (e2b) they are shared with whatever the agent left running; `stop_agent_processes`
    then kills all of it first (every process but the sandbox's init), at the price of tasks
    whose tests need a service the agent started."""
    start = time.perf_counter()
    task = await asyncio.to_thread(step_view, task, setup)
    if task.verifier_environment is not None:  # Harbor's separate verifier
        return await _run_separate_verifier(task, sandbox, setup, backend, image_map)
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
    if task.verifier_user not in (None, "root", "0"):
        user = task.verifier_user
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    if sandbox.supports_private_exec:
        return await _run_private_verifier(task, sandbox, setup, argv, env, start)
    # No private exec on this backend (e2b): tests go into the shared file system and the
    # script runs next to whatever the agent left running (see tasks/private_verify.py).
    if stop_agent_processes:
        try:
            await sandbox.kill_agent_processes()
        except SandboxError as exc:  # this backend has no safe way: say so, score anyway
            log.warning("verifier: agent processes not stopped: %s", exc)
    # Anything the agent left at /tests or /logs/verifier (files, symlinks) is removed.
    await _check(
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
    _raise_on_timeout(task, res, output)
    txt = js = junit = None
    if v.kind == "harbor":
        txt = await _read_optional(sandbox, f"{VERIFIER_LOGS}/reward.txt")
        js = await _read_optional(sandbox, f"{VERIFIER_LOGS}/reward.json")
    else:
        junit = await _read_optional(sandbox, f"{VERIFIER_LOGS}/{private_verify.JUNIT_FILE}")
    return _score(task, output, res.exit_code, txt, js, start, junit)


async def _run_private_verifier(
    task: TaskSpec,
    sandbox: Sandbox,
    setup: EpisodeSetup,
    argv: list[str],
    env: dict[str, str],
    start: float,
) -> VerifierResult:
    """The test script in the sandbox's private verifier namespace (tasks/private_verify.py)."""
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
    )
    output = res.stdout
    _raise_on_timeout(task, res, output)
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
    )


def _raise_on_timeout(task: TaskSpec, res: ExecResult, output: str) -> None:
    """A verifier past its timeout is a `VerifierError` (cause `timeout`); the agent can cause it
    (a FIFO where the tests read, a service that hangs), so it is scored 0, never masked."""
    if res.timed_out:
        raise VerifierError(
            f"task {task.id}: the verifier did not finish within {task.timeouts.verifier_timeout_s} s",
            output,
            cause="timeout",
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
) -> VerifierResult:
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
    elif v.kind == "seta":
        assert v.weights is not None
        reward, details = seta_reward(output, v.weights, junit, exit_code)
    else:
        reward, details = tbench_reward(output, junit, exit_code)
    details["exit_code"] = exit_code
    return VerifierResult(
        reward=reward, output=output, duration_s=time.perf_counter() - start, details=details
    )


# -- separate verifier ---------------------------------------------------------------------------

#: where Harbor's agents leave files for the verifier by convention
ARTIFACTS_DIR = "/logs/artifacts"


def verifier_sandbox_spec(
    task: TaskSpec,
    image_map: Mapping[str, str] | None = None,
    network_ceiling: NetworkPolicy | None = None,
    workdir: str | None = None,
) -> SandboxSpec:
    """The sandbox a separate verifier runs in: made from `task.verifier_environment`, under
    the verifier phase's network (clamped), with the agent's working directory."""
    assert task.verifier_environment is not None
    vtask = task.model_copy(
        update={
            "environment": task.verifier_environment,
            "verifier_environment": None,
            "steps": (),
            "agent_network": None,
            "id": f"{task.id}.verifier",
        }
    )
    spec = sandbox_spec_for(vtask, image_map, network_ceiling=network_ceiling)
    policy = clamp(task.verifier_network or task.verifier_environment.network, network_ceiling)
    update: dict[str, Any] = {"network": policy, "network_later": ()}
    if workdir is not None:
        update["workdir"] = workdir
    return spec.model_copy(update=update)


def _keep_plain(root: Path) -> None:
    """Drop symlinks and special files from a tree copied out of the agent's sandbox (as
    tarfile's `data` filter would): the verifier gets the agent's data, never a link."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            if p.is_symlink() or not (p.is_file() or p.is_dir()):
                p.unlink()
        dirnames[:] = [d for d in dirnames if (Path(dirpath) / d).is_dir()]


async def _copy_artifacts(
    task: TaskSpec, src: Sandbox, dst: Sandbox, workdir: str, scratch: Path
) -> list[str]:
    """The agent's working directory, `/logs/artifacts` and the task's declared artifacts,
    copied from the agent's sandbox to the verifier's at the same paths; the ones copied."""
    copied = []
    for i, path in enumerate(dict.fromkeys([workdir, ARTIFACTS_DIR, *task.artifacts])):
        host = scratch / str(i) / (posixpath.basename(path.rstrip("/")) or "root")
        try:
            await src.download(path, host)
        except (SandboxFileNotFoundError, FileNotFoundError):
            continue
        if not host.exists():
            continue
        await asyncio.to_thread(_keep_plain, host.parent)
        if host.exists():
            await dst.upload(host, path)
            copied.append(path)
    return copied


async def _run_separate_verifier(
    task: TaskSpec,
    sandbox: Sandbox,
    setup: EpisodeSetup,
    backend: SandboxBackend | None,
    image_map: Mapping[str, str] | None,
) -> VerifierResult:
    """Harbor's `environment_mode = "separate"`: the tests run in a sandbox of their own, made
    from the verifier's environment, holding a copy of what the agent left (`_copy_artifacts`);
    the agent's sandbox is never the verifier's."""
    if backend is None:
        raise TaskUnsupportedError(
            f"task {task.id}: a separate verifier needs a backend to create its sandbox; "
            "this caller passed none"
        )
    spec = verifier_sandbox_spec(task, image_map, setup.network_ceiling, setup.workdir)
    backend.check_network(spec)
    vsb = await backend.create(spec)
    try:
        warnings: list[str] = []
        vtask = task.model_copy(
            update={
                "environment": task.verifier_environment,
                "verifier_environment": None,
                "steps": (),
            }
        )
        if not vsb.builds_images:
            await _apply_dockerfile(vtask, vsb, warnings)
        with tempfile.TemporaryDirectory(prefix="sandgym-artifacts-") as scratch:
            copied = await _copy_artifacts(task, sandbox, vsb, setup.workdir, Path(scratch))
        vsetup = setup.model_copy(update={"network": None, "desktop": None})
        result = await run_verifier(vtask, vsb, vsetup)
        result.details["verifier_sandbox"] = {"id": vsb.id, "artifacts": copied}
        return result
    finally:
        await asyncio.shield(vsb.close())


# -- multi-step tasks ---------------------------------------------------------------------------


class StepOutcome(BaseModel):
    """What scoring one step means for the episode (`finish_step`)."""

    done: bool = Field(description="the episode is over (last step, or a failed gate)")
    reward: float = Field(description="done: the episode's reward; else 0.0")
    instruction: str | None = Field(None, description="not done: the next step's instruction")
    step: dict[str, Any] | None = Field(
        None, description="multi-step: info.step (name, index, count, reward, rewards, ...)"
    )


def current_step(task: TaskSpec, setup: EpisodeSetup) -> StepSpec | None:
    return task.steps[setup.step_index] if task.steps else None


def step_view(task: TaskSpec, setup: EpisodeSetup) -> TaskSpec:
    """The task as its current step sees it: the step's tests (its tests/ over the task's),
    solution, timeouts and user. A single-step task is itself. (Thread: may copy files.)"""
    step = current_step(task, setup)
    if step is None:
        return task
    verifier = step.verifier
    if step.tests_overlay is not None:
        verifier = verifier.model_copy(
            update={"tests_dir": _merged_tests(task.id, verifier.tests_dir, step.tests_overlay)}
        )
    timeouts = task.timeouts.model_copy(
        update={
            k: v
            for k, v in (
                ("agent_timeout_s", step.agent_timeout_s),
                ("verifier_timeout_s", step.verifier_timeout_s),
            )
            if v is not None
        }
    )
    return task.model_copy(
        update={
            "verifier": verifier,
            "solution": step.solution,
            "timeouts": timeouts,
            "agent_user": step.agent_user or task.agent_user,
            "instruction": step.instruction,
            "verifier_environment": (None if step.verifier_shared else step.verifier_environment)
            or (None if step.verifier_shared else task.verifier_environment),
        }
    )


def _merged_tests(task_id: str, shared: Path | None, overlay: Path) -> Path:
    """A directory holding the task's tests/ with the step's tests/ copied over it, as Harbor
    uploads them; cached by content."""
    from sandboxes.spec import hash_directory

    key = (hash_directory(shared) if shared else "") + hash_directory(overlay)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("SANDGYM_CACHE", Path.home() / ".cache" / "sandgym"))
    dest = cache / "step-tests" / f"{task_id.replace('/', '_')}-{digest}"
    if not dest.exists():
        tmp = dest.with_name(dest.name + f".tmp{uuid.uuid4().hex[:6]}")
        if shared is not None:
            shutil.copytree(shared, tmp, symlinks=True)
        shutil.copytree(overlay, tmp, symlinks=True, dirs_exist_ok=True)
        try:
            tmp.rename(dest)
        except OSError:  # a concurrent caller won the race; theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


async def _begin_step(task: TaskSpec, sandbox: Sandbox, step: StepSpec) -> None:
    """Before a step's agent: its workdir/ files into the workdir, then its setup.sh (as Harbor
    runs them: `bash <workdir>/setup.sh`, as the step's agent user), then its healthcheck."""
    workdir = sandbox.spec.workdir
    if step.workdir_dir is not None:
        await sandbox.upload(step.workdir_dir, workdir)
    if step.has_setup:
        res = await sandbox.exec(
            ["bash", posixpath.join(workdir, "setup.sh")],
            timeout_s=task.timeouts.build_timeout_s,
            cwd=workdir,
            user=step.agent_user or task.agent_user,
        )
        if res.exit_code != 0:
            raise TaskError(
                f"task {task.id}: step {step.name!r}: setup.sh failed (exit {res.exit_code}, "
                f"timed_out={res.timed_out}): {(res.stderr or res.stdout)[-1500:]}"
            )
    if step.healthcheck is not None:  # after the step's set-up, before its agent
        from sandboxes.health import run_healthcheck

        await run_healthcheck(sandbox, step.healthcheck)


def _gate_failure(step: StepSpec, result: VerifierResult) -> str | None:
    """Why the step's `min_reward` gate stops the episode, or None (Harbor: a key missing
    from the step's rewards counts as -inf)."""
    if step.min_reward is None:
        return None
    rewards = result.details.get("rewards") or {"reward": result.reward}
    for key, threshold in step.min_reward.items():
        value = rewards.get(key, float("-inf"))
        if not isinstance(value, int | float) or value < threshold:
            return f"{key}={value} below min_reward {threshold}"
    return None


async def finish_step(
    task: TaskSpec, sandbox: Sandbox, setup: EpisodeSetup, result: VerifierResult
) -> StepOutcome:
    """Record the current step's verifier result and move on: the episode ends after the last
    step or a failed `min_reward` gate, with Harbor's aggregate (`mean` of the steps scored, or
    the `final` one's); otherwise the next step's files and set-up are applied, its agent
    network switched on, and its instruction returned."""
    step = current_step(task, setup)
    if step is None:
        return StepOutcome(done=True, reward=result.reward)
    setup.step_rewards.append(result.reward)
    index = setup.step_index
    gate = _gate_failure(step, result)
    last = index + 1 >= len(task.steps)
    done = last or gate is not None
    info: dict[str, Any] = {
        "name": step.name,
        "index": index,
        "count": len(task.steps),
        "reward": result.reward,
        "rewards": list(setup.step_rewards),
    }
    if gate is not None:
        info["stopped"] = f"min_reward: {gate}"
    if done:
        return _episode_end(task, setup, info)
    nxt = task.steps[index + 1]
    if not sandbox.supports_private_exec:  # the step's tests were in the agent's file system
        await _check(
            sandbox, f"rm -rf {TESTS_DIR} {VERIFIER_LOGS}", "removing the last step's tests"
        )
    try:
        await _begin_step(task, sandbox, nxt)
    except (TaskError, SandboxHealthcheckError) as exc:
        # Harbor: a step whose set-up or healthcheck fails ends the trial, scored on the steps
        # before it. The agent may have caused it (it had the sandbox): scored, not masked.
        info["stopped"] = f"step {nxt.name!r}: {exc}"[:2000]
        return _episode_end(task, setup, info)
    setup.step_index = index + 1
    setup.network = task.network_plan(nxt).clamp(setup.network_ceiling)
    await sandbox.set_network(setup.network.agent)
    setup.instruction = nxt.instruction
    info["next"] = {"name": nxt.name, "index": index + 1}
    return StepOutcome(done=False, reward=0.0, instruction=nxt.instruction, step=info)


def _episode_end(task: TaskSpec, setup: EpisodeSetup, info: dict[str, Any]) -> StepOutcome:
    rewards = setup.step_rewards
    total = rewards[-1] if task.multi_step_reward == "final" else sum(rewards) / len(rewards)
    info["aggregate"] = task.multi_step_reward
    return StepOutcome(done=True, reward=total, step=info)


async def score_step(
    task: TaskSpec, sandbox: Sandbox, setup: EpisodeSetup, **verifier_kw: Any
) -> tuple[VerifierResult, StepOutcome]:
    """`run_verifier` then `finish_step`: what a `submit` does."""
    result = await run_verifier(task, sandbox, setup, **verifier_kw)
    return result, await finish_step(task, sandbox, setup, result)


# -- oracle -------------------------------------------------------------------------------------


async def run_oracle(task: TaskSpec, sandbox: Sandbox, setup: EpisodeSetup) -> ExecResult:
    """Run the task's reference solution: `solve.sh`/`solution.sh` as the agent user, or replay
    `solution.yaml` keystrokes through the sandbox's shell. A multi-step task's oracle is the
    current step's solution (its own, else the task's)."""
    task = await asyncio.to_thread(step_view, task, setup)
    sol = task.solution
    if sol is None and task.verifier.answer is not None:
        # An answer task's oracle knows the ground truth: writing it checks the whole path
        # (answer file location, normalisation, matching) end to end.
        start = time.perf_counter()
        ans = task.verifier.answer
        await sandbox.write_file(ans.answer_path, ans.ground_truth + "\n")
        return ExecResult(exit_code=0, duration_s=time.perf_counter() - start)
    if sol is None:
        raise TaskUnsupportedError(f"task {task.id} ships no oracle solution")
    if sol.script is not None:
        if sol.upload_dir is not None:
            await sandbox.upload(sol.upload_dir, SOLUTION_DIR)
            rel = sol.script.relative_to(sol.upload_dir).as_posix()
        else:
            rel = sol.script.name
            await sandbox.upload(sol.script, f"{SOLUTION_DIR}/{rel}")
        return await sandbox.exec(
            ["bash", f"{SOLUTION_DIR}/{rel}"],
            timeout_s=task.timeouts.agent_timeout_s,
            cwd=setup.workdir,
            env=_oracle_env(task, setup, sol.env),
            user=task.agent_user,
        )
    start = time.perf_counter()
    outputs: list[str] = []
    exit_code: int | None = 0
    assert sol.keystrokes is not None
    for step in sol.keystrokes:
        if step.block:
            res = await sandbox.run(step.keys, timeout_s=step.max_timeout_s)
            outputs.append(res.output)
            exit_code = res.exit_code
            if res.timed_out:
                return ExecResult(
                    exit_code=None,
                    stdout="".join(outputs),
                    timed_out=True,
                    duration_s=time.perf_counter() - start,
                )
        else:
            await sandbox.send_keys(step.keys + ("\r" if step.append_enter else ""))
        if step.min_timeout_s:
            await asyncio.sleep(step.min_timeout_s)
    return ExecResult(
        exit_code=exit_code, stdout="".join(outputs), duration_s=time.perf_counter() - start
    )


def _oracle_env(task: TaskSpec, setup: EpisodeSetup, env: dict[str, str]) -> dict[str, str] | None:
    """The solution's environment: its own `solution.env`, and for a procedural task the
    episode's instruction (a generated instruction is the only place the instance's ask is)."""
    out = dict(resolve_env_templates(env, f"task {task.id}: solution.env") or {})
    if task.generator is not None:
        out[INSTRUCTION_ENV] = setup.instruction
    return out or None
