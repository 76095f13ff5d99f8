"""Harbor's `environment_mode = "separate"`: the tests run in a sandbox of their own, made from
the verifier's environment (`verifier_sandbox_spec`), holding a copy of what the agent left
(its working directory, `/logs/artifacts` and the task's declared artifacts, as plain files).
`separate_verifier_sandbox` makes that sandbox ready; `sandgym.tasks.verifier.run` runs the tests in it.
The agent's sandbox is never the verifier's."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandgym.sandboxes import Sandbox, SandboxBackend, SandboxFileNotFoundError, SandboxSpec
from sandgym.sandboxes.companions import close_counted
from sandgym.sandboxes.lifetime import OwnLifetimes
from sandgym.sandboxes.network import NetworkPolicy, clamp
from sandgym.tasks.dockerfile import apply_dockerfile
from sandgym.tasks.episode_models import EpisodeSetup
from sandgym.tasks.errors import TaskUnsupportedError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.paths import ARTIFACTS_DIR
from sandgym.tasks.sandbox_spec import sandbox_spec_for


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
    if workdir is not None:  # the agent's, named: not the verifier image's own (own_workdir)
        update["workdir"] = workdir
        update["own_workdir"] = True
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


@dataclass(frozen=True)
class SeparateVerifier:
    """The verifier's own sandbox, ready: the task and setup as the verifier sees them, and
    the artifact paths copied in from the agent's sandbox."""

    task: TaskSpec
    sandbox: Sandbox
    setup: EpisodeSetup
    artifacts: list[str]


@contextlib.asynccontextmanager
async def separate_verifier_sandbox(
    task: TaskSpec,
    sandbox: Sandbox,
    setup: EpisodeSetup,
    backend: SandboxBackend | None,
    image_map: Mapping[str, str] | None,
) -> AsyncIterator[SeparateVerifier]:
    """The verifier's own sandbox, made and filled (`SeparateVerifier`); closed on exit, even
    when cancelled."""
    if backend is None:
        raise TaskUnsupportedError(
            f"task {task.id}: a separate verifier needs a backend to create its sandbox; "
            "this caller passed none"
        )
    spec = verifier_sandbox_spec(task, image_map, setup.network_ceiling, setup.workdir)
    backend.check_network(spec)
    # Its own hard lifetime (sandgym.sandboxes.lifetime): one verifier run plus the grace, moved on
    # while this process lives; it ends itself if the process is killed.
    async with OwnLifetimes() as lifetimes:
        vsb = await lifetimes.create(backend, spec, task.timeouts.verifier_timeout_s)
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
                await apply_dockerfile(vtask, vsb, warnings)
            with tempfile.TemporaryDirectory(prefix="sandgym-artifacts-") as scratch:
                copied = await _copy_artifacts(task, sandbox, vsb, setup.workdir, Path(scratch))
            vsetup = setup.model_copy(update={"network": None, "desktop": None})
            yield SeparateVerifier(vtask, vsb, vsetup, copied)
        finally:
            await asyncio.shield(close_counted(vsb, beside=sandbox, kind="separate_verifier"))
