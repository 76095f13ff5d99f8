"""Multi-step tasks (Harbor `[[steps]]`): what the current step sees (`step_view`), its set-up
before its agent (`begin_step`), and what its verifier result means for the episode
(`finish_step`: next step, or the end with Harbor's aggregate reward). A single-step task passes
through every function unchanged."""

from __future__ import annotations

import hashlib
import posixpath
import shutil
from pathlib import Path
from typing import Any

from sandgym.sandboxes import Sandbox
from sandgym.sandboxes.common.hashing import hash_directory
from sandgym.sandboxes.errors import SandboxHealthcheckError
from sandgym.sandboxes.health import run_healthcheck
from sandgym.tasks.cache import cached_tree
from sandgym.tasks.commands import run_checked
from sandgym.tasks.episode_models import EpisodeSetup, StepOutcome, VerifierResult
from sandgym.tasks.errors import TaskError
from sandgym.tasks.models import StepSpec, TaskSpec
from sandgym.tasks.paths import TESTS_DIR, VERIFIER_LOGS


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

    key = (hash_directory(shared) if shared else "") + hash_directory(overlay)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]

    def fill(tmp: Path) -> None:
        if shared is not None:
            shutil.copytree(shared, tmp, symlinks=True)
        shutil.copytree(overlay, tmp, symlinks=True, dirs_exist_ok=True)

    return cached_tree("step-tests", task_id, digest, fill)


async def begin_step(task: TaskSpec, sandbox: Sandbox, step: StepSpec) -> None:
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
        await run_checked(
            sandbox, f"rm -rf {TESTS_DIR} {VERIFIER_LOGS}", "removing the last step's tests"
        )
    try:
        await begin_step(task, sandbox, nxt)
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
