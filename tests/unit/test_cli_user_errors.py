"""A user's typo on the command line is one line saying what was expected and what was found,
with a non-zero exit code: never a traceback, never an empty table with exit 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.cli.main import main
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings


def test_run_unknown_task_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--task", "builtin/nope", "--backend", "null"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("sandgym run:")]
    assert len(lines) == 1, err
    assert "builtin/nope" in lines[0] and "did you mean" in lines[0]
    assert "Traceback" not in err


def test_eval_unknown_task_runs_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    with BackgroundServer(ServerSettings(backend="null", port=0)) as srv:
        rc = main(
            [
                "eval",
                "--server-url",
                srv.url,
                "--tasks",
                "builtin/hello-file",
                "builtin/nope",
                "--agent",
                "noop",
                "--out",
                str(out),
                "--json",
            ]
        )
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""  # no table
    assert "'builtin/nope'" in captured.err and "hello-file" not in captured.err.split("did")[0]
    assert not out.exists()  # no episode was played


def test_eval_without_server_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(
        [
            "eval",
            "--server-url",
            "ws://127.0.0.1:9/v1/env",
            "--tasks",
            "builtin/hello-file",
            "--agent",
            "noop",
            "--out",
            str(tmp_path / "e.jsonl"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "could not list the tasks of the env server ws://127.0.0.1:9/v1/env" in err


def test_run_llm_unknown_task_is_one_line_before_a_model_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["run", "--task", "builtin/nope", "--agent", "llm", "--model", "tiny"])
    err = capsys.readouterr().err
    assert rc == 2
    assert [ln for ln in err.splitlines() if ln.startswith("sandgym run:")], err
    assert "Traceback" not in err


def test_tasks_check_missing_path_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = main(["tasks", "check", str(tmp_path / "nope"), "--backend", "null"])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""  # no FAIL table for a typo
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("sandgym tasks check:")]
    assert len(lines) == 1, captured.err
    assert str(tmp_path / "nope") in lines[0] and "expected a task or dataset directory" in lines[0]


def test_tasks_list_missing_dir_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = main(["tasks", "list", "--tasks", str(tmp_path / "nope")])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    assert captured.err.count("sandgym tasks list:") == 1
    assert str(tmp_path / "nope") in captured.err
