"""`sandgym tasks check`: one JSON line per task as it finishes (`--jsonl`), a task that fails to
load reported with its reason while the others still run, and resuming a cut-off run from its
output file (`--resume`). The episodes themselves are faked: these tests are about the stream."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sandgym.tasks import cli
from sandgym.tasks.check import CheckError, PhaseCheck, TaskCheck, failed_tests, load_error_check

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def _dataset(tmp_path: Path, broken: bool = True) -> Path:
    """Two good Harbor tasks (`fast`, `slow`) and, optionally, one whose task.toml is broken."""
    root = tmp_path / "ds"
    root.mkdir()
    for name in ("fast", "slow"):
        shutil.copytree(FIXTURES / "harbor-legacy", root / name)
    if broken:
        shutil.copytree(FIXTURES / "harbor-legacy", root / "broken")
        (root / "broken" / "task.toml").write_text("version = [unclosed\n")
    return root


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["check", *argv, "--backend", "null"])


class FakeChecks:
    """Stands in for `check_task`: `slow` finishes last, and while it runs it looks at what
    the stream has already delivered (the proof that lines go out as tasks finish)."""

    def __init__(self, out: Path | None = None, capsys: Any = None) -> None:
        self.calls: list[str] = []
        self.out = out
        self.capsys = capsys
        self.seen_while_slow: list[str] = []

    async def __call__(self, task: Any, *a: Any, **kw: Any) -> TaskCheck:
        self.calls.append(task.id)
        if task.id == "slow":
            await asyncio.sleep(0.3)
            if self.out is not None and self.out.exists():
                self.seen_while_slow = [
                    json.loads(x)["task_id"] for x in self.out.read_text().splitlines() if x
                ]
        return TaskCheck(
            task_id=task.id,
            oracle=PhaseCheck(phase="oracle", reward=1.0),
            noop=PhaseCheck(phase="noop", reward=0.0),
        )


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def test_jsonl_streams_each_task_as_it_finishes_and_keeps_going_past_load_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _dataset(tmp_path)
    out = tmp_path / "res.jsonl"
    fake = FakeChecks(out)
    monkeypatch.setattr(cli, "check_task", fake)
    rc = cli.run(_args(str(root), "--jsonl", "--out", str(out), "--concurrency", "2"))
    lines = _lines(capsys.readouterr().out)
    # one line per task on stdout, no closing document; the broken task is one of them
    assert [e["task_id"] for e in lines] == ["broken", "fast", "slow"]
    for e in lines:
        assert {"task_id", "oracle_reward", "noop_reward", "error"} <= set(e)
        assert set(e) <= {"task_id", "oracle_reward", "noop_reward", "error"} | {
            "phase_errors",
            "shortfall",
        }
    broken = lines[0]
    assert broken["error"].startswith("load: TaskLoadError:")
    assert broken["oracle_reward"] is None and broken["noop_reward"] is None
    # the good tasks were checked in spite of it
    assert sorted(fake.calls) == ["fast", "slow"]
    # `fast` (and the load error) were in the file while `slow` was still running
    assert fake.seen_while_slow == ["broken", "fast"]
    assert [e["task_id"] for e in _lines(out.read_text())] == ["broken", "fast", "slow"]
    assert rc == 1  # a task that did not load is a failure of the check


def test_json_document_keeps_its_contract_and_reports_load_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _dataset(tmp_path)
    monkeypatch.setattr(cli, "check_task", FakeChecks())
    rc = cli.run(_args(str(root), "--json"))
    doc = json.loads(capsys.readouterr().out)  # exactly one document
    assert set(doc) == {"tasks"}
    by_id = {e["task_id"]: e for e in doc["tasks"]}
    assert set(by_id) == {"broken", "fast", "slow"}
    assert by_id["fast"] == {
        "task_id": "fast",
        "oracle_reward": 1.0,
        "noop_reward": 0.0,
        "error": None,
        "phase_errors": [],
        "shortfall": None,
    }
    assert "load:" in by_id["broken"]["error"]
    assert rc == 1


def test_a_path_that_is_not_there_is_an_entry_not_an_abort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _dataset(tmp_path, broken=False)
    monkeypatch.setattr(cli, "check_task", FakeChecks())
    cli.run(_args(str(tmp_path / "nowhere"), str(root), "--json"))
    by_id = {e["task_id"]: e for e in json.loads(capsys.readouterr().out)["tasks"]}
    assert by_id["nowhere"]["error"].startswith("load: TaskLoadError")
    assert by_id["fast"]["error"] is None and by_id["slow"]["error"] is None


def test_resume_skips_the_tasks_already_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _dataset(tmp_path)
    out = tmp_path / "res.jsonl"
    earlier = {"task_id": "fast", "oracle_reward": 1.0, "noop_reward": 0.0, "error": None}
    # a run cut off while writing its next line: the partial line must not count
    out.write_text(json.dumps(earlier) + '\n{"task_id": "slow", "oracle_rew')
    fake = FakeChecks()
    monkeypatch.setattr(cli, "check_task", fake)
    rc = cli.run(_args(str(root), "--resume", str(out), "--json"))
    assert fake.calls == ["slow"]  # `fast` was done; `broken` is re-reported, not re-checked
    doc = json.loads(capsys.readouterr().out)
    assert sorted(e["task_id"] for e in doc["tasks"]) == ["broken", "fast", "slow"]
    kept = cli.read_jsonl(out)
    assert sorted(e["task_id"] for e in kept) == ["broken", "fast", "slow"]
    assert rc == 1
    # resuming a finished run checks nothing
    fake2 = FakeChecks()
    monkeypatch.setattr(cli, "check_task", fake2)
    cli.run(_args(str(root), "--resume", str(out), "--jsonl"))
    assert fake2.calls == []
    assert capsys.readouterr().out == ""


def test_read_jsonl_skips_a_cut_off_line(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"task_id": "a"}\n\n{"task_id": "b"}\n{"task_id": "c", "err')
    assert [e["task_id"] for e in cli.read_jsonl(f)] == ["a", "b"]
    assert cli.read_jsonl(tmp_path / "missing.jsonl") == []
    sink = cli.JsonlSink(None, f)  # appends on a fresh line after the cut-off one
    sink.write({"task_id": "d"})
    sink.close()
    assert [e["task_id"] for e in cli.read_jsonl(f)] == ["a", "b", "d"]


async def test_each_shortfall_names_one_reason_from_typed_fields() -> None:
    """`tasks check` says, per task short of the marks, the one reason to act on, read from
    the check's typed fields (the failing phase, the error's type, the oracle's exit code and
    rewards), never from matching the joined error text."""
    from sandgym.sandboxes.null import NullBackend
    from sandgym.tasks import load_task_dir

    task = load_task_dir(FIXTURES / "harbor-legacy")
    check = await cli.check_task(task, NullBackend(), {}, 0)
    # the null backend runs no shell: both phases fail, each recorded with its type
    assert [(p.phase, p.error_type) for p in check.phase_errors] == [
        ("oracle", "TaskError"),
        ("noop", "TaskError"),
    ]
    assert check.oracle is not None and check.oracle.outcome == "error"
    entry = check.to_entry()
    assert [(p["phase"], p["error_type"]) for p in entry["phase_errors"]] == [
        ("oracle", "TaskError"),
        ("noop", "TaskError"),
    ]
    assert entry["shortfall"].startswith("oracle: TaskError raised: resetting /tests")
    assert entry["error"] == "; ".join(
        f"{p.phase}: TaskError: {p.message}" for p in check.phase_errors
    )
    # the first typed error wins
    typed = TaskCheck(
        task_id="t",
        oracle=PhaseCheck(
            phase="oracle",
            error=CheckError(phase="oracle", error_type="VerifierError", message="wrote no reward"),
        ),
        noop=PhaseCheck(
            phase="noop",
            error=CheckError(phase="noop", error_type="SandboxLostError", message="gone"),
        ),
    )
    assert typed.shortfall() == "oracle: the verifier did not give a reward: wrote no reward"

    def ran(oracle: float | None, noop: float | None, code: int | None = 0) -> TaskCheck:
        return TaskCheck(
            task_id="t",
            oracle=PhaseCheck(
                phase="oracle", reward=oracle, solution_ran=True, solution_exit_code=code
            ),
            noop=PhaseCheck(phase="noop", reward=noop),
        )

    exited = ran(0.0, 0.0, code=2)
    assert exited.shortfall() == "oracle: the solution exited 2 and the verifier gave it 0.0"
    assert exited.oracle is not None and exited.oracle.outcome == "wrong_reward"
    assert ran(0.0, 0.0).shortfall() == (
        "oracle: the solution ran but the verifier gave it 0.0, not 1.0"
    )
    assert str(ran(1.0, 1.0).shortfall()).startswith(
        "noop: the untouched environment already scores"
    )
    # the tests the verifier read as failed are named, sorted, at most three
    named = ran(0.0, 0.0, code=1)
    assert named.oracle is not None
    named.oracle.failed_tests = failed_tests(
        {"tests": {f"t.py::test_{c}": "FAILED" for c in "dcba"} | {"t.py::test_ok": "PASSED"}}
    )
    assert named.shortfall() == (
        "oracle: the solution exited 1 and the verifier gave it 0.0; failing tests: "
        "t.py::test_a, t.py::test_b, t.py::test_c (+1 more)"
    )
    assert named.to_entry()["oracle_failed_tests"] == [f"t.py::test_{c}" for c in "abcd"]
    assert "noop_failed_tests" not in named.to_entry()  # the no-op's verifier named none
    clean = ran(1.0, 0.0)
    assert clean.shortfall() is None and clean.ok
    assert clean.to_entry()["oracle_exit_code"] == 0
    loaded = load_error_check("/x/broken", "TaskLoadError", "bad toml").to_entry()
    assert loaded["task_id"] == "broken" and loaded["error"] == "load: TaskLoadError: bad toml"
    assert loaded["phase_errors"][0]["error_type"] == "TaskLoadError"
    assert loaded["shortfall"] == "the task directory did not load: TaskLoadError: bad toml"


def test_failed_tests_are_the_failing_statuses_of_the_verifiers_per_test_results() -> None:
    """FAILED, ERROR and XPASS are failures; PASSED, XFAIL and SKIPPED are not; a verifier that
    reports no per-test results (a Harbor reward file) names none (None, not an empty list)."""
    tests = {
        "b::e": "ERROR",
        "a::f": "FAILED",
        "c::x": "XPASS",
        "p": "PASSED",
        "xf": "XFAIL",
        "s": "SKIPPED",
    }
    assert failed_tests({"tests": tests}) == ["a::f", "b::e", "c::x"]
    assert failed_tests({"tests": {"p": "PASSED"}}) == []
    assert failed_tests({"reward_file": "reward.txt"}) is None
