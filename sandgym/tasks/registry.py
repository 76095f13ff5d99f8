"""`TaskRegistry`: every task id the server would serve, loaded once.

Ids: `builtin/<name>` for the catalog shipped in `sandgym/tasks/catalog/`, `<dirname>` for a task
directory given with `--tasks` (a dataset folder contributes each child; a JSONL file each
instance id).

Example:
    >>> reg = TaskRegistry()
    >>> reg.get("builtin/hello-file").id
    'builtin/hello-file'
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from pathlib import Path

from sandgym.tasks.errors import TaskLoadError, UnknownTaskError
from sandgym.tasks.loaders import load_dataset
from sandgym.tasks.models import TaskSpec

log = logging.getLogger(__name__)

CATALOG_DIR = Path(__file__).parent / "catalog"
BUILTIN_PREFIX = "builtin/"


def load_builtin() -> list[TaskSpec]:
    """The built-in catalog, with `builtin/` ids and source format `builtin`."""
    return [
        t.model_copy(update={"id": BUILTIN_PREFIX + t.id, "source_format": "builtin"})
        for t in load_dataset(CATALOG_DIR)
    ]


class TaskRegistry:
    """Task id -> `TaskSpec`, from the catalog and any number of task/dataset directories.

    The built-in catalog is always loaded strictly. In a user's dataset, a task directory that
    fails to load is skipped and recorded in `errors` (path -> message, also logged) unless
    `strict=True`, so one malformed task among thousands does not stop a server."""

    def __init__(
        self,
        dirs: Iterable[Path | str] = (),
        include_builtin: bool = True,
        strict: bool = False,
    ) -> None:
        self._tasks: dict[str, TaskSpec] = {}
        self.errors: dict[str, str] = {}
        if include_builtin:
            for t in load_builtin():
                self._add(t)
        for d in dirs:
            for t in load_dataset(Path(d), errors=None if strict else self.errors):
                self._add(t)
        for path, msg in self.errors.items():
            log.warning("task directory %s skipped: %s", path, msg)

    def _add(self, task: TaskSpec) -> None:
        if task.id in self._tasks:
            other = self._tasks[task.id].source_dir
            raise TaskLoadError(
                f"duplicate task id {task.id!r}: from {task.source_dir} and from {other}"
            )
        self._tasks[task.id] = task

    def get(self, task_id: str) -> TaskSpec:
        """The task registered as `task_id`; `UnknownTaskError` names close matches."""
        try:
            return self._tasks[task_id]
        except KeyError:
            close = difflib.get_close_matches(task_id, list(self._tasks), n=5, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            broken = [m for p, m in self.errors.items() if Path(p).name == task_id]
            if broken:
                hint = f"; its directory failed to load: {broken[0]}"
            raise UnknownTaskError(
                f"unknown task {task_id!r} ({len(self._tasks)} tasks registered){hint}"
            ) from None

    def ids(self) -> list[str]:
        return sorted(self._tasks)

    def list(self) -> list[TaskSpec]:
        return [self._tasks[i] for i in self.ids()]

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)
