"""The task layer asks a sandbox what it can do (`builds_images`, `runs_real_commands`), never
which backend it is: a sandbox of any name that builds images gets no Dockerfile applied, one
that does not gets its WORKDIR/COPY applied, and mkdir/chmod run only where commands are real."""

from __future__ import annotations

import shlex
from pathlib import Path

from sandboxes import ExecResult, SandboxSpec
from sandboxes.null import NullBackend, NullSandbox
from tasks import load_task_dir, prepare_episode, sandbox_spec_for


def _task_dir(root: Path) -> Path:
    t = root / "cap-task"
    (t / "environment" / "data").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "task.toml").write_text('version = "1.0"\n')
    (t / "instruction.md").write_text("read /srv/data/in.txt\n")
    (t / "environment" / "data" / "in.txt").write_text("payload\n")
    (t / "environment" / "Dockerfile").write_text(
        "FROM sandgym/terminal\nWORKDIR /srv\nCOPY --chmod=600 data/in.txt /srv/data/in.txt\n"
    )
    (t / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return t


class CapableSandbox(NullSandbox):
    """A null sandbox that claims the capabilities it is given and records every command."""

    def __init__(self, spec: SandboxSpec, *, name: str, builds: bool, real: bool) -> None:
        super().__init__(spec, NullBackend())
        self.backend_name = name
        self.builds_images = builds
        self.runs_real_commands = real
        self.commands: list[str] = []

    async def exec(self, cmd, timeout_s=60.0, cwd=None, env=None, user=None) -> ExecResult:  # type: ignore[no-untyped-def, override]
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        self.commands.append(command)
        if command.startswith(("mkdir ", "chmod ", "chown ")):
            return ExecResult(exit_code=0)  # what a real shell would do
        return await super().exec(cmd, timeout_s, cwd, env, user)


async def test_an_image_building_sandbox_gets_no_dockerfile_applied(tmp_path: Path) -> None:
    task = load_task_dir(_task_dir(tmp_path))
    sb = CapableSandbox(sandbox_spec_for(task), name="null", builds=True, real=True)
    await prepare_episode(task, sb, seed=0)
    assert "/srv/data/in.txt" not in sb.files  # the image already holds it
    assert sb.commands == []


async def test_a_sandbox_named_docker_that_builds_nothing_gets_it_applied(tmp_path: Path) -> None:
    task = load_task_dir(_task_dir(tmp_path))
    sb = CapableSandbox(sandbox_spec_for(task), name="docker", builds=False, real=True)
    await prepare_episode(task, sb, seed=0)
    assert sb.files["/srv/data/in.txt"] == b"payload\n"
    assert sb.commands == ["mkdir -p /srv", "chmod -R 600 /srv/data/in.txt"]


async def test_a_fake_shell_is_spared_mkdir_and_chmod(tmp_path: Path) -> None:
    task = load_task_dir(_task_dir(tmp_path))
    spec = sandbox_spec_for(task)
    sb = CapableSandbox(spec, name="local", builds=False, real=False)
    await prepare_episode(task, sb, seed=0)
    assert sb.files["/srv/data/in.txt"] == b"payload\n"
    assert sb.commands == []
    # the real null backend says so itself: its fake shell would fail `mkdir` otherwise
    plain = NullSandbox(spec, NullBackend())
    assert not plain.runs_real_commands and not plain.builds_images
    await prepare_episode(task, plain, seed=0)
    assert plain.files["/srv/data/in.txt"] == b"payload\n"


def test_each_backend_declares_what_the_task_layer_asks() -> None:
    # docker builds the task's Dockerfile itself; applying it again would redo its COPY steps
    from sandboxes.docker import DockerSandbox
    from sandboxes.e2b import E2BSandbox
    from sandboxes.local import LocalSandbox

    assert DockerSandbox.builds_images and DockerSandbox.runs_real_commands
    assert not LocalSandbox.builds_images and LocalSandbox.runs_real_commands
    assert not E2BSandbox.builds_images and E2BSandbox.runs_real_commands
    assert not NullSandbox.builds_images and not NullSandbox.runs_real_commands


def test_the_task_layer_asks_for_its_log_directories(tmp_path: Path) -> None:
    """`sandboxes` knows no task paths: the task's spec names the directories a backend whose
    template lacks them (e2b) makes before the first command."""
    from tasks.paths import AGENT_LOGS, VERIFIER_LOGS

    spec = sandbox_spec_for(load_task_dir(_task_dir(tmp_path)))
    assert spec.make_dirs == (VERIFIER_LOGS, AGENT_LOGS) == ("/logs/verifier", "/logs/agent")
    assert SandboxSpec().make_dirs == ()
