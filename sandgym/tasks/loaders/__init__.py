"""Loaders: read a task directory (or a dataset of many) into `TaskSpec`s.

`load_task_dir(path)` detects the format: Harbor (`task.toml`), SETA (`task.yaml` +
`weights.json`), Terminal-Bench v1 (`task.yaml`), or one LLM-in-Sandbox instance
(`instance.json`). `load_dataset(path)` loads a folder of task directories and `*.jsonl`
LLM-in-Sandbox files (or one such file). Loading parses data only and never executes code;
a symlink that leaves the task directory is refused.
"""

from __future__ import annotations

from pathlib import Path

from sandgym.tasks.errors import TaskLoadError
from sandgym.tasks.loaders.common import check_no_escaping_symlinks
from sandgym.tasks.loaders.harbor import is_harbor_dir, load_harbor_dir
from sandgym.tasks.loaders.lis import load_lis_dir, load_lis_jsonl
from sandgym.tasks.loaders.tbench import is_seta_dir, is_tbench_dir, load_tbench_dir
from sandgym.tasks.models import TaskSpec

__all__ = ["detect_format", "is_task_dir", "load_dataset", "load_task_dir"]


def detect_format(path: Path) -> str | None:
    """'harbor', 'seta', 'tbench', 'lis', or None when `path` is no task directory."""
    if is_harbor_dir(path):
        return "harbor"
    if is_seta_dir(path):
        return "seta"
    if is_tbench_dir(path):
        return "tbench"
    if (path / "instance.json").is_file():
        return "lis"
    return None


def is_task_dir(path: Path) -> bool:
    return path.is_dir() and detect_format(path) is not None


def load_task_dir(path: Path | str) -> TaskSpec:
    """Load one task directory, whatever its format."""
    path = Path(path).absolute()
    if not path.is_dir():
        raise TaskLoadError(f"expected a task directory, found no directory at {path}")
    fmt = detect_format(path)
    if fmt is None:
        raise TaskLoadError(
            f"{path} is not a task directory: expected task.toml (Harbor), task.yaml "
            "(Terminal-Bench/SETA) or instance.json (LLM-in-Sandbox)"
        )
    check_no_escaping_symlinks(path)
    if fmt == "harbor":
        return load_harbor_dir(path)
    if fmt in ("seta", "tbench"):
        return load_tbench_dir(path)
    return load_lis_dir(path)


def load_dataset(path: Path | str, errors: dict[str, str] | None = None) -> list[TaskSpec]:
    """Load every task below `path`: itself if it is a task dir or a JSONL file, else each
    child task directory and `*.jsonl` file (sorted by name). Ids must be unique.

    With an `errors` dict, a child that fails to load is recorded there (path -> message) and
    skipped, so one malformed task in a large dataset does not hide all the others; without
    it, the first failure raises."""
    path = Path(path).absolute()
    if path.is_file():
        if path.suffix != ".jsonl":
            raise TaskLoadError(f"expected a directory or a .jsonl file, found {path}")
        return load_lis_jsonl(path)
    if is_task_dir(path):
        return [load_task_dir(path)]
    if not path.is_dir():
        raise TaskLoadError(f"expected a dataset directory, found nothing at {path}")
    tasks: list[TaskSpec] = []
    for child in sorted(path.iterdir()):
        if child.name.startswith("."):
            continue
        try:
            if child.is_dir() and is_task_dir(child):
                tasks.append(load_task_dir(child))
            elif child.is_file() and child.suffix == ".jsonl":
                tasks.extend(load_lis_jsonl(child))
        except TaskLoadError as exc:
            if errors is None:
                raise
            errors[str(child)] = str(exc)
    if not tasks and not errors:
        raise TaskLoadError(f"{path}: no task directories or .jsonl files found")
    seen: dict[str, Path | None] = {}
    for t in tasks:
        if t.id in seen:
            raise TaskLoadError(f"{path}: duplicate task id {t.id!r}")
        seen[t.id] = t.source_dir
    return tasks
