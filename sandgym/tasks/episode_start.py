"""An episode's start: `prepare_episode` makes a fresh sandbox ready for the agent (the
Dockerfile applied where the backend built no image, input files, a procedural task's instance,
a desktop task's display, the first step's set-up, the agent's network, the verify mode), and
`mark_episode` records the tamper report's baseline. A pristine verifier starts its fresh
sandbox with it too, so it sits below the verifier modes (`sandgym.tasks.verifier.modes`)."""

from __future__ import annotations

import random
import time
import uuid

from sandgym.sandboxes import Sandbox, SandboxFileNotFoundError, UserUnsupportedError
from sandgym.sandboxes.common.users import is_root_user
from sandgym.sandboxes.network import NetworkPolicy
from sandgym.tasks.desktop import start_task_desktop
from sandgym.tasks.dockerfile import apply_dockerfile
from sandgym.tasks.episode_models import EpisodeSetup
from sandgym.tasks.errors import TaskError, TaskUnsupportedError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.steps import begin_step
from sandgym.tasks.tamper import engine_baseline, mark_baseline
from sandgym.tasks.verifier.choice import pristine_needs_outputs, resolve_verify_mode

#: where a generator may write its seed's instruction (see `_run_generator`)
INSTRUCTION_FILE_ENV = "SANDGYM_INSTRUCTION_FILE"


async def prepare_episode(
    task: TaskSpec,
    sandbox: Sandbox,
    seed: int | None,
    network_ceiling: NetworkPolicy | None = None,
    verify: str | None = None,
    baseline: bool = True,
) -> EpisodeSetup:
    """Make a fresh sandbox ready for the agent: environment files, input files, and (for a
    procedural task) this seed's instance. Tests are *not* copied: they arrive at verify time.
    The set-up runs under the environment's network; the sandbox is then switched to the
    agent's (both clamped by `network_ceiling`, as in `sandbox_spec_for`). `verify`: the mode
    asked for (the reset's or server's; `resolve_verify_mode`); `baseline`: record the changed
    paths so far, so that the tamper report names only the agent's (`mark_episode`)."""
    start = time.perf_counter()
    users = [task.agent_user, task.verifier_user, *(s.agent_user for s in task.steps)]
    others = [u for u in users if not is_root_user(u)]
    if others and not sandbox.capabilities.other_users:  # refused before the agent's first act
        raise UserUnsupportedError(
            f"task {task.id}: runs commands as user {others[0]!r}, and its sandbox runs every "
            "command as root (the local backend's user namespace maps uid 0 alone); use docker"
        )
    mode = resolve_verify_mode(task, verify)
    seed = random.randrange(2**31) if seed is None else int(seed)
    warnings: list[str] = []
    if not sandbox.builds_images:
        await apply_dockerfile(task, sandbox, warnings)
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
        await begin_step(task, sandbox, first)
    plan = task.network_plan(first).clamp(network_ceiling)
    await sandbox.set_network(plan.agent)
    wrote = bool(task.input_files or task.generator or first or desktop)  # the set-up's files
    setup = EpisodeSetup(
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
        verify=mode,
    )
    if baseline and sandbox.lists_changes and sandbox.builds_images and not wrote:
        # nothing written since the image: the agent's changes are all the changes (spares a
        # diff per reset, which the engine makes slowly on btrfs: about 1.6 s measured here)
        setup.change_baseline = await engine_baseline(sandbox)  # /etc/hosts and co
    elif baseline:
        await mark_episode(task, sandbox, setup)
    return setup


async def mark_episode(
    task: TaskSpec,
    sandbox: Sandbox,
    setup: EpisodeSetup,
    verify: str | None = None,
    forked: bool = False,
) -> None:
    """Record in `setup` the sandbox's changed paths now, the agent not having acted yet (the
    tamper report's baseline), and, when given, the episode's `verify` mode. A group's member
    calls it with `forked` after member 0's files and set-up were copied into its sandbox: where
    the backend builds images (docker) it keeps member 0's baseline, which describes the same
    files (a copy by changes keeps their bytes, modes and times; one from a snapshot image has
    them in its image) and whose fingerprints are of those; elsewhere (local: fingerprints hold
    inodes) the member takes its own. A mode that needs
    the report on a backend without one is a TaskUnsupportedError."""
    if verify is not None:
        setup.verify = resolve_verify_mode(task, verify)
    if not (forked and sandbox.builds_images and setup.change_baseline is not None):
        setup.change_baseline = await mark_baseline(task, sandbox, setup.workdir)
    if setup.change_baseline is None and setup.verify == "refuse-tampered":
        raise TaskUnsupportedError(
            f"task {task.id}: verify 'refuse-tampered' needs a tamper report, and the "
            f"{sandbox.backend_name} backend cannot list the paths a sandbox changed"
        )
    why = pristine_needs_outputs(task)
    if setup.change_baseline is None and setup.verify == "pristine" and why is not None:
        raise TaskUnsupportedError(
            f"task {task.id} cannot be verified pristine on the {sandbox.backend_name} "
            f"backend: {why}"
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
