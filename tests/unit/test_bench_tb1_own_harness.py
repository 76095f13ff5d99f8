"""Terminal-Bench 1's own harness beside sandgym's run (lab/bench/tb1_own_harness.py): the task
copies it runs carry sandgym's substitutions, its results.json is read as the harness writes it,
and a task agrees only where both sides gave the same verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.bench import tb1_own_harness as m


def sandgym_line(
    task_id: str, oracle: float | None, noop: float | None, cat: str = "clean"
) -> dict:
    return {
        "task_id": task_id,
        "oracle_reward": oracle,
        "noop_reward": noop,
        "outcome": {"category": cat},
    }


def trial(task_id: str, resolved: bool | None, mode: str = "none", tests: dict | None = None):
    return m.HarnessTrial(
        task_id=task_id, is_resolved=resolved, failure_mode=mode, parser_results=tests
    )


def test_agreement_is_the_same_verdict_on_both_sides() -> None:
    lines = [
        sandgym_line("both-pass", 1.0, 0.0),
        sandgym_line("sandgym-only", 1.0, 0.0),
        sandgym_line("harness-only", 0.0, 0.0, "failing"),
        sandgym_line("both-fail", 0.0, 0.0, "failing"),
    ]
    trials = {
        "oracle": {
            "both-pass": trial("both-pass", True),
            "sandgym-only": trial("sandgym-only", False, tests={"t::a": "failed"}),
            "harness-only": trial("harness-only", True),
            "both-fail": trial("both-fail", None, "test_timeout"),
        },
        "nop": {"both-pass": trial("both-pass", False)},
    }
    rows = {r.task_id: r for r in m.compare(lines, trials, {"both-pass": [{"name": "x"}]})}
    assert [
        rows[t].agree_oracle for t in ("both-pass", "sandgym-only", "harness-only", "both-fail")
    ] == [
        True,
        False,
        False,
        True,
    ]
    assert rows["both-pass"].agree_nop is True and rows["both-pass"].substitutions == ["x"]
    assert rows["sandgym-only"].agree_nop is None  # no nop trial: no verdict, not agreement
    assert rows["sandgym-only"].harness_oracle_failed_tests == ["t::a"]
    # a test timeout: the harness leaves is_resolved None and counts the trial unresolved
    assert rows["both-fail"].harness_oracle_resolved is False
    assert rows["both-fail"].harness_oracle_failure_mode == "test_timeout"
    s = m.summarize(list(rows.values()), lines)
    assert s["agree_oracle"] == {"count": 2, "of": 4}
    assert s["agree_nop"] == {"count": 1, "of": 1}
    assert s["harness_oracle_resolved"] == {"count": 2, "of": 4}
    assert s["sandgym_oracle_one"] == {"count": 2, "of": 4}
    assert s["disagreements"] == ["harness-only", "sandgym-only"]
    assert s["harness_no_verdict"] == {"oracle": [], "nop": []}


def test_a_trial_the_harness_stopped_before_its_tests_is_no_verdict() -> None:
    """Its harness keeps `is_resolved` None when a trial fails before the tests (a build it
    could not make: `unknown_agent_error`); that is no verdict on the task to agree with."""
    row = m.compare(
        [sandgym_line("t", 1.0, 0.0)], {"oracle": {"t": trial("t", None, "unknown_agent_error")}}
    )[0]
    assert row.agree_oracle is None and row.harness_oracle_resolved is None
    s = m.summarize([row], [sandgym_line("t", 1.0, 0.0)])
    assert s["harness_no_verdict"] == {"oracle": ["t"], "nop": []}
    assert s["harness_oracle_resolved"] == {"count": 0, "of": 0} and s["disagreements"] == []


def test_the_absolute_figure_counts_clean_tasks_of_the_whole_set_on_each_side() -> None:
    """Clean under the harness is oracle resolved and nop not; a task the harness could not
    build, or whose oracle failed, is not clean; the denominator is the whole set, tasks the
    harness did not run included (not clean under it, their own category on sandgym's side)."""
    lines = [
        sandgym_line("clean", 1.0, 0.0),
        sandgym_line("nop-passes", 1.0, 1.0, "failing"),
        sandgym_line("unbuilt", None, None, "unreachable_host"),
        sandgym_line("harness-builds-it", None, None, "unreachable_host"),
        sandgym_line("no-nop-yet", 1.0, 0.0),
        sandgym_line("not-run", 1.0, 0.0),
    ]
    trials = {
        "oracle": {
            "clean": trial("clean", True),
            "nop-passes": trial("nop-passes", True),
            "unbuilt": trial("unbuilt", None, "unknown_agent_error"),
            "harness-builds-it": trial("harness-builds-it", True),
            "no-nop-yet": trial("no-nop-yet", True),
        },
        "nop": {
            "clean": trial("clean", False),
            "nop-passes": trial("nop-passes", True),
            "unbuilt": trial("unbuilt", None, "unknown_agent_error"),
            "harness-builds-it": trial("harness-builds-it", False),
        },
    }
    rows = {r.task_id: r for r in m.compare(lines, trials)}
    assert [rows[t].harness_clean for t in sorted(rows)] == [True, True, None, False, False]
    assert [rows[t].sandgym_clean for t in sorted(rows)] == [True, False, True, False, False]
    s = m.summarize(list(rows.values()), lines)
    assert s["set_tasks"] == 6 and s["tasks"] == 5
    assert s["absolute"] == {
        "sandgym_clean": {"count": 3, "of": 6},  # "not-run" is clean on sandgym's side
        "harness_clean": {"count": 2, "of": 6},
        "harness_clean_unknown": ["no-nop-yet"],
        "clean_disagreements": ["harness-builds-it"],
    }
    assert s["by_sandgym_category"]["unreachable_host"] == {
        "tasks": 2,
        "oracle": {"resolved": 1, "unresolved": 0, "no_verdict": 1, "not_run": 0},
        "nop": {"resolved": 0, "unresolved": 1, "no_verdict": 1, "not_run": 0},
    }
    # "unbuilt" stopped before its tests on both sides; "harness-builds-it" on sandgym's only
    assert s["oracle_no_verdict"] == {
        "both": 1,
        "sandgym_only": ["harness-builds-it"],
        "harness_only": [],
    }
    assert s["by_sandgym_category"]["clean"]["nop"] == {
        "resolved": 0,
        "unresolved": 1,
        "no_verdict": 0,
        "not_run": 1,
    }


def test_a_nop_the_harness_resolves_disagrees_with_a_noop_of_zero() -> None:
    rows = m.compare([sandgym_line("t", 1.0, 0.0)], {"nop": {"t": trial("t", True)}})
    assert rows[0].agree_nop is False and rows[0].agree_oracle is None


def test_a_task_sandgym_did_not_run_is_an_error() -> None:
    with pytest.raises(m.HarnessReportError, match="no line"):
        m.compare([], {"oracle": {"t": trial("t", True)}})


def write_run(d: Path, agent: str, results: list[dict]) -> Path:
    d.mkdir(parents=True)
    (d / "run_metadata.json").write_text(
        json.dumps({"run_id": d.name, "agent_name": agent, "n_concurrent_trials": 1})
    )
    (d / "results.json").write_text(json.dumps({"id": "x", "results": results, "accuracy": 0.5}))
    return d


def tb_trial(task_id: str, resolved: bool | None, parser: dict | None) -> dict:
    """A trial as terminal-bench 0.2.18's TrialResults dumps it (harness/models.py)."""
    return {
        "id": "00000000-0000-4000-8000-000000000000",
        "trial_name": f"{task_id}.1-of-1.run",
        "task_id": task_id,
        "instruction": "the task's own text",
        "is_resolved": resolved,
        "failure_mode": "none" if resolved is not None else "unknown_agent_error",
        "parser_results": parser,
        "recording_path": None,
        "total_input_tokens": None,
        "total_output_tokens": None,
        "trial_started_at": "2026-12-04T18:00:00+00:00",
        "trial_ended_at": "2026-12-04T18:01:00+00:00",
        "agent_started_at": None,
        "agent_ended_at": None,
        "test_started_at": None,
        "test_ended_at": None,
    }


def test_report_writes_the_comparison_and_the_raw_trials(tmp_path: Path) -> None:
    doc = tmp_path / "tb1.json"
    doc.write_text(
        json.dumps(
            {
                "datasets": [
                    {
                        "name": "terminal-bench-1",
                        "source": {"repo": "r", "commit": "c"},
                        "tasks": [
                            sandgym_line("a", 1.0, 0.0),
                            sandgym_line("b", 0.0, 0.0, "failing"),
                        ],
                    }
                ]
            }
        )
    )
    o = write_run(
        tmp_path / "runs" / "oracle-1",
        "oracle",
        [tb_trial("a", True, {"test_x": "passed"}), tb_trial("b", False, {"test_y": "failed"})],
    )
    n = write_run(tmp_path / "runs" / "nop-1", "nop", [tb_trial("a", False, {"test_x": "failed"})])
    out = tmp_path / "cmp.json"
    result = m.report([o, n], doc, out)
    written = json.loads(out.read_text())
    assert written["summary"] == result["summary"]
    assert written["summary"]["agree_oracle"] == {"count": 2, "of": 2}
    assert written["summary"]["agree_nop"] == {"count": 1, "of": 1}  # unresolved nop: 0.0
    assert [r["agent"] for r in written["runs"]] == ["oracle", "nop"]
    raw = [json.loads(x) for x in out.with_suffix(".raw.jsonl").read_text().splitlines()]
    assert [(r["agent"], r["task_id"]) for r in raw] == [
        ("oracle", "a"),
        ("oracle", "b"),
        ("nop", "a"),
    ]
    assert all("instruction" not in r for r in raw) and raw[1]["parser_results"] == {
        "test_y": "failed"
    }


def test_two_trials_of_one_task_and_agent_are_refused(tmp_path: Path) -> None:
    doc = tmp_path / "tb1.json"
    doc.write_text(
        json.dumps({"datasets": [{"name": "terminal-bench-1", "source": {}, "tasks": []}]})
    )
    a = write_run(tmp_path / "r1", "oracle", [tb_trial("a", True, {})])
    b = write_run(tmp_path / "r2", "oracle", [tb_trial("a", False, {})])
    with pytest.raises(m.HarnessReportError, match="oracle: two trials with a verdict"):
        m.report([a, b], doc, tmp_path / "o.json")


def test_a_trial_without_a_verdict_may_be_run_again(tmp_path: Path) -> None:
    doc = tmp_path / "tb1.json"
    tasks = [sandgym_line("a", 1.0, 0.0)]
    doc.write_text(
        json.dumps({"datasets": [{"name": "terminal-bench-1", "source": {}, "tasks": tasks}]})
    )
    first = write_run(tmp_path / "r1", "nop", [tb_trial("a", None, None)])
    again = write_run(tmp_path / "r2", "nop", [tb_trial("a", False, {"t": "failed"})])
    out = tmp_path / "o.json"
    result = m.report([first, again], doc, out)
    assert result["tasks"][0]["harness_nop_resolved"] is False
    assert result["summary"]["harness_no_verdict"]["nop"] == []
    assert len(out.with_suffix(".raw.jsonl").read_text().splitlines()) == 2  # both kept
    with pytest.raises(m.HarnessReportError, match="with a verdict"):  # never a verdict twice
        m.report([first, again, again], doc, out)
    with pytest.raises(m.HarnessReportError, match="without a verdict after one with"):
        m.report([again, first], doc, out)  # a verdict is never replaced by none
    with pytest.raises(m.HarnessReportError, match="two trials without a verdict"):
        m.report([first, first], doc, out)


def test_each_run_keeps_the_engine_it_ran_on(tmp_path: Path) -> None:
    doc = tmp_path / "tb1.json"
    doc.write_text(
        json.dumps({"datasets": [{"name": "terminal-bench-1", "source": {}, "tasks": []}]})
    )
    old = write_run(tmp_path / "r1", "oracle", [])
    new = write_run(tmp_path / "r2", "nop", [])
    server = {
        "Components": [
            {"Name": "Engine", "Version": "26.1.5+dfsg1", "Details": {}},
            {"Name": "runc", "Version": "1.1.5+ds1"},
        ]
    }
    (new / "engine.json").write_text(json.dumps(server))
    runs = m.report([old, new], doc, tmp_path / "o.json")["runs"]
    assert [r["engine"] for r in runs] == [None, {"Engine": "26.1.5+dfsg1", "runc": "1.1.5+ds1"}]
    (new / "engine.json").write_text(json.dumps({"Version": "26"}))
    with pytest.raises(m.HarnessReportError, match="engine.json: expected docker version"):
        m.report([old, new], doc, tmp_path / "o.json")


def test_unreadable_runs_are_named(tmp_path: Path) -> None:
    with pytest.raises(m.HarnessReportError, match="run_metadata.json"):
        m.read_run(tmp_path)
    d = write_run(tmp_path / "x", "terminus", [])
    with pytest.raises(m.HarnessReportError, match="oracle or nop"):
        m.read_run(d)


def test_prepare_makes_sandgyms_substitutions_in_the_copy(tmp_path: Path, monkeypatch) -> None:
    import lab.bench.substitutions as subst

    monkeypatch.setattr(subst, "debian_cpython_debs", lambda ver, cache: None)
    task = tmp_path / "set" / "t"
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text("instruction: x\n")
    (task / "tests" / "setup-uv-pytest.sh").write_text(
        "#!/bin/bash\ncurl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n"
    )
    made = m.prepare(tmp_path / "set", tmp_path / "out", tmp_path, ["t"])
    assert [r["name"] for r in made["t"]] == ["uv-installer-from-pypi"]
    copied = (tmp_path / "out" / "t" / "tests" / "setup-uv-pytest.sh").read_text()
    assert "astral.sh/uv/0.7.13/install.sh | sh" not in copied
    assert json.loads((tmp_path / "substitutions.json").read_text()) == made
    (tmp_path / "set" / "u").mkdir()
    (tmp_path / "set" / "u" / "task.yaml").write_text("instruction: y\n")
    m.prepare(tmp_path / "set", tmp_path / "out", tmp_path, ["u"])  # a later call keeps "t"
    assert json.loads((tmp_path / "substitutions.json").read_text()) == {**made, "u": []}
    with pytest.raises(m.HarnessReportError, match="task.yaml"):
        m.prepare(tmp_path / "set", tmp_path / "out", tmp_path, ["missing"])


RESULTS = Path(__file__).resolve().parents[2] / "lab" / "bench" / "results"


def test_the_committed_comparison_is_its_raw_trials_beside_the_committed_tb1_record() -> None:
    """lab/bench/results/tb1_own_harness.json is what `report` makes of the harness's trials kept
    beside it and of the committed Terminal-Bench 1 record: a figure edited by hand, or a TB1
    line re-run without making the comparison again, fails here."""
    doc = json.loads((RESULTS / "tb1_own_harness.json").read_text(encoding="utf-8"))
    raw = (RESULTS / "tb1_own_harness.raw.jsonl").read_text(encoding="utf-8").splitlines()
    trials: dict[str, dict[str, m.HarnessTrial]] = {}
    for line in raw:
        r = json.loads(line)
        trials.setdefault(r["agent"], {})[r["task_id"]] = m.HarnessTrial.model_validate(r)
    assert "oracle" in trials  # the nop agent's run may be absent (docs/harbor_compat.md)
    tb1 = json.loads((RESULTS / "harbor_compat_tb1.json").read_text(encoding="utf-8"))
    (tasks,) = [d["tasks"] for d in tb1["datasets"] if d["name"] == "terminal-bench-1"]
    subst = {t["task_id"]: [{"name": n} for n in t["substitutions"]] for t in doc["tasks"]}
    rows = m.compare(tasks, trials, subst)
    assert [r.model_dump() for r in rows] == doc["tasks"]
    assert m.summarize(rows, tasks) == doc["summary"]
    assert doc["source"] == tb1["datasets"][0]["source"]
