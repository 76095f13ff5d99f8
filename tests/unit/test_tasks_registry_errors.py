"""A malformed task in a user's dataset is skipped and reported, not fatal (unless strict)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandgym.tasks import TaskRegistry
from sandgym.tasks.errors import TaskLoadError, UnknownTaskError
from sandgym.tasks.registry import CATALOG_DIR


def _dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    root.mkdir()
    shutil.copytree(CATALOG_DIR / "hello-file", root / "good-task")
    broken = root / "broken-task"
    shutil.copytree(CATALOG_DIR / "hello-file", broken)
    (broken / "instruction.md").unlink()
    return root


def test_broken_task_is_skipped_and_named(tmp_path: Path) -> None:
    reg = TaskRegistry([_dataset(tmp_path)], include_builtin=False)
    assert reg.ids() == ["good-task"]
    assert any("instruction.md" in m for m in reg.errors.values())
    with pytest.raises(UnknownTaskError, match="failed to load.*instruction.md"):
        reg.get("broken-task")


def test_strict_registry_raises(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="instruction.md"):
        TaskRegistry([_dataset(tmp_path)], include_builtin=False, strict=True)
