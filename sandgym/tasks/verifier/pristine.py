"""`verify = "pristine"`: the task's own tests run in a fresh sandbox of the task's own image,
set up for the episode's seed as the agent's was, into which only the agent's outputs are copied.
Nothing else the agent changed is there: no program, library, cache or startup file of its, and
no process it left running.

What the outputs are (`output_plan`): the task's declared `metadata.outputs`, copied whole; else
derived from the task's own layout, as Harbor and Terminal-Bench tasks mean it: the working
directory is the agent's, the files the task ships there (its image's, its set-up's) are the
task's inputs. So the derived outputs are what the agent *created* under the working directory
(the backend's change set, less what the set-up had already changed: the episode's baseline);
a shipped file the agent rewrote stays the fresh sandbox's own (listed as `kept_inputs`), which
is what stops an agent that rewrites the input its tests derive the expected answer from. A task
whose answer is an edit of a shipped file declares that file in `outputs`. Where the backend
lists no changes (e2b) nothing can be derived: a task without `outputs` is refused there at
reset (`pristine_needs_outputs`), and `sandgym tasks check` says so.

The copy is bounded (`MAX_COPY_BYTES`, `MAX_COPY_FILES`, counted on the host copy before anything
is uploaded): past either, or when the copy itself fails, the step is a `VerifierError` (cause
`outputs`), which the trainer scores 0 and never masks: the agent decides what its outputs hold.
A lost sandbox (`SandboxLostError`) stays the infrastructure's.

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
from sandgym.sandboxes.companions import close_counted
from sandgym.sandboxes.errors import ChangesUnsupportedError, SandboxError, SandboxLostError
from sandgym.sandboxes.lifetime import OwnLifetimes
from sandgym.sandboxes.spec import PathChanges
from sandgym.tasks.commands import run_checked
from sandgym.tasks.episode_models import EpisodeSetup
from sandgym.tasks.episode_start import prepare_episode
from sandgym.tasks.errors import TaskUnsupportedError, VerifierError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from sandgym.tasks.tamper import classify, declared_outputs
from sandgym.tasks.verifier.choice import pristine_needs_outputs, pristine_unsupported

#: the most bytes (sum of file sizes) and files one pristine copy carries, all outputs together
MAX_COPY_BYTES = 512 * 1024 * 1024
MAX_COPY_FILES = 50_000


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class OutputPlan:
    """What a pristine copy carries: `roots` copied whole; deletions under `deletion_roots`
    carried; `kept_inputs`: files the task shipped under the working directory that the agent
    rewrote, not copied (the fresh sandbox keeps its own); `derived`: no outputs declared."""

    roots: tuple[str, ...]
    deletion_roots: tuple[str, ...]
    kept_inputs: tuple[str, ...] = ()
    derived: bool = False


def output_plan(
    task: TaskSpec, workdir: str, changes: PathChanges | None, baseline: Mapping[str, str]
) -> OutputPlan:
    """The task's declared outputs; else the paths the agent created under `workdir` (topmost
    only), from the backend's `changes` less the set-up's `baseline` (module docstring).
    `changes` None (no change set) without declared outputs: a TaskUnsupportedError."""
    declared = declared_outputs(task)
    if declared:
        return OutputPlan(roots=declared, deletion_roots=declared)
    if changes is None:
        raise TaskUnsupportedError(
            f"task {task.id} cannot be verified pristine: " + str(pristine_needs_outputs(task))
        )
    top = workdir.rstrip("/") or "/"
    created = {
        p for p in changes.created if _under(p, top) and p != top and baseline.get(p) != "created"
    }

    def inside_another(p: str) -> bool:
        parent = posixpath.dirname(p)
        while _under(parent, top) and parent != top:
            if parent in created:
                return True
            parent = posixpath.dirname(parent)
        return False

    roots = tuple(sorted(p for p in created if not inside_another(p)))
    kept = tuple(sorted(p for p in changes.modified if _under(p, top) and p != top))
    return OutputPlan(roots=roots, deletion_roots=(top,), kept_inputs=kept, derived=True)


def _count(host: Path) -> tuple[int, int]:
    """(bytes, files) of a host tree: regular files by their size, links and the rest as 0."""
    if host.is_symlink() or host.is_file():
        return (host.lstat().st_size if host.is_file() and not host.is_symlink() else 0), 1
    size = files = 0
    for base, dirs, names in os.walk(host):
        files += len(names) + len(dirs)
        for n in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(base, n))
                size += st.st_size if not os.path.islink(os.path.join(base, n)) else 0
    return size, files


def _copy_error(task: TaskSpec, what: str, exc: BaseException) -> VerifierError:
    return VerifierError(
        f"task {task.id}: pristine copy of the agent's outputs failed {what}: "
        f"{type(exc).__name__}: {exc}",
        cause="outputs",
    )


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
    plan: OutputPlan | None = None
    copy_bytes: int = 0
    copy_files: int = 0


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
    max_bytes: int | None = None,
    max_files: int | None = None,
) -> AsyncIterator[PristineVerifier]:
    """A fresh sandbox of the task's own spec, prepared for the episode's seed, with the agent's
    outputs copied in (see the module docstring); closed on exit, even when cancelled.
    `max_bytes`/`max_files`: the copy's bound (default `MAX_COPY_BYTES`, `MAX_COPY_FILES`)."""
    max_bytes = MAX_COPY_BYTES if max_bytes is None else max_bytes
    max_files = MAX_COPY_FILES if max_files is None else max_files
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
            baseline = setup.change_baseline.kinds if setup.change_baseline is not None else {}
            if changes is None and not declared_outputs(task):
                with contextlib.suppress(ChangesUnsupportedError):
                    changes = await sandbox.changed_paths()
            plan = output_plan(task, setup.workdir, changes, baseline)
            copied: list[str] = []
            dropped: list[str] = []
            total_bytes = total_files = 0
            with tempfile.TemporaryDirectory(prefix="sandgym-pristine-") as scratch:
                for i, root in enumerate(plan.roots):
                    host = Path(scratch) / str(i) / (posixpath.basename(root.rstrip("/")) or "root")
                    try:
                        await sandbox.download(root, host)
                    except (SandboxFileNotFoundError, FileNotFoundError):
                        continue
                    except SandboxLostError:
                        raise
                    except (SandboxError, OSError) as exc:
                        raise _copy_error(task, f"reading {root}", exc) from exc
                    dropped += await asyncio.to_thread(_keep_outputs, host, root, setup.workdir)
                    size, files = await asyncio.to_thread(_count, host)
                    total_bytes, total_files = total_bytes + size, total_files + files
                    if total_bytes > max_bytes or total_files > max_files:
                        raise VerifierError(
                            f"task {task.id}: the agent's outputs are too large to copy into "
                            f"a pristine verifier: expected at most {max_bytes} bytes in "
                            f"{max_files} files, found {total_bytes} bytes in {total_files} "
                            f"files (up to {root})",
                            cause="outputs",
                        )
                    if host.exists():
                        try:
                            await fresh.upload(host, root)
                        except SandboxLostError:
                            raise
                        except (SandboxError, OSError) as exc:
                            raise _copy_error(task, f"writing {root}", exc) from exc
                        copied.append(root)
            deleted = await _deleted_under(sandbox, setup, plan.deletion_roots, changes)
            if deleted:
                await run_checked(
                    fresh,
                    "rm -rf -- " + " ".join(shlex.quote(p) for p in deleted),
                    "deleting what the agent deleted under its outputs",
                    timeout_s=60,
                )
            # the verifier reads the episode's own instance (its secret), not a regenerated one
            vsetup = fsetup.model_copy(update={"secret": setup.secret, "workdir": setup.workdir})
            yield PristineVerifier(
                fresh, vsetup, copied, dropped, deleted, plan, total_bytes, total_files
            )
        finally:
            await asyncio.shield(close_counted(fresh, beside=sandbox, kind="pristine"))
