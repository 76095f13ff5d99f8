"""`verify = "pristine"`: the task's own tests run in a fresh sandbox of the task's own image,
set up for the episode's seed as the agent's was, into which only the agent's outputs are copied:
the task's declared outputs (`metadata.outputs`), or by default its working directory. Nothing
else the agent changed is there: no program, library, cache or startup file of its, and no
process it left running.

From the copy, links, special files and every path that `sandgym.tasks.tamper.classify` puts in a
category (a `conftest.py`, a `sitecustomize.py`, a `json.py` that a Python started in the working
directory would import) are dropped: the fresh sandbox keeps its own there. Files the agent
deleted under the outputs are deleted there too (where the backend lists changed paths).

What does not fit: a task whose tests need what the agent left running (a service) or changed
outside its outputs (a system package the task asks it to install): declare those paths as
`outputs`, or verify it `shared`. Desktop and multi-step tasks are refused (their state is more
than files). Cost: one more sandbox, the set-up again, and the copy (docs/verification.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import shlex
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sandgym.sandboxes import Sandbox, SandboxBackend, SandboxFileNotFoundError
from sandgym.sandboxes.errors import ChangesUnsupportedError
from sandgym.sandboxes.lifetime import OwnLifetimes
from sandgym.sandboxes.spec import PathChanges
from sandgym.tasks.commands import run_checked
from sandgym.tasks.episode_models import EpisodeSetup
from sandgym.tasks.episode_start import prepare_episode
from sandgym.tasks.errors import TaskUnsupportedError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from sandgym.tasks.tamper import classify, declared_outputs
from sandgym.tasks.verifier.choice import pristine_unsupported


def output_roots(task: TaskSpec, workdir: str) -> tuple[str, ...]:
    return declared_outputs(task) or (workdir,)


def _keep_outputs(root: Path, sandbox_path: str, workdir: str) -> list[str]:
    """Drop from a copied tree (host `root`, at `sandbox_path` in the sandbox) links, special
    files and every path a tamper category names; the sandbox paths dropped."""
    dropped: list[str] = []

    def visit(host: Path, path: str) -> None:
        if host.is_symlink() or not (host.is_file() or host.is_dir()):
            host.unlink()
            dropped.append(path)
            return
        if classify(path, "created", workdir) is not None:
            if host.is_dir():
                for sub in sorted(os.listdir(host)):
                    visit(host / sub, posixpath.join(path, sub))
                with contextlib.suppress(OSError):
                    host.rmdir()
            else:
                host.unlink()
            dropped.append(path)
            return
        if host.is_dir():
            for sub in sorted(os.listdir(host)):
                visit(host / sub, posixpath.join(path, sub))

    if root.exists() or root.is_symlink():
        visit(root, sandbox_path)
    return dropped


@dataclass(frozen=True)
class PristineVerifier:
    """The fresh sandbox, set up and holding the agent's outputs."""

    sandbox: Sandbox
    setup: EpisodeSetup
    copied: list[str]
    dropped: list[str]
    deleted: list[str]


async def _deleted_under(
    sandbox: Sandbox, setup: EpisodeSetup, roots: tuple[str, ...], changes: PathChanges | None
) -> list[str]:
    """Paths under `roots` the agent deleted (empty where the backend lists no changes)."""
    if changes is None:
        try:
            changes = await sandbox.changed_paths()
        except ChangesUnsupportedError:
            return []
    before = setup.change_baseline.kinds if setup.change_baseline is not None else {}
    return [
        p
        for p in changes.deleted
        if before.get(p) != "deleted"
        and any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)
    ]


@contextlib.asynccontextmanager
async def pristine_verifier_sandbox(
    task: TaskSpec,
    sandbox: Sandbox,
    setup: EpisodeSetup,
    backend: SandboxBackend | None,
    image_map: Mapping[str, str] | None,
    changes: PathChanges | None = None,
) -> AsyncIterator[PristineVerifier]:
    """A fresh sandbox of the task's own spec, prepared for the episode's seed, with the agent's
    outputs copied in (see the module docstring); closed on exit, even when cancelled."""
    why = pristine_unsupported(task)
    if why is not None:
        raise TaskUnsupportedError(f"task {task.id} cannot be verified pristine: {why}")
    if backend is None:
        raise TaskUnsupportedError(
            f"task {task.id}: a pristine verifier needs a backend to create its sandbox; "
            "this caller passed none"
        )
    spec = sandbox_spec_for(task, image_map, network_ceiling=setup.network_ceiling)
    # Its own hard lifetime (sandgym.sandboxes.lifetime): one verifier run plus the grace, moved on
    # while this process lives (so a long preparation is covered); it ends itself if the
    # process is killed.
    async with OwnLifetimes() as lifetimes:
        fresh = await lifetimes.create(backend, spec, task.timeouts.verifier_timeout_s)
        try:
            fsetup = await prepare_episode(
                task, fresh, setup.seed, network_ceiling=setup.network_ceiling, baseline=False
            )
            roots = output_roots(task, setup.workdir)
            copied: list[str] = []
            dropped: list[str] = []
            with tempfile.TemporaryDirectory(prefix="sandgym-pristine-") as scratch:
                for i, root in enumerate(roots):
                    host = Path(scratch) / str(i) / (posixpath.basename(root.rstrip("/")) or "root")
                    try:
                        await sandbox.download(root, host)
                    except (SandboxFileNotFoundError, FileNotFoundError):
                        continue
                    dropped += await asyncio.to_thread(_keep_outputs, host, root, setup.workdir)
                    if host.exists():
                        await fresh.upload(host, root)
                        copied.append(root)
            deleted = await _deleted_under(sandbox, setup, roots, changes)
            if deleted:
                await run_checked(
                    fresh,
                    "rm -rf -- " + " ".join(shlex.quote(p) for p in deleted),
                    "deleting what the agent deleted under its outputs",
                    timeout_s=60,
                )
            # the verifier reads the episode's own instance (its secret), not a regenerated one
            vsetup = fsetup.model_copy(update={"secret": setup.secret, "workdir": setup.workdir})
            yield PristineVerifier(fresh, vsetup, copied, dropped, deleted)
        finally:
            await asyncio.shield(fresh.close())
