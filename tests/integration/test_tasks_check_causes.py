"""`sandgym tasks check` carries each error's cause from where it was raised to the reader that
classifies it (lab/bench/harbor_compat.py), on the local backend (bubblewrap): a task that ships no
solution, and a verifier that runs past its timeout, each end to end through `check_task`, its
typed `CheckError`, its JSON line and `verdict`; the contract's joined `error` text unchanged.
Failing tests are named from the verifier's per-test results (JUnit; Harbor's CTRF report)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from lab.bench import harbor_compat as hc
from sandgym.sandboxes import get_backend
from sandgym.sandboxes.errors import BackendUnavailableError
from sandgym.tasks import load_task_dir
from sandgym.tasks.check import TaskCheck, check_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


@pytest.fixture
def local() -> object:
    try:
        return get_backend("local")
    except BackendUnavailableError as exc:
        pytest.skip(f"local backend unavailable: {exc}")


async def _check(task_dir: Path, local) -> TaskCheck:
    """`check_task` on the task directory, with the backend closed afterwards."""
    try:
        return await check_task(load_task_dir(task_dir), local, {}, 0)
    finally:
        await local.aclose()


async def test_a_task_without_a_solution_reads_as_not_shipped(tmp_path: Path, local) -> None:
    task_dir = tmp_path / "no-solution"
    shutil.copytree(FIXTURES / "harbor-legacy", task_dir)
    shutil.rmtree(task_dir / "solution")
    toml = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(toml.replace('[solution]\nenv = { SOLVER = "oracle" }', ""))
    check = await _check(task_dir, local)
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
    check = await _check(task_dir, local)
    errors = [(e.phase, e.error_type, e.cause) for e in check.phase_errors]
    assert errors == [
        ("oracle", "VerifierError", "timeout"),
        ("noop", "VerifierError", "timeout"),
    ]
    entry = check.to_entry()
    assert entry["error"].startswith("oracle: VerifierError: [timeout] task slow-verifier:")
    assert hc.verdict(entry) == ["verifier_timeout"]


async def test_terminal_bench_1_tests_past_their_limit_score_0_not_an_error(
    tmp_path: Path, local
) -> None:
    """A Terminal-Bench 1 task's tests past max_test_timeout_sec: unresolved, as its harness
    scores it: 0.0 with the reason on each phase's line, no error (never an infra retry, never a
    pass); the oracle's line is failing and says why; the Harbor task above still errors."""
    task_dir = tmp_path / "slow-tests"
    shutil.copytree(FIXTURES / "tbench-modern", task_dir)
    yaml = (task_dir / "task.yaml").read_text()
    (task_dir / "task.yaml").write_text(
        yaml.replace("max_test_timeout_sec: 30", "max_test_timeout_sec: 1")
    )
    run_tests = task_dir / "run-tests.sh"
    run_tests.write_text(run_tests.read_text().replace("#!/bin/bash\n", "#!/bin/bash\nsleep 30\n"))
    check = await _check(task_dir, local)
    assert check.phase_errors == []
    assert check.oracle is not None and check.noop is not None
    assert (check.oracle.reward, check.oracle.verifier_reason) == (0.0, "test_timeout")
    assert (check.noop.reward, check.noop.verifier_reason) == (0.0, "test_timeout")
    entry = check.to_entry()
    assert entry["error"] is None
    assert (entry["oracle_verifier_reason"], entry["noop_verifier_reason"]) == (
        "test_timeout",
        "test_timeout",
    )
    assert entry["shortfall"].startswith("oracle: the tests did not finish within")
    reasons, outcome = hc.judge(entry)
    assert reasons == ["test_timeout", "oracle_below_one"]
    assert (outcome.category, outcome.reason) == ("failing", "test_timeout")
    assert not hc.infra_only({"reasons": reasons})


async def test_terminal_bench_1_tests_that_report_nothing_score_0_not_an_error(
    tmp_path: Path, local
) -> None:
    """A Terminal-Bench 1 task whose tests print no pytest result (its pytest is missing):
    unresolved, as its harness scores it (PARSE_ERROR): 0.0 with the reason on each phase's
    line, no error; the oracle's line is failing, and what stopped the tests is named."""
    task_dir = tmp_path / "no-pytest"
    shutil.copytree(FIXTURES / "tbench-modern", task_dir)
    (task_dir / "run-tests.sh").write_text(
        '#!/bin/bash\necho "$0: line 2: pytest: command not found"\nexit 127\n'
    )
    check = await _check(task_dir, local)
    assert check.phase_errors == []
    assert check.oracle is not None and check.noop is not None
    assert (check.oracle.reward, check.oracle.verifier_reason) == (0.0, "parse_error")
    assert (check.noop.reward, check.noop.verifier_reason) == (0.0, "parse_error")
    entry = check.to_entry(detail=True)  # the outputs, as the compat bench records them
    assert entry["error"] is None
    assert entry["shortfall"].startswith("oracle: the tests reported no result (parse_error")
    reasons, outcome = hc.judge(entry)
    assert reasons == ["parse_error", "verifier_tool_missing", "oracle_below_one"]
    assert (outcome.category, outcome.reason) == ("failing", "parse_error")


async def test_an_oracle_short_of_its_tests_names_the_tests_that_failed(
    tmp_path: Path, local
) -> None:
    """A Terminal-Bench 1 task whose tests fail for the oracle: the check's line names the
    failing tests (from the verifier's per-test results, not its text), and so does the one
    reason a maintainer reads (`shortfall`, the report's `action`)."""
    task_dir = tmp_path / "broken-test"
    shutil.copytree(FIXTURES / "tbench-modern", task_dir)
    tests = task_dir / "tests" / "test_outputs.py"
    tests.write_text(tests.read_text() + "\n\ndef test_broken():\n    assert 4 in 'four'\n")
    check = await _check(task_dir, local)
    assert check.phase_errors == []
    assert check.oracle is not None and check.noop is not None
    assert check.oracle.reward == 0.0
    broken = "test_outputs::test_broken"  # pytest's JUnit classname::name
    assert check.oracle.failed_tests == [broken]
    assert check.noop.failed_tests == [broken, "test_outputs::test_count"]
    entry = check.to_entry(detail=True)
    assert entry["oracle_failed_tests"] == [broken]
    assert entry["shortfall"] == (
        f"oracle: the solution ran but the verifier gave it 0.0, not 1.0; failing tests: {broken}"
    )
    reasons, outcome = hc.judge(entry)
    assert (outcome.category, outcome.reason) == ("failing", "oracle_below_one")
    assert outcome.action == entry["shortfall"]


#: a Harbor test script as Terminal-Bench 2.0 writes them (pytest with the CTRF plugin, then the
#: reward file from pytest's exit code). Terminal-Bench 2.0 gets pytest 8.4.1 and the plugin from
#: uvx; here the released packages this checkout's dev extras installed (pytest, the plugin,
#: which needs pytest >= 7.3, and pytest's own dependencies) go in on PYTHONPATH from /tests:
#: the local sandbox's python3 has only Debian's older pytest
HARBOR_CTRF_TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
PYTHONPATH=/tests/vendor python3 -m pytest -p ctrf.main --ctrf /logs/verifier/ctrf.json \\
  /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""

HARBOR_CTRF_TESTS = """from pathlib import Path

def test_reversed():
    assert Path("/app/out/reversed.txt").read_text().split() == ["gamma", "beta", "alpha"]

def test_broken():
    assert 4 in "four"
"""


#: pytest-json-ctrf (`ctrf`, a dev dependency), pytest and what pytest imports
VENDORED = ("ctrf", "pytest", "_pytest", "pluggy", "iniconfig", "packaging")


def _harbor_ctrf_task(tmp_path: Path, name: str, test_sh: str) -> Path:
    """harbor-legacy with TB2-style tests: test_reversed (the oracle passes it) and test_broken
    (nothing passes it), reported by pytest-json-ctrf to /logs/verifier/ctrf.json."""
    task_dir = tmp_path / name
    shutil.copytree(FIXTURES / "harbor-legacy", task_dir)
    tests = task_dir / "tests"
    (tests / "test.sh").write_text(test_sh)
    (tests / "test_outputs.py").write_text(HARBOR_CTRF_TESTS)
    for package in VENDORED:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} not installed"
        shutil.copytree(spec.submodule_search_locations[0], tests / "vendor" / package)
    return task_dir


async def test_a_harbor_oracle_short_of_its_tests_names_them_from_its_ctrf_report(
    tmp_path: Path, local
) -> None:
    """A Harbor task whose tests fail for the oracle: its reward file scores 0, and the failing
    tests are named from the CTRF report its tests wrote (carried out of the private verifier
    namespace), on the line and in the shortfall."""
    check = await _check(_harbor_ctrf_task(tmp_path, "harbor-ctrf", HARBOR_CTRF_TEST_SH), local)
    assert check.phase_errors == []
    assert check.oracle is not None and check.noop is not None
    assert (check.oracle.reward, check.noop.reward) == (0.0, 0.0)
    broken = "test_outputs.py::test_broken"  # pytest's node id, as the plugin writes it
    assert check.oracle.failed_tests == [broken]
    assert check.noop.failed_tests == [broken, "test_outputs.py::test_reversed"]
    entry = check.to_entry(detail=True)
    assert entry["oracle_failed_tests"] == [broken]
    assert entry["shortfall"] == (
        f"oracle: the solution ran but the verifier gave it 0.0, not 1.0; failing tests: {broken}"
    )


async def test_a_harbor_ctrf_report_names_tests_but_never_scores(tmp_path: Path, local) -> None:
    """The reward file alone scores a Harbor task: a script that writes 1 whatever pytest says
    gets 1.0, though its CTRF report names a failing test."""
    always_one = HARBOR_CTRF_TEST_SH.replace(
        "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; "
        "else echo 0 > /logs/verifier/reward.txt; fi",
        "echo 1 > /logs/verifier/reward.txt",
    )
    assert always_one != HARBOR_CTRF_TEST_SH
    check = await _check(_harbor_ctrf_task(tmp_path, "harbor-ctrf-one", always_one), local)
    assert check.oracle is not None and check.noop is not None
    assert (check.oracle.reward, check.noop.reward) == (1.0, 1.0)
    assert check.oracle.failed_tests == ["test_outputs.py::test_broken"]
