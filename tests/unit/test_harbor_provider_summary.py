"""The summary of a `bench harbor_provider` document: rewards agree only when every task ran on
both sides alike, the repeated figures split into work and the rest, the break-even work, and
each task set on its own."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lab.bench.harbor_provider import resummarize
from lab.bench.harbor_provider_summary import summarize


def _trial(
    task: str, i: int, reward: float, trial: float, start: float, agent: float, verifier: float
) -> dict[str, Any]:
    return {
        "task": task,
        "trial": f"{task}__{i}",
        "reward": reward,
        "trial_s": trial,
        "environment_start_s": start,
        "agent_s": agent,
        "verifier_s": verifier,
    }


def _run(part: str, env: str, trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {"part": part, "environment": env, "agent": "oracle", "trials": trials}


def _doc(sg_trial: float = 10.0, dk_reward: float = 1.0) -> dict[str, Any]:
    # catalog task "a": work 4 s (agent 1 + verifier 3); TB2 task "b": work 20 s
    sg = [_trial("a", i, 1.0, 5.0, 0.2, 1.0, 3.0) for i in range(4)] + [
        _trial("b", i, 1.0, sg_trial + 11.0, 0.2, 5.0, 15.0) for i in range(4)
    ]
    dk = [_trial("a", i, 1.0, 18.0, 2.0, 1.0, 3.0) for i in range(4)] + [
        _trial("b", i, dk_reward, 34.0, 2.0, 5.0, 15.0) for i in range(4)
    ]
    return {
        "config": {
            "tasks": ["a", "b"],
            "catalog_tasks": ["a"],
            "tb2": {"dataset": "terminal-bench-2.0", "tasks": [{"task": "b"}]},
        },
        "runs": [
            _run("cold", "docker", [dict(t) for t in dk if t["trial"].endswith("__0")]),
            _run("cold", "sandgym", [dict(t) for t in sg if t["trial"].endswith("__0")]),
            _run("repeated", "docker", dk),
            _run("repeated", "sandgym", sg),
        ],
        "kill": [],
    }


def test_rest_work_and_break_even() -> None:
    summary, targets = summarize(_doc())
    rep = summary["repeated"]
    # sandgym: rest 1 s (5-4) on a, 1 s (21-20) on b; docker: rest 14 s on both
    assert rep["sandgym"]["median_rest_s"] == 1.0
    assert rep["docker"]["median_rest_s"] == 14.0
    assert rep["break_even_work_s"] == 12.0  # 14 - 2 * 1
    assert rep["sandgym"]["median_work_s"] == 12.0  # median of 4 x 4 s and 4 x 20 s
    assert rep["trial_ratio"] == round(13.0 / 26.0, 3)


def test_each_set_on_its_own() -> None:
    summary, targets = summarize(_doc())
    by_set = summary["by_set"]
    assert by_set["catalog"]["tasks"] == ["a"]
    assert by_set["catalog"]["repeated"]["trial_ratio"] == round(5.0 / 18.0, 3)
    assert by_set["terminal-bench-2.0"]["repeated"]["trial_ratio"] == round(21.0 / 34.0, 3)
    assert targets["by_set"]["catalog"]["trial_at_most_0.5x"] is True
    assert targets["by_set"]["terminal-bench-2.0"]["trial_at_most_0.5x"] is False


def test_rewards_differ_on_one_task_of_one_set() -> None:
    summary, targets = summarize(_doc(dk_reward=0.0))
    assert summary["repeated"]["identical_rewards"] is False
    assert targets["identical_oracle_rewards"] is False
    assert targets["by_set"]["catalog"]["identical_oracle_rewards"] is True
    assert targets["by_set"]["terminal-bench-2.0"]["identical_oracle_rewards"] is False


def test_a_task_run_on_one_side_only_is_not_identical() -> None:
    doc = _doc()
    for run in doc["runs"]:
        if run["environment"] == "sandgym":
            run["trials"] = [t for t in run["trials"] if t["task"] != "b"]
    summary, targets = summarize(doc)
    assert summary["cold"]["identical_rewards"] is False
    assert targets["by_set"]["terminal-bench-2.0"]["identical_oracle_rewards"] is False


def test_summarize_again_keeps_the_runs_own_provenance(tmp_path: Path) -> None:
    doc = _doc()
    run_prov = {
        "command": "sandgym bench harbor_provider -k 4",
        "git_commit": "abc",
        "git_dirty": False,
    }
    doc["provenance"] = run_prov
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(json.dumps(doc), encoding="utf-8")
    args = argparse.Namespace(summarize=src, out=out, json=False)
    assert resummarize(args) == 0
    again = json.loads(out.read_text(encoding="utf-8"))
    assert again["provenance"] == run_prov
    assert again["runs"] == doc["runs"]
    assert again["summary_by"]["from_file"] == str(src)
    assert again["summary"]["repeated"]["break_even_work_s"] == 12.0
