"""`sandgym tasks check` carries each error's cause from where it was raised to the reader that
classifies it (bench/harbor_compat.py), on the local backend (bubblewrap): a task that ships no
solution, and a verifier that runs past its timeout, each end to end through `check_task`, its
typed `CheckError`, its JSON line and `verdict`; the contract's joined `error` text unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import harbor_compat as hc
from sandboxes import get_backend
from sandboxes.errors import BackendUnavailableError
from tasks import load_task_dir
from tasks.check import check_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


@pytest.fixture
def local() -> object:
    try:
        return get_backend("local")
    except BackendUnavailableError as exc:
        pytest.skip(f"local backend unavailable: {exc}")


async def test_a_task_without_a_solution_reads_as_not_shipped(tmp_path: Path, local) -> None:
    task_dir = tmp_path / "no-solution"
    shutil.copytree(FIXTURES / "harbor-legacy", task_dir)
    shutil.rmtree(task_dir / "solution")
    toml = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(toml.replace('[solution]\nenv = { SOLVER = "oracle" }', ""))
    try:
        check = await check_task(load_task_dir(task_dir), local, {}, 0)
    finally:
        await local.aclose()
    assert check.oracle is not None and check.oracle.error is not None
    assert (check.oracle.error.error_type, check.oracle.error.cause) == (
        "TaskUnsupportedError",
        "no_oracle",
    )
    assert check.oracle.outcome == "error" and check.noop is not None
    assert (check.noop.outcome, check.noop_reward) == ("passed", 0.0)
    entry = check.to_entry()
    assert (
        entry["error"] == "oracle: TaskUnsupportedError: task no-solution ships no oracle solution"
    )
    assert entry["phase_errors"][0]["cause"] == "no_oracle"
    assert hc.verdict(entry) == ["oracle_not_shipped"]


async def test_a_verifier_past_its_timeout_reads_as_a_verifier_timeout(
    tmp_path: Path, local
) -> None:
    task_dir = tmp_path / "slow-verifier"
    shutil.copytree(FIXTURES / "harbor-legacy", task_dir)
    toml = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(toml.replace("timeout_sec = 90.0", "timeout_sec = 1.0"))
    test_sh = task_dir / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text().replace("mkdir -p", "sleep 30\nmkdir -p", 1))
    try:
        check = await check_task(load_task_dir(task_dir), local, {}, 0)
    finally:
        await local.aclose()
    errors = [(e.phase, e.error_type, e.cause) for e in check.phase_errors]
    assert errors == [
        ("oracle", "VerifierError", "timeout"),
        ("noop", "VerifierError", "timeout"),
    ]
    entry = check.to_entry()
    assert entry["error"].startswith("oracle: VerifierError: [timeout] task slow-verifier:")
    assert hc.verdict(entry) == ["verifier_timeout"]
