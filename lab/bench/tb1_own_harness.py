"""Terminal-Bench 1's own harness beside sandgym's run of the same tasks (bench only).

`lab/bench/tb1_own_harness.sh` runs the released harness (terminal-bench's `tb run`, oracle and nop
agents) on the Terminal-Bench 1 tasks, on the same local stand-in images and with the same
substitutions as sandgym's committed run (`lab/bench/results/harbor_compat_tb1.json`). This module
does the two steps around it:

- `prepare`: the task copies the harness runs, made by the substitution layer sandgym's run
  uses (`lab.bench.substitutions.prepare_task_copy`), with the substitutions made in each;
- `report`: reads the harness's own `results.json` of each run (one trial per task and agent)
  and puts each task's verdict beside sandgym's line for it: resolved or not, the harness's
  failure mode and the tests its parser saw fail, and whether the two agree. A task agrees
  when the harness resolved the oracle trial exactly where sandgym scored the oracle 1.0, and
  the nop trial exactly where sandgym scored the no-op 1.0 (where both gave a verdict: a trial
  the harness stopped before its tests, e.g. a build it could not make, has none and is
  listed in `harness_no_verdict`; such a trial may be run again in a later run, whose
  verdict then stands, both trials staying in the raw file). Each task is also clean or not on
  each side, as the set's absolute figure counts it: sandgym's category `clean`, and the
  harness's oracle resolved with its nop unresolved (a trial with no verdict is not clean).

Nothing here re-classifies sandgym's lines: the committed categories and figures stay what
their runs recorded; the comparison is its own document (`lab/bench/results/tb1_own_harness.json`,
the harness's trials beside it in `tb1_own_harness.raw.jsonl`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from lab.bench.report import save_json, start_run

TB_VERSION = "0.2.18"
#: what the harness's runner needs beyond the package, and where it comes from
RUNNER_TOOLS = {
    "terminal-bench": f"{TB_VERSION}, from the Python package index",
    "docker compose": "2.26.1-4, Debian trixie's docker-compose package",
    "docker buildx": "0.13.1+ds1-3, Debian trixie's docker-buildx package",
    "python": "Debian trixie's CPython 3.13, sandgym/standin:python-3.13 (the harness needs >= 3.12)",
}

#: the fields of each trial of the harness's results.json kept in the raw file (left out: the
#: task's own text `instruction`, the trial's id and recording path, and token counts, which an
#: agent with no model leaves empty)
RAW_FIELDS = (
    "task_id",
    "trial_name",
    "is_resolved",
    "failure_mode",
    "parser_results",
    "trial_started_at",
    "trial_ended_at",
    "agent_started_at",
    "agent_ended_at",
    "test_started_at",
    "test_ended_at",
)


class HarnessTrial(BaseModel):
    """One trial of Terminal-Bench's harness, as its results.json records it."""

    model_config = ConfigDict(extra="ignore")

    task_id: str
    is_resolved: bool | None = None
    failure_mode: str = "unset"
    parser_results: dict[str, str] | None = None

    @property
    def verdict(self) -> bool | None:
        """Resolved or not, as the harness's accuracy counts the trial; None where it stopped
        before its tests ran (`unknown_agent_error`: no verdict). A test timeout or test output
        its parser cannot read is unresolved: the harness leaves `is_resolved` None for those
        (it returns before scoring) and counts them unresolved."""
        if self.is_resolved is not None:
            return self.is_resolved
        return False if self.failure_mode in ("test_timeout", "parse_error") else None

    @property
    def failed_tests(self) -> list[str]:
        return sorted(k for k, v in (self.parser_results or {}).items() if v != "passed")


class TaskComparison(BaseModel):
    """One task: sandgym's line and the harness's trials, side by side."""

    task_id: str
    substitutions: list[str]
    sandgym_substitutions: list[str]
    sandgym_category: str
    sandgym_oracle_reward: float | None
    sandgym_noop_reward: float | None
    harness_oracle_resolved: bool | None
    harness_oracle_failure_mode: str | None
    harness_oracle_failed_tests: list[str] | None
    harness_nop_resolved: bool | None
    harness_nop_failure_mode: str | None
    agree_oracle: bool | None
    agree_nop: bool | None
    sandgym_clean: bool
    harness_clean: bool | None


def harness_clean(oracle: bool | None, nop: bool | None) -> bool | None:
    """Clean under the harness: its oracle resolved the task and its nop did not. Not clean
    where the oracle was not resolved (or had no verdict), whatever the nop did; None (not
    known) only where the oracle resolved it and the nop has no verdict."""
    if oracle is not True:
        return False
    return None if nop is None else not nop


class HarnessReportError(ValueError):
    """A harness run or sandgym document that cannot be read as expected."""


def read_run(run_dir: Path) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """The agent name, run metadata and trials (as the harness wrote them) of one `tb run`
    output directory."""
    meta_path, results_path = run_dir / "run_metadata.json", run_dir / "results.json"
    for p in (meta_path, results_path):
        if not p.is_file():
            raise HarnessReportError(f"{run_dir}: expected the harness's {p.name}, found none")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    agent = meta.get("agent_name")
    if agent not in ("oracle", "nop"):
        raise HarnessReportError(f"{meta_path}: expected agent_name oracle or nop, got {agent!r}")
    raw = json.loads(results_path.read_text(encoding="utf-8")).get("results")
    if not isinstance(raw, list):
        raise HarnessReportError(f"{results_path}: expected a list under 'results'")
    return agent, meta, raw


def read_engine(run_dir: Path) -> dict[str, str] | None:
    """The engine a run's trials ran on, as the script recorded it beside the harness's files
    (`engine.json`: `docker version`'s Server part): component name -> version; None where
    the run has no such record (runs made before the script wrote it)."""
    path = run_dir / "engine.json"
    if not path.is_file():
        return None
    try:
        server = json.loads(path.read_text(encoding="utf-8"))
        return {str(c["Name"]): str(c["Version"]) for c in server["Components"]}
    except (ValueError, KeyError, TypeError) as e:
        raise HarnessReportError(
            f"{path}: expected docker version's Server part (Components: Name, Version): {e!r}"
        ) from e


def _agree(reward: float | None, resolved: bool | None) -> bool | None:
    if reward is None or resolved is None:
        return None
    return (reward == 1.0) == resolved


def compare(
    sandgym_tasks: list[dict[str, Any]],
    trials: dict[str, dict[str, HarnessTrial]],
    substitutions: dict[str, list[dict[str, str]]] | None = None,
) -> list[TaskComparison]:
    """One comparison per task the harness ran (`trials`: agent -> task_id -> trial;
    `substitutions`: what `prepare` made in each task's copy)."""
    by_id = {t["task_id"]: t for t in sandgym_tasks}
    ran = sorted(set().union(*(set(v) for v in trials.values())) if trials else set())
    out: list[TaskComparison] = []
    for task_id in ran:
        line = by_id.get(task_id)
        if line is None:
            raise HarnessReportError(
                f"{task_id}: the harness ran it, sandgym's document has no line"
            )
        oracle = trials.get("oracle", {}).get(task_id)
        nop = trials.get("nop", {}).get(task_id)
        # None: no trial, or the harness stopped before its tests (`HarnessTrial.verdict`)
        o_res = oracle.verdict if oracle is not None else None
        n_res = nop.verdict if nop is not None else None
        out.append(
            TaskComparison(
                task_id=task_id,
                substitutions=[r["name"] for r in (substitutions or {}).get(task_id, [])],
                sandgym_substitutions=[r["name"] for r in line.get("substitutions", [])],
                sandgym_category=line["outcome"]["category"],
                sandgym_oracle_reward=line.get("oracle_reward"),
                sandgym_noop_reward=line.get("noop_reward"),
                harness_oracle_resolved=o_res,
                harness_oracle_failure_mode=oracle.failure_mode if oracle else None,
                harness_oracle_failed_tests=oracle.failed_tests if oracle else None,
                harness_nop_resolved=n_res,
                harness_nop_failure_mode=nop.failure_mode if nop else None,
                agree_oracle=_agree(line.get("oracle_reward"), o_res),
                agree_nop=_agree(line.get("noop_reward"), n_res),
                sandgym_clean=line["outcome"]["category"] == "clean",
                harness_clean=harness_clean(o_res, n_res),
            )
        )
    return out


def _count(rows: list[TaskComparison], field: str, value: object = True) -> dict[str, int]:
    have = [r for r in rows if getattr(r, field) is not None]
    return {"count": sum(1 for r in have if getattr(r, field) == value), "of": len(have)}


def _stopped(rows: list[TaskComparison], agent: str) -> list[str]:
    """The tasks whose `agent` trial ran and has no verdict (stopped before its tests)."""
    return [
        r.task_id
        for r in rows
        if getattr(r, f"harness_{agent}_failure_mode") is not None
        and getattr(r, f"harness_{agent}_resolved") is None
    ]


def _outcomes(rows: list[TaskComparison], agent: str) -> dict[str, int]:
    verdicts = [getattr(r, f"harness_{agent}_resolved") for r in rows]
    return {
        "resolved": sum(1 for v in verdicts if v is True),
        "unresolved": sum(1 for v in verdicts if v is False),
        "no_verdict": len(_stopped(rows, agent)),
        "not_run": sum(1 for r in rows if getattr(r, f"harness_{agent}_failure_mode") is None),
    }


def _no_verdict_sides(rows: list[TaskComparison]) -> dict[str, Any]:
    """Oracle trials with no verdict on each side: sandgym's oracle reward None (its line
    stopped before the tests: no build, no start), the harness's trial run with no verdict."""
    sandgym = {r.task_id for r in rows if r.sandgym_oracle_reward is None}
    harness = set(_stopped(rows, "oracle"))
    return {
        "both": len(sandgym & harness),
        "sandgym_only": sorted(sandgym - harness),
        "harness_only": sorted(harness - sandgym),
    }


def summarize(rows: list[TaskComparison], sandgym_tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of `rows` (the tasks the harness ran) in sandgym's set (`sandgym_tasks`, its
    lines): the absolute figure of each side counts clean tasks of the whole set; a task the
    harness did not run is not clean under it, and keeps its category on sandgym's side."""
    set_size = len(sandgym_tasks)
    by_category: dict[str, list[TaskComparison]] = {}
    for r in rows:
        by_category.setdefault(r.sandgym_category, []).append(r)
    return {
        "set_tasks": set_size,
        "tasks": len(rows),
        "absolute": {
            "sandgym_clean": {
                "count": sum(1 for t in sandgym_tasks if t["outcome"]["category"] == "clean"),
                "of": set_size,
            },
            "harness_clean": {
                "count": sum(1 for r in rows if r.harness_clean is True),
                "of": set_size,
            },
            "harness_clean_unknown": [r.task_id for r in rows if r.harness_clean is None],
            "clean_disagreements": [
                r.task_id
                for r in rows
                if r.harness_clean is not None and r.harness_clean != r.sandgym_clean
            ],
        },
        "by_sandgym_category": {
            cat: {
                "tasks": len(rs),
                "oracle": _outcomes(rs, "oracle"),
                "nop": _outcomes(rs, "nop"),
            }
            for cat, rs in sorted(by_category.items())
        },
        "harness_oracle_resolved": _count(rows, "harness_oracle_resolved"),
        "harness_nop_resolved": _count(rows, "harness_nop_resolved"),
        "sandgym_oracle_one": {
            "count": sum(1 for r in rows if r.sandgym_oracle_reward == 1.0),
            "of": len(rows),
        },
        "agree_oracle": _count(rows, "agree_oracle"),
        "agree_nop": _count(rows, "agree_nop"),
        "harness_no_verdict": {agent: _stopped(rows, agent) for agent in ("oracle", "nop")},
        "disagreements": [
            r.task_id for r in rows if r.agree_oracle is False or r.agree_nop is False
        ],
        # the oracle trials neither side could score (no build, no start): the same tasks?
        "oracle_no_verdict": _no_verdict_sides(rows),
    }


def report(
    runs: list[Path], sandgym_doc: Path, out: Path, substitutions: Path | None = None
) -> dict[str, Any]:
    """Write the comparison document (`out`) and the harness's trials beside it (`.raw.jsonl`);
    `substitutions`: the file `prepare` wrote."""
    doc = json.loads(sandgym_doc.read_text(encoding="utf-8"))
    sets = [d for d in doc.get("datasets", []) if d.get("name") == "terminal-bench-1"]
    if len(sets) != 1:
        raise HarnessReportError(f"{sandgym_doc}: expected one terminal-bench-1 dataset")
    trials: dict[str, dict[str, HarnessTrial]] = {}
    raw_lines: list[str] = []
    run_records = []
    for run_dir in runs:
        agent, meta, raw = read_run(run_dir)
        run_records.append(
            {
                "run_id": meta.get("run_id"),
                "agent": agent,
                "start_time": meta.get("start_time"),
                "end_time": meta.get("end_time"),
                "n_concurrent_trials": meta.get("n_concurrent_trials"),
                "task_ids": meta.get("task_ids"),
                "engine": read_engine(run_dir),
            }
        )
        for t in (HarnessTrial.model_validate(r) for r in raw):
            earlier = trials.setdefault(agent, {}).get(t.task_id)
            if earlier is not None:
                had, has = earlier.verdict is not None, t.verdict is not None
                if had or not has:
                    what = {
                        (True, True): "two trials with a verdict",
                        (True, False): "a trial without a verdict after one with a verdict",
                        (False, False): "two trials without a verdict",
                    }[(had, has)]
                    raise HarnessReportError(f"{t.task_id}: {agent}: {what}; keep one")
            # a trial with no verdict (stopped before its tests) may be run again: the later
            # trial's verdict stands, and both stay in the raw file
            trials[agent][t.task_id] = t
        for r in raw:  # its fields as the harness wrote them; the task's own text stays out
            kept = {k: r.get(k) for k in RAW_FIELDS}
            raw_lines.append(json.dumps({"run_id": meta.get("run_id"), "agent": agent, **kept}))
    subst = json.loads(substitutions.read_text(encoding="utf-8")) if substitutions else {}
    rows = compare(sets[0]["tasks"], trials, subst)
    result = {
        "bench": "tb1_own_harness",
        "harness": RUNNER_TOOLS,
        "sandgym_document": str(sandgym_doc),
        "source": sets[0]["source"],
        "runs": run_records,
        "summary": summarize(rows, sets[0]["tasks"]),
        "tasks": [r.model_dump() for r in rows],
    }
    save_json(result, out)  # stamps `provenance`: command, commit, dirty, times
    out.with_suffix(".raw.jsonl").write_text("".join(x + "\n" for x in raw_lines), encoding="utf-8")
    return result


def prepare(tasks_dir: Path, out: Path, work_dir: Path, task_ids: list[str]) -> dict[str, Any]:
    """Copy each task to `out/<task>` with sandgym's substitutions; returns them per task (and
    keeps them, with those of earlier calls, in `work_dir/substitutions.json`)."""
    from lab.bench.substitutions import DEBIAN_CPYTHON, debian_cpython_debs, prepare_task_copy

    cpython = {v: debian_cpython_debs(v, work_dir) for v in DEBIAN_CPYTHON}
    record = work_dir / "substitutions.json"  # kept across calls: one file for every task made
    made: dict[str, Any] = {}
    if record.is_file():
        made = json.loads(record.read_text(encoding="utf-8"))
    for task_id in task_ids:
        src = tasks_dir / task_id
        if not (src / "task.yaml").is_file():
            raise HarnessReportError(f"{src}: expected a Terminal-Bench 1 task (task.yaml)")
        made[task_id] = prepare_task_copy(src, out / task_id, cpython)
    record.write_text(json.dumps(made, indent=1) + "\n", encoding="utf-8")
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.bench.tb1_own_harness", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="the substituted task copies the harness runs")
    pp.add_argument("--tasks-dir", type=Path, required=True)
    pp.add_argument("--out", type=Path, required=True)
    pp.add_argument("--work-dir", type=Path, required=True)
    pp.add_argument("task_ids", nargs="+")
    pr = sub.add_parser("report", help="compare the harness's runs with sandgym's document")
    pr.add_argument("--runs", type=Path, nargs="+", required=True)
    pr.add_argument(
        "--sandgym", type=Path, default=Path("lab/bench/results/harbor_compat_tb1.json")
    )
    pr.add_argument("--out", type=Path, default=Path("lab/bench/results/tb1_own_harness.json"))
    pr.add_argument("--substitutions", type=Path, help="the substitutions.json prepare wrote")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        a.out.mkdir(parents=True, exist_ok=True)
        made = prepare(a.tasks_dir, a.out, a.work_dir, a.task_ids)
        print(json.dumps({k: [r["name"] for r in v] for k, v in made.items()}))
    else:
        args = sys.argv[1:] if argv is None else argv
        start_run("python -m lab.bench.tb1_own_harness " + shlex.join(args))
        print(json.dumps(report(a.runs, a.sandgym, a.out, a.substitutions)["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
