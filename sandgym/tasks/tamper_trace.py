"""The tamper report's second half: which of the agent's changed files the verifier opened.

`tamper_report` (sandgym.tasks.tamper) classes the agent's changes by where they are, before the
verifier runs. `traced_verifier` then follows the verifier's own run: every file the agent
created or modified (its change set: the engine's diff on docker, the host's listing on local,
plus the engine-mounted `/etc/hosts` and `/etc/resolv.conf` by fingerprint) gets an inotify watch
from the host (`sandgym.sandboxes.open_trace`) for the time of the run, and each one the run
opened, executed, imported or loaded is added to the report as `verifier_opened`, whatever its
path: a program in a PATH directory of the image's own, an interpreter in a tool store, a git
hook, a certificate, `/etc/hosts`. Files the verifier is meant to read are not watched: the
task's declared outputs (`metadata.outputs`; without them, everything under the working
directory), what the task declares expected (`metadata.expected_changes`), the agent's logs and
artifacts, and paths the report already names.

Where the run cannot be traced (no inotify, a backend whose files the host cannot reach, the
`pristine` mode whose verifier runs apart from the agent's files), `fallback_report` classes the
changes by `FALLBACK_CATEGORIES` and the sandbox's own PATH (the image's `Env` on docker), and
the report's `trace.method` says `paths`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from sandgym.sandboxes import Sandbox
from sandgym.sandboxes.open_trace import (
    OpenTrace,
    TraceResult,
    TraceUnavailableError,
    resolve_in_root,
)
from sandgym.tasks.errors import VerifierError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.paths import AGENT_LOGS, ARTIFACTS_DIR
from sandgym.tasks.tamper import (
    ENGINE_MOUNTED_FILES,
    MAX_LISTED,
    TamperedPath,
    TamperReport,
    TraceSummary,
    _under,
    classify_fallback,
    declared_outputs,
    expected_changes,
    path_matches,
)

R = TypeVar("R")

#: set False to turn tracing off (the report then says `paths`); tests flip it
TRACE_ENABLED = True


async def sandbox_host_root(sandbox: Sandbox) -> tuple[str | None, str]:
    """The host directory that is the sandbox's `/` (local: its tree; docker: the container's
    init's `/proc/<pid>/root`), or None and why not."""
    fs = getattr(sandbox, "fs", None)
    if isinstance(fs, os.PathLike):  # local: the sandbox's tree is a host directory
        return os.fspath(fs), ""
    container = getattr(sandbox, "container", None)
    if container is not None and hasattr(container, "api"):  # docker
        info = await asyncio.to_thread(container.api.inspect_container, container.id)
        pid = int((info.get("State") or {}).get("Pid") or 0)
        root = f"/proc/{pid}/root"
        if pid <= 0 or not os.access(root, os.R_OK | os.X_OK):
            return None, f"the container's root is not reachable from the host ({root})"
        return root, ""
    return None, f"the {type(sandbox).__name__}'s files are not on this host"


async def sandbox_search_path(sandbox: Sandbox) -> tuple[str, ...]:
    """The PATH the sandbox's programs run with (docker: the container's `Env`, the image's own
    laid under the task's; local: the sandbox's environment)."""
    value = ""
    container = getattr(sandbox, "container", None)
    if container is not None and hasattr(container, "api"):
        info = await asyncio.to_thread(container.api.inspect_container, container.id)
        for item in (info.get("Config") or {}).get("Env") or []:
            if str(item).startswith("PATH="):
                value = str(item)[5:]
    else:
        env = getattr(sandbox, "env", None)
        if isinstance(env, dict):
            value = str(env.get("PATH") or "")
    return tuple(posixpath.normpath(d) for d in value.split(":") if d.startswith("/"))


def _excluded(task: TaskSpec, path: str, workdir: str) -> bool:
    """A path the verifier is meant to read (see the module docstring)."""
    if _under(path, AGENT_LOGS) or _under(path, ARTIFACTS_DIR):
        return True
    outputs = declared_outputs(task) or (workdir,)
    if any(_under(path, o) for o in outputs):
        return True
    return any(path_matches(p, path) for p in expected_changes(task))


def _add(report: TamperReport, found: list[TamperedPath], summary: TraceSummary) -> TamperReport:
    """`report` with `found` added (sorted, listed up to MAX_LISTED) and `summary` as its trace."""
    known = {p.path for p in report.paths}
    new = [t for t in found if t.path not in known]
    out = report.model_copy(deep=True)
    out._changes = report._changes
    paths = sorted([*out.paths, *new], key=lambda t: t.path)
    out.paths = paths[:MAX_LISTED]
    out.count = report.count + len(new)
    out.tampered = out.count > 0
    out.trace = summary
    return out


async def fallback_report(
    task: TaskSpec, sandbox: Sandbox, report: TamperReport, workdir: str, note: str
) -> TamperReport:
    """The report with the agent's changes that `FALLBACK_CATEGORIES` or the sandbox's PATH name
    added (no trace of the verifier: see the module docstring)."""
    if not report.checked:
        return report
    try:
        search = await sandbox_search_path(sandbox)
    except Exception:  # the report stands on the fixed lists alone then
        search = ()
    found = []
    for path, change in sorted(report._changes.items()):
        if _excluded(task, path, workdir):
            continue
        category = classify_fallback(path, search)
        if category is not None:
            found.append(TamperedPath(path=path, change=change, category=category))
    summary = TraceSummary(method="paths", search_path=list(search), note=note)
    return _add(report, found, summary)


class VerifierTrace:
    """What `traced_verifier` yields: after the block, `report(...)` adds what the run opened."""

    def __init__(self) -> None:
        self.trace: OpenTrace | None = None
        self.result: TraceResult | None = None
        self.note = ""

    async def report(
        self, task: TaskSpec, sandbox: Sandbox, report: TamperReport, workdir: str
    ) -> TamperReport:
        if self.result is None:
            return await fallback_report(task, sandbox, report, workdir, self.note)
        res = self.result
        changes = report._changes
        opened = list(changes) if res.overflow else res.opened
        found = [
            TamperedPath(path=p, change=changes[p], category="verifier_opened")
            for p in opened
            if p in changes
        ]
        summary = TraceSummary(
            method="inotify",
            watched=res.watched,
            opened=len(res.opened),
            unwatched=len(res.unwatched),
            overflow=res.overflow,
        )
        out = _add(report, found, summary)
        if res.unwatched:  # what could not be watched is classed by paths
            rest = {p: changes[p] for p in res.unwatched if p in changes}
            part = report.model_copy()
            part._changes = rest
            extra = await fallback_report(task, sandbox, part, workdir, "")
            known = {p.path for p in out.paths}
            more = [t for t in extra.paths if t.path not in known]
            out = _add(out, more, summary)
        return out


def _candidates(task: TaskSpec, report: TamperReport, workdir: str) -> list[str]:
    """The agent's changed paths to watch (see the module docstring)."""
    named = {p.path for p in report.paths}
    return [
        path
        for path, change in sorted(report._changes.items())
        if change != "deleted" and path not in named and not _excluded(task, path, workdir)
    ]


def _watch_list(paths: list[str], root: str) -> dict[str, str]:
    """sandbox path -> host path of each of `paths` that is a file under `root` (links followed
    inside it)."""
    out: dict[str, str] = {}
    for path in paths:
        host = resolve_in_root(root, path)
        if host is not None and os.path.isfile(host):
            out[path] = host
    return out


def _layer_files(paths: list[str], layer: str) -> dict[str, str]:
    """sandbox path -> host path of each of `paths` that is a regular file in the image layer
    directory `layer` (links not followed: a layer is not a root)."""
    out: dict[str, str] = {}
    for path in paths:
        host = os.path.join(layer, path.lstrip("/"))
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(host).st_mode):
                out[path] = host
    return out


def _snapshot_layer(api: Any, cid: str) -> str | None:
    """(Thread) the host directory whose files the created container `cid` (a snapshot of the
    sandbox, `docker commit`) opens: overlay2's first lower directory below the init layer (its
    upper directory is empty until it writes); btrfs's own subvolume of the container (a
    snapshot of the image's: its files are inodes of their own, so the image layer's never fire),
    found through the engine's layer database. None for another driver or an unreadable root."""
    info = api.inspect_container(cid)
    driver = info.get("GraphDriver") or {}
    if driver.get("Name") == "btrfs":
        root = str(api.info().get("DockerRootDir") or "")
        mount_id = os.path.join(root, "image", "btrfs", "layerdb", "mounts", info["Id"], "mount-id")
        try:
            with open(mount_id) as f:
                subvolume = os.path.join(root, "btrfs", "subvolumes", f.read().strip())
        except OSError:
            return None
        return subvolume if root and os.path.isdir(subvolume) else None
    data = driver.get("Data") or {}
    for layer in str(data.get("LowerDir") or "").split(":"):
        if layer and not layer.rstrip("/").endswith("-init/diff"):
            return layer
    return None


@contextlib.asynccontextmanager
async def traced_verifier(
    task: TaskSpec, sandbox: Sandbox, report: TamperReport, workdir: str
) -> AsyncIterator[VerifierTrace]:
    """Watch the agent's changed files while the block runs the verifier (see the module
    docstring); the yielded `VerifierTrace.report` makes the final report."""
    vt = VerifierTrace()
    root: str | None = None
    if not TRACE_ENABLED:
        vt.note = "tracing is turned off"
    elif not report.checked:
        vt.note = "no change set"
    else:
        root, why = await sandbox_host_root(sandbox)
        vt.note = why
    private = getattr(sandbox, "_verifier", None)  # docker: the verifier's own container
    hooked = False
    if root is not None:
        paths = _candidates(task, report, workdir)
        try:
            if private is not None and hasattr(private, "on_created"):
                # the verifier runs in a container of a snapshot of the sandbox: its files are
                # the snapshot's layer, watched once that container is made, before it starts;
                # the engine-mounted files it shares with the sandbox are watched here
                mounted = [p for p in paths if p in ENGINE_MOUNTED_FILES]
                vt.trace = OpenTrace(await asyncio.to_thread(_watch_list, mounted, root))
                rest = [p for p in paths if p not in ENGINE_MOUNTED_FILES]
                trace, api = vt.trace, sandbox.container.api  # type: ignore[attr-defined]

                def on_created(cid: str) -> None:
                    try:  # never the verifier's failure: unwatched, classed by paths instead
                        layer = _snapshot_layer(api, cid)
                    except Exception:
                        layer = None
                    if layer is not None:
                        trace.watch(_layer_files(rest, layer))
                    else:
                        trace.watch({p: "" for p in rest})  # all unwatched: classed by paths

                private.on_created, hooked = on_created, True
            else:
                vt.trace = OpenTrace(await asyncio.to_thread(_watch_list, paths, root))
            await asyncio.to_thread(vt.trace.start)
        except TraceUnavailableError as exc:
            vt.trace, vt.note = None, f"inotify unavailable: {exc}"
    try:
        yield vt
    finally:
        if hooked and private is not None:
            private.on_created = None
        if vt.trace is not None:
            vt.result = await asyncio.to_thread(vt.trace.stop)


def trace_details(report: TamperReport) -> dict[str, Any]:
    """The trace's summary as a plain dict (for a verifier result's details)."""
    return report.trace.model_dump() if report.trace else {}


async def run_traced(
    task: TaskSpec,
    sandbox: Sandbox,
    report: TamperReport,
    workdir: str,
    run: Callable[[], Awaitable[R]],
) -> tuple[R, TamperReport]:
    """`run()` (the verifier, in the agent's sandbox) under `traced_verifier`; its result and the
    final report. A `VerifierError` it raises carries the final report's summary when tampered."""
    async with traced_verifier(task, sandbox, report, workdir) as vt:
        try:
            result = await run()
        except VerifierError as exc:
            error: VerifierError | None = exc
        else:
            error = None
    final = await vt.report(task, sandbox, report, workdir)
    if error is not None:
        if final.tampered:
            error.tamper = final.summary()
        raise error
    return result, final
