"""`sandgym bench compat_replication`: two `sandgym bench harbor_compat` documents of the same
task set, task by task, to show how far one run's verdicts hold when the set is run again.

Each document is read as written (its `datasets[].tasks[]` entries, the outcome each line's run
recorded); nothing is re-judged here. For every task in both documents the result has each
side's category, reason, action, rewards, duration, commit, concurrency and host load, and
whether the category is the same; the summary counts the tasks with the same category (and
with the same reason), lists those that changed (with each side's category), the tasks only one
side has, how many of each side's lines each commit checked, and each side's headline figures
as its own document states them (absolute and reachable).

    sandgym bench compat_replication --first lab/bench/results/harbor_compat.json \\
        --second lab/bench/results/harbor_compat_tb2_replication.json \\
        --dataset terminal-bench-2.0 --out lab/bench/results/compat_replication_tb2.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lab.bench.report import save_json

#: what each side's row keeps of a task's line
_LINE_FIELDS = (
    "oracle_reward",
    "noop_reward",
    "duration_s",
    "code_commit",
    "checked_at",
    "concurrency",
    "host_load",
    "base_image_local",
)

#: the headline figures of a dataset's own summary, as its document states them
_HEADLINE = ("table", "absolute_clean")
_REACHABLE = ("oracle_one_noop_zero", "clean")


class ReplicationError(ValueError):
    """A document that is not a harbor_compat document, or lacks the dataset asked for."""


def dataset_of(doc: dict[str, Any], name: str, label: str) -> dict[str, Any]:
    """The dataset `name` of a harbor_compat document (`label` names the document in errors)."""
    if doc.get("bench") != "harbor_compat":
        raise ReplicationError(
            f"{label}: expected a `sandgym bench harbor_compat` document, found bench="
            f"{doc.get('bench')!r}"
        )
    found = [d for d in doc.get("datasets") or [] if d.get("name") == name]
    if len(found) != 1:
        names = [d.get("name") for d in doc.get("datasets") or []]
        raise ReplicationError(f"{label}: expected one dataset named {name!r}, found {names}")
    return found[0]


def _side(line: dict[str, Any]) -> dict[str, Any]:
    outcome = line.get("outcome") or {}
    row = {k: outcome.get(k) for k in ("category", "reason", "action")}
    row.update({k: line.get(k) for k in _LINE_FIELDS})
    return row


def _headline(dataset: dict[str, Any]) -> dict[str, Any]:
    summary = dataset.get("summary") or {}
    reachable = summary.get("reachable") or {}
    head = {k: summary.get(k) for k in _HEADLINE}
    head["reachable"] = {
        "tasks": reachable.get("tasks"),
        **{k: reachable.get(k) for k in _REACHABLE},
    }
    return head


def _by_commit(lines: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many of a dataset's lines each commit checked (`code_commit`)."""
    counts: dict[str, int] = {}
    for line in lines:
        key = line.get("code_commit") or "not recorded"
        counts[key] = counts.get(key, 0) + 1
    return counts


def compare(first: dict[str, Any], second: dict[str, Any], name: str) -> dict[str, Any]:
    """The per-task rows and the summary of dataset `name` in two harbor_compat documents."""
    a = {t["task_id"]: t for t in dataset_of(first, name, "first")["tasks"]}
    b = {t["task_id"]: t for t in dataset_of(second, name, "second")["tasks"]}
    rows = []
    for task_id in sorted(a.keys() & b.keys()):
        one, two = _side(a[task_id]), _side(b[task_id])
        rows.append(
            {
                "task_id": task_id,
                "same_category": one["category"] == two["category"],
                "first": one,
                "second": two,
            }
        )
    changed = [
        {
            "task_id": r["task_id"],
            "first": r["first"]["category"],
            "second": r["second"]["category"],
        }
        for r in rows
        if not r["same_category"]
    ]
    same_reason = sum(r["first"]["reason"] == r["second"]["reason"] for r in rows)
    transitions: dict[str, int] = {}
    for c in changed:
        key = f"{c['first']} -> {c['second']}"
        transitions[key] = transitions.get(key, 0) + 1
    return {
        "dataset": name,
        "summary": {
            "compared": len(rows),
            "same_category": {
                "count": len(rows) - len(changed),
                "of": len(rows),
                "share": round((len(rows) - len(changed)) / len(rows), 3) if rows else None,
            },
            "same_reason": {"count": same_reason, "of": len(rows)},
            "changed": changed,
            "transitions": transitions,
            "only_in_first": sorted(a.keys() - b.keys()),
            "only_in_second": sorted(b.keys() - a.keys()),
            "lines_by_commit": {
                "first": _by_commit(a.values()),
                "second": _by_commit(b.values()),
            },
            "first": _headline(dataset_of(first, name, "first")),
            "second": _headline(dataset_of(second, name, "second")),
        },
        "tasks": rows,
    }


def _documented(doc: dict[str, Any]) -> dict[str, Any]:
    prov = doc.get("provenance") or {}
    return {
        "git_commit": prov.get("git_commit"),
        "started_at": prov.get("started_at"),
        "written_at": prov.get("written_at"),
        "concurrency": doc.get("concurrency"),
        "complete": doc.get("complete"),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--first", type=Path, required=True, help="a harbor_compat document")
    parser.add_argument("--second", type=Path, required=True, help="another one, same set")
    parser.add_argument("--dataset", required=True, help="the dataset name both documents hold")
    parser.add_argument("--out", type=Path, default=None, help="write the result here")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")


def run(args: argparse.Namespace) -> int:
    docs = []
    for path in (args.first, args.second):
        try:
            docs.append(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"compat_replication: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    try:
        result = compare(docs[0], docs[1], args.dataset)
    except ReplicationError as exc:
        print(f"compat_replication: {exc}", file=sys.stderr)
        return 2
    doc = {
        "bench": "compat_replication",
        "first": {"path": str(args.first), **_documented(docs[0])},
        "second": {"path": str(args.second), **_documented(docs[1])},
        **result,
    }
    text = save_json(doc, args.out, indent=1)
    print(text if args.json else json.dumps(doc["summary"], indent=1))
    return 0
