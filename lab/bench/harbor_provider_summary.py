"""The figures and targets of a `sandgym bench harbor_provider` document, computed from its raw
per-trial runs (`runs`, `kill`) and its `config`: nothing here measures anything.

Per part (cold, nop, repeated) the rewards of each side and whether they agree; for the
repeated trials the medians and the ratios the targets name (environment start, whole trial),
over all tasks and per task set (the catalog copies, the Terminal-Bench 2.0 copies). Each
repeated trial is also split into its work (Harbor's `agent_execution` plus `verifier` phases:
the task's own commands, the same on both sides) and the rest (`trial - work`: environment
start and stop, uploads, Harbor's own bookkeeping), so a reader sees where a ratio comes from.
With each side's median rest `o_sandgym` and `o_docker`, a trial of work `W` is at most 0.5x
exactly when `W + o_sandgym <= 0.5 (W + o_docker)`, that is `W <= o_docker - 2 o_sandgym`:
`break_even_work_s`.
"""

from __future__ import annotations

import statistics
from typing import Any

from lab.bench.harbor_runner import TrialRecord

#: the two sides, as the document names them
SANDGYM = "sandgym"
HARBOR_DOCKER = "docker"
PARTS = ("cold", "nop", "repeated")


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def by_task(trials: list[TrialRecord]) -> dict[str, list[TrialRecord]]:
    """Trials grouped by task, each task's in trial-name order."""
    out: dict[str, list[TrialRecord]] = {}
    for t in sorted(trials, key=lambda t: t.trial):
        out.setdefault(t.task, []).append(t)
    return out


def _work(t: TrialRecord) -> float | None:
    if t.agent_s is None or t.verifier_s is None:
        return None
    return t.agent_s + t.verifier_s


def repeated_figures(trials: list[TrialRecord]) -> dict[str, Any]:
    """Medians over a repeated run's trials: all of them, all but each task's first (the first
    may meet a cold pool or an unbuilt image), and the split into work and the rest."""
    later = [t for ts in by_task(trials).values() for t in ts[1:]]
    work = [(t.trial_s, w) for t in trials if (w := _work(t)) is not None and t.trial_s is not None]
    return {
        "trials": len(trials),
        "median_environment_start_s": _median(
            [t.environment_start_s for t in trials if t.environment_start_s is not None]
        ),
        "median_trial_s": _median([t.trial_s for t in trials if t.trial_s is not None]),
        "median_environment_start_s_after_first": _median(
            [t.environment_start_s for t in later if t.environment_start_s is not None]
        ),
        "median_trial_s_after_first": _median([t.trial_s for t in later if t.trial_s is not None]),
        "median_work_s": _median([w for _, w in work]),
        "median_rest_s": _median([trial - w for trial, w in work]),
    }


def per_task(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each task's trials in one run: rewards, median trial time and environment start."""
    out: dict[str, dict[str, Any]] = {}
    for task, ts in by_task([TrialRecord(**t) for t in run["trials"]]).items():
        out[task] = {
            "trials": len(ts),
            "rewards": [t.reward for t in ts],
            "median_trial_s": _median([t.trial_s for t in ts if t.trial_s is not None]),
            "median_environment_start_s": _median(
                [t.environment_start_s for t in ts if t.environment_start_s is not None]
            ),
        }
    return out


def rewards(run: dict[str, Any]) -> dict[str, list[float | None]]:
    """Each task's rewards in one run, in the order the run lists its trials."""
    out: dict[str, list[float | None]] = {}
    for t in run["trials"]:
        out.setdefault(t["task"], []).append(t["reward"])
    return out


def _identical(ra: dict[str, list[Any]], rb: dict[str, list[Any]], tasks: list[str]) -> bool:
    """Both sides ran every one of `tasks` (at least one) with the same multiset of rewards."""
    return bool(tasks) and all(
        t in ra and t in rb and sorted(map(str, ra[t])) == sorted(map(str, rb[t])) for t in tasks
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def _repeated_side_by_side(sg: list[TrialRecord], dk: list[TrialRecord]) -> dict[str, Any]:
    fa, fb = repeated_figures(sg), repeated_figures(dk)
    out: dict[str, Any] = {SANDGYM: fa, HARBOR_DOCKER: fb}
    for key, name in (
        ("median_environment_start_s", "env_start_ratio"),
        ("median_trial_s", "trial_ratio"),
        ("median_environment_start_s_after_first", "env_start_ratio_after_first"),
        ("median_trial_s_after_first", "trial_ratio_after_first"),
    ):
        out[name] = _ratio(fa[key], fb[key])
    if fa["median_rest_s"] is not None and fb["median_rest_s"] is not None:
        out["break_even_work_s"] = round(fb["median_rest_s"] - 2 * fa["median_rest_s"], 3)
    return out


def task_sets(config: dict[str, Any]) -> dict[str, list[str]]:
    """The task sets a document ran side by side, by the names its config records."""
    sets: dict[str, list[str]] = {}
    if config.get("catalog_tasks"):
        sets["catalog"] = sorted(config["catalog_tasks"])
    tb2 = config.get("tb2") or {}
    if tb2.get("tasks"):
        sets[tb2.get("dataset") or "terminal-bench-2.0"] = sorted(t["task"] for t in tb2["tasks"])
    return sets


def _targets(rep: dict[str, Any], identical: dict[str, bool]) -> dict[str, Any]:
    return {
        "identical_oracle_rewards": identical.get("repeated", False)
        and identical.get("cold", False),
        "identical_nop_rewards": identical.get("nop"),
        "env_start_at_most_0.2x": rep["env_start_ratio"] is not None
        and rep["env_start_ratio"] <= 0.2,
        "trial_at_most_0.5x": rep["trial_ratio"] is not None and rep["trial_ratio"] <= 0.5,
    }


def summarize(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary, targets) of a document holding `runs`, `kill` and `config`."""
    runs: list[dict[str, Any]] = doc["runs"]
    task_names: list[str] = list(doc["config"]["tasks"])
    by = {(r["part"], r["environment"]): r for r in runs}
    sets = task_sets(doc["config"])
    summary: dict[str, Any] = {}
    identical: dict[str, bool] = {}
    for part in PARTS:
        a, b = by.get((part, SANDGYM)), by.get((part, HARBOR_DOCKER))
        if a is None or b is None:
            continue
        ra, rb = rewards(a), rewards(b)
        identical[part] = _identical(ra, rb, task_names)
        summary[part] = {
            "rewards_sandgym": ra,
            "rewards_docker": rb,
            "per_task_sandgym": per_task(a),
            "per_task_docker": per_task(b),
            "tasks_both_ran": len(set(ra) & set(rb)),
            "identical_rewards": identical[part],
        }
        if part == "repeated":
            summary[part].update(
                _repeated_side_by_side(
                    [TrialRecord(**t) for t in a["trials"]], [TrialRecord(**t) for t in b["trials"]]
                )
            )
    if (part := "sandgym_only", SANDGYM) in by:
        summary["sandgym_only"] = {"rewards_sandgym": rewards(by[(part, SANDGYM)])}
    targets: dict[str, Any] = {}
    if "repeated" in summary:
        targets.update(_targets(summary["repeated"], identical))
        if len(sets) > 1:
            summary["by_set"], targets["by_set"] = _by_set(by, sets)
    kills = doc.get("kill") or []
    if kills:
        sg = [x for x in kills if x["environment"] == SANDGYM]
        targets["zero_leftovers_sandgym_after_reaper"] = bool(sg) and all(
            "after_reaper" in x
            and not x["after_reaper"]["new_sandgym_containers"]
            and not x["after_reaper"]["new_sandgym_networks"]
            and x["after_reaper"]["sandboxes_held_by_server"] == 0
            for x in sg
        )
    return summary, targets


def _by_set(
    by: dict[tuple[str, str], dict[str, Any]], sets: dict[str, list[str]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The identical-reward checks and the repeated figures of each task set on its own."""
    summary: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for name, tasks in sets.items():
        identical: dict[str, bool] = {}
        for part in PARTS:
            a, b = by.get((part, SANDGYM)), by.get((part, HARBOR_DOCKER))
            if a is not None and b is not None:
                identical[part] = _identical(rewards(a), rewards(b), tasks)
        a, b = by[("repeated", SANDGYM)], by[("repeated", HARBOR_DOCKER)]
        rep = _repeated_side_by_side(
            [TrialRecord(**t) for t in a["trials"] if t["task"] in tasks],
            [TrialRecord(**t) for t in b["trials"] if t["task"] in tasks],
        )
        summary[name] = {"tasks": tasks, "identical_rewards": identical, "repeated": rep}
        targets[name] = _targets(rep, identical)
    return summary, targets
