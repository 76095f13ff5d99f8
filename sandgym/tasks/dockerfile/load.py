"""A task's Dockerfile, read and parsed: strictly (`task_dockerfile`, what a backend that builds
no image applies), or as far as the sandbox spec needs it (`spec_dockerfile`: WORKDIR and ENV,
also of a multi-stage build an image-building backend builds)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from sandgym.tasks.dockerfile.heredoc import rewrite_heredocs
from sandgym.tasks.dockerfile.parse import Dockerfile, parse_dockerfile
from sandgym.tasks.errors import TaskError, TaskLoadError, TaskUnsupportedError
from sandgym.tasks.models import TaskSpec


def task_dockerfile(task: TaskSpec) -> Dockerfile | None:
    """The parsed Dockerfile of a task, or None when it runs on a prebuilt image."""
    env = task.environment
    if env.build_context is None:
        return None
    path = env.build_context / env.dockerfile
    try:
        st = os.stat(path)
        return _parsed_dockerfile(str(path), st.st_mtime_ns, st.st_size)
    except OSError as exc:
        raise TaskLoadError(f"task {task.id}: cannot read {path}: {exc}") from None


@functools.lru_cache(maxsize=1024)
def _parsed_dockerfile(path: str, _mtime_ns: int, _size: int) -> Dockerfile:
    """Parsed once per file version (a reset asks every time; read + parse was ~3 % of a
    reset's CPU); the stat signature in the key notices an edited file."""
    text = Path(path).read_text(encoding="utf-8")
    # heredoc bodies are not instructions: parse them as the one-line RUNs the build runs
    return parse_dockerfile(rewrite_heredocs(text))


def spec_dockerfile(task: TaskSpec) -> Dockerfile | None:
    """The Dockerfile as far as the spec needs it (WORKDIR, ENV). A multi-stage build or a
    `COPY --from` cannot be applied without building, but an image-building backend builds it:
    then the last stage, without its `--from` copies, still gives the WORKDIR and ENV."""
    try:
        return task_dockerfile(task)
    except TaskUnsupportedError:
        env = task.environment
        assert env.build_context is not None
        lines = (env.build_context / env.dockerfile).read_text(encoding="utf-8").splitlines()
        froms = [i for i, ln in enumerate(lines) if ln.strip().upper().startswith("FROM ")]
        last = lines[froms[-1] :] if froms else lines
        kept = [ln for ln in last if "--from=" not in ln]
        try:
            return parse_dockerfile("\n".join(kept) + "\n")
        except TaskError:
            return None
