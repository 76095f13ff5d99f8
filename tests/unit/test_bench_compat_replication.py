"""lab/bench/compat_replication: two harbor_compat documents of one set, task by task, as written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from lab.bench import compat_replication as rep


def line(task_id: str, category: str, reason: str, **more: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "outcome": {"category": category, "reason": reason, "action": "", "evidence": None},
        "oracle_reward": 1.0 if category == "clean" else 0.0,
        "noop_reward": 0.0,
        **more,
    }


def document(name: str, tasks: list[dict[str, Any]], clean: int) -> dict[str, Any]:
    return {
        "bench": "harbor_compat",
        "concurrency": 1,
        "datasets": [
            {"name": "other", "tasks": [line("zz", "failing", "oracle_below_one")]},
            {
                "name": name,
                "tasks": tasks,
                "summary": {
                    "table": {"clean": clean},
                    "absolute_clean": {"count": clean, "of": len(tasks)},
                    "reachable": {"tasks": len(tasks), "clean": {"count": clean}},
                },
            },
        ],
        "provenance": {"git_commit": "abc", "started_at": "t0", "written_at": "t1"},
    }


FIRST = document(
    "tb",
    [
        line("a", "clean", "clean", host_load={"busy": 0.4}, code_commit="c1"),
        line("b", "failing", "oracle_below_one", duration_s=176.0),
        line("c", "unreachable_host", "needs_unreachable_host"),
        line("gone", "clean", "clean"),
    ],
    clean=2,
)
SECOND = document(
    "tb",
    [
        line("a", "clean", "clean", host_load={"busy": 0.9}),
        line("b", "clean", "clean", duration_s=88.0),
        line("c", "unreachable_host", "needs_unreachable_host"),
        line("new", "failing", "oracle_below_one"),
    ],
    clean=2,
)


def test_counts_the_tasks_whose_category_held_and_names_those_that_changed() -> None:
    out = rep.compare(FIRST, SECOND, "tb")
    s = out["summary"]
    assert s["compared"] == 3
    assert s["same_category"] == {"count": 2, "of": 3, "share": 0.667}
    assert s["same_reason"] == {"count": 2, "of": 3}
    assert s["changed"] == [{"task_id": "b", "first": "failing", "second": "clean"}]
    assert s["transitions"] == {"failing -> clean": 1}
    assert s["only_in_first"] == ["gone"] and s["only_in_second"] == ["new"]
    assert s["lines_by_commit"] == {
        "first": {"c1": 1, "not recorded": 3},
        "second": {"not recorded": 4},
    }


def test_each_row_keeps_both_lines_as_recorded() -> None:
    rows = {r["task_id"]: r for r in rep.compare(FIRST, SECOND, "tb")["tasks"]}
    assert [*rows] == ["a", "b", "c"]
    assert rows["b"]["first"]["duration_s"] == 176.0 and rows["b"]["second"]["duration_s"] == 88.0
    assert rows["a"]["first"]["host_load"] == {"busy": 0.4}
    assert rows["a"]["second"]["host_load"] == {"busy": 0.9}
    assert rows["c"]["same_category"] is True and rows["b"]["same_category"] is False


def test_headlines_are_each_documents_own() -> None:
    s = rep.compare(FIRST, SECOND, "tb")["summary"]
    assert s["first"]["absolute_clean"] == {"count": 2, "of": 4}
    assert s["second"]["reachable"] == {
        "tasks": 4,
        "oracle_one_noop_zero": None,
        "clean": {"count": 2},
    }


def test_a_dataset_one_document_lacks_is_a_named_error() -> None:
    with pytest.raises(rep.ReplicationError, match="second: expected one dataset named 'tb'"):
        rep.compare(FIRST, {**SECOND, "datasets": []}, "tb")
    with pytest.raises(rep.ReplicationError, match="first: expected a `sandgym bench harbor_comp"):
        rep.compare({"bench": "pool"}, SECOND, "tb")


def test_run_writes_the_document_with_both_sources(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(FIRST))
    second.write_text(json.dumps(SECOND))
    out = tmp_path / "r.json"
    args = argparse.Namespace(first=first, second=second, dataset="tb", out=out, json=False)
    assert rep.run(args) == 0
    doc = json.loads(out.read_text())
    assert doc["bench"] == "compat_replication" and doc["dataset"] == "tb"
    assert doc["first"]["path"] == str(first) and doc["second"]["git_commit"] == "abc"
    assert doc["summary"]["same_category"]["count"] == 2
    args.dataset = "missing"
    assert rep.run(args) == 2
