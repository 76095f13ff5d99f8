"""The task layer asks a sandbox what it can do (`Sandbox.capabilities`, read as `builds_images`,
`runs_real_commands`, `lists_changes`, `supports_private_exec`), never which backend it is: a sandbox of any name that builds images gets no Dockerfile applied, one
that does not gets its WORKDIR/COPY applied, and mkdir/chmod run only where commands are real."""

from __future__ import annotations

import shlex
from pathlib import Path

from sandgym.sandboxes import ExecResult, SandboxSpec
from sandgym.sandboxes.base import SandboxCapabilities
from sandgym.sandboxes.null import NullBackend, NullSandbox
from sandgym.tasks import load_task_dir, prepare_episode, sandbox_spec_for


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
        self.capabilities = SandboxCapabilities(builds_images=builds, runs_real_commands=real)
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
    from sandgym.sandboxes.docker import DockerSandbox
    from sandgym.sandboxes.e2b import E2BSandbox
    from sandgym.sandboxes.local import LocalSandbox

    def caps(
        builds: bool, real: bool, changes: bool, private: bool, users: bool = True
    ) -> SandboxCapabilities:
        return SandboxCapabilities(
            builds_images=builds,
            runs_real_commands=real,
            lists_changes=changes,
            private_exec=private,
            other_users=users,
        )

    assert DockerSandbox.capabilities == caps(True, True, True, True)
    # a local sandbox has private exec once it runs under bwrap (set when it starts); its user
    # namespace maps root alone
    assert LocalSandbox.capabilities == caps(False, True, True, False, users=False)
    assert E2BSandbox.capabilities == caps(False, True, False, False)
    assert NullSandbox.capabilities == caps(False, False, False, False)


def test_the_former_flag_names_read_the_capabilities() -> None:
    sb = NullSandbox(SandboxSpec(), NullBackend())
    flags = ("builds_images", "runs_real_commands", "lists_changes", "supports_private_exec")
    assert [getattr(sb, f) for f in flags] == [False, False, False, False]
    sb.capabilities = SandboxCapabilities(
        builds_images=True, runs_real_commands=True, lists_changes=True, private_exec=True
    )
    assert [getattr(sb, f) for f in flags] == [True, True, True, True]


def test_the_task_layer_asks_for_its_log_directories(tmp_path: Path) -> None:
    """`sandboxes` knows no task paths: the task's spec names the directories a backend whose
    template lacks them (e2b) makes before the first command."""
    from sandgym.tasks.paths import AGENT_LOGS, VERIFIER_LOGS

    spec = sandbox_spec_for(load_task_dir(_task_dir(tmp_path)))
    assert spec.make_dirs == (VERIFIER_LOGS, AGENT_LOGS) == ("/logs/verifier", "/logs/agent")
    assert SandboxSpec().make_dirs == ()


async def test_a_local_sandbox_under_bwrap_has_private_exec(tmp_path: Path) -> None:
    """The local backend knows only once a sandbox runs (its own namespace init) that
    `exec_private` works: the instance's capabilities say so then."""
    from sandgym.sandboxes.local import LocalBackend

    backend = LocalBackend(root=tmp_path)
    sb = await backend.create(SandboxSpec())
    try:
        assert sb.supports_private_exec and sb.capabilities.private_exec
        assert not type(sb).capabilities.private_exec
        result = await sb.exec_private(["bash", "-c", "cat"], b"from stdin\n")
        assert (result.exit_code, result.stdout) == (0, "from stdin\n")
    finally:
        await sb.close()
        await backend.aclose()
