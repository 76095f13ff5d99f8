"""TaskRegistry ids, lookups with close matches, and the `sandgym tasks` CLI on the null backend."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from sandgym.cli import main
from sandgym.tasks import TaskLoadError, TaskRegistry, UnknownTaskError
from sandgym.tasks.cli import check_tasks, entry_ok
from sandgym.tasks.loaders import load_dataset

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


def test_builtin_catalog_shape() -> None:
    reg = TaskRegistry()
    tasks = reg.list()
    assert len(tasks) >= 30
    assert all(t.id.startswith("builtin/") for t in tasks)
    families = Counter(t.metadata["category"] for t in tasks)
    assert len(families) >= 6
    procedural_families = {t.metadata["category"] for t in tasks if t.procedural}
    assert len(procedural_families) >= 2
    for t in tasks:
        assert t.solution is not None and t.verifier.kind == "harbor", t.id
        assert t.environment.build_context is not None, t.id
        if t.metadata["category"] == "desktop":
            continue  # desktop tasks (sandgym.sandboxes.desktop) run on their own image
        text = (t.environment.build_context / "Dockerfile").read_text()
        assert text.startswith("FROM sandgym/terminal:latest\nWORKDIR /app\n"), t.id


def test_ids_and_lookup() -> None:
    reg = TaskRegistry([FIXTURES, FIXTURES / "lis" / "instances.jsonl"])
    assert "builtin/hello-file" in reg and "harbor-legacy" in reg and "lis-math-1" in reg
    assert reg.get("tbench-legacy").source_format == "tbench"
    assert reg.ids() == sorted(reg.ids())
    with pytest.raises(UnknownTaskError, match="builtin/hello-file") as info:
        reg.get("builtin/helo-file")
    assert isinstance(info.value, KeyError)
    only = TaskRegistry([FIXTURES / "seta-task"], include_builtin=False)
    assert only.ids() == ["seta-task"]


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "harbor-image", tmp_path / "a" / "harbor-image")
    with pytest.raises(TaskLoadError, match="duplicate task id"):
        TaskRegistry([FIXTURES, tmp_path / "a"], include_builtin=False)


def test_cli_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "list", "--tasks", str(FIXTURES), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ids = {t["task_id"] for t in doc["tasks"]}
    assert "builtin/sort-numbers" in ids and "seta-task" in ids
    sort = next(t for t in doc["tasks"] if t["task_id"] == "builtin/sort-numbers")
    assert sort["procedural"] is True and sort["family"] == "shell"


def test_cli_check_json_on_null(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["tasks", "check", str(FIXTURES / "lis" / "instances.jsonl"), "--backend", "null", "--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [e["task_id"] for e in doc["tasks"]] == ["lis-math-1", "lis-chem-2", "lis-doc-3"]
    assert all(
        e["oracle_reward"] == 1.0 and e["noop_reward"] == 0.0 and e["error"] is None
        for e in doc["tasks"]
    )


async def test_check_reports_errors_and_fails() -> None:
    # the null backend cannot run bash: every Harbor check must fail, reported per task
    checks = await check_tasks(load_dataset(FIXTURES / "harbor-image"), "null", {})
    assert len(checks) == 1 and not checks[0].ok and not entry_ok(checks[0].to_entry())
    assert checks[0].oracle_reward is None and "oracle:" in str(checks[0].error)


def test_cli_check_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["tasks", "check", str(FIXTURES / "harbor-image"), "--backend", "null", "--json"]) == 1
    )
    assert json.loads(capsys.readouterr().out)["tasks"][0]["error"]
