"""A task's Dockerfile applied to a running sandbox, on backends that build no image (local,
null, E2B without a template): WORKDIR creates its directory, COPY/ADD uploads build-context
files (with `--chmod`/`--chown`), RUN lines run only when the spec opts in (`allow_run`) and are
otherwise skipped with a warning. ENV and the final WORKDIR reach the sandbox through its spec
(`sandgym.tasks.sandbox_spec`). Which backends need this is asked of the sandbox (`builds_images`)."""

from __future__ import annotations

import logging
import os
import posixpath
import shlex
from pathlib import Path

from sandgym.sandboxes import Sandbox
from sandgym.tasks.commands import run_checked
from sandgym.tasks.dockerfile.load import task_dockerfile
from sandgym.tasks.dockerfile.parse import CopyStep, MkdirStep, RunStep
from sandgym.tasks.errors import TaskLoadError, TaskUnsupportedError
from sandgym.tasks.models import TaskSpec

log = logging.getLogger(__name__)


def context_sources(context: Path, pattern: str, line: int) -> list[Path]:
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


async def apply_copy(sandbox: Sandbox, context: Path, step: CopyStep) -> None:
    """One COPY/ADD of build-context files, with docker's rules for where each one lands."""
    sources = [s for pat in step.sources for s in context_sources(context, pat, step.line)]
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
            await run_checked(
                sandbox, f"chmod -R {shlex.quote(step.chmod)} {shlex.quote(target)}", "COPY --chmod"
            )
        if step.chown:
            await run_checked(
                sandbox, f"chown -R {shlex.quote(step.chown)} {shlex.quote(target)}", "COPY --chown"
            )


async def apply_dockerfile(task: TaskSpec, sandbox: Sandbox, warnings: list[str]) -> None:
    """Apply the task's Dockerfile to `sandbox` (see the module docstring); a skipped RUN line
    is logged and appended to `warnings`."""
    df = task_dockerfile(task)
    context = task.environment.build_context
    if df is None or context is None:
        return
    if df.unresolved:  # never a "" where the built image would have had a value
        more = (
            f" (and {len(df.unresolved) - 1} more such line(s))" if len(df.unresolved) > 1 else ""
        )
        raise TaskUnsupportedError(
            f"task {task.id}: {df.unresolved[0]}{more}; expected only variables sandgym can "
            "expand here, where no image is built: run it on a backend that builds images "
            "(docker)"
        )
    for step in df.steps:
        if isinstance(step, MkdirStep):
            # a fake shell (null) keeps files in a dict: directories need no creating there
            if sandbox.runs_real_commands:
                await run_checked(sandbox, f"mkdir -p {shlex.quote(step.path)}", "WORKDIR")
        elif isinstance(step, CopyStep):
            await apply_copy(sandbox, context, step)
        elif isinstance(step, RunStep):
            if sandbox.spec.allow_run:
                await run_checked(
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
