"""The oracle: a task's reference solution run in a prepared sandbox (`run_oracle`), what
`sandgym tasks check` and `--agent oracle` use to show a task is solvable."""

from __future__ import annotations

import asyncio
import time

from sandgym.sandboxes import ExecResult, Sandbox
from sandgym.tasks.episode_models import EpisodeSetup
from sandgym.tasks.errors import TaskUnsupportedError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.paths import SOLUTION_DIR
from sandgym.tasks.sandbox_spec import resolve_env_templates
from sandgym.tasks.steps import step_view

#: the episode's instruction, given to the oracle solution of a procedural task
INSTRUCTION_ENV = "SANDGYM_INSTRUCTION"


#: heads the terminal's screen in a keystroke oracle's output (after its last step)
SCREEN_MARKER = "--- the terminal's screen after the last keystroke ---"


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
        raise TaskUnsupportedError(f"task {task.id} ships no oracle solution", cause="no_oracle")
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
    if any(not step.block for step in sol.keystrokes):
        # What keys sent without waiting printed is only on the terminal: keep its screen, as
        # Terminal-Bench's harness keeps the pane, so the oracle's record shows what happened
        # (e.g. a download that failed) and not an empty output.
        outputs.append(f"{SCREEN_MARKER}\n{await sandbox.screen()}\n")
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
