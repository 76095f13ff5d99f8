"""A Harbor verifier's CTRF report names the tests that failed (sandgym/tasks/verifier/ctrf.py): read from
the report the released pytest-json-ctrf (0.3.5, the version Terminal-Bench 2.0 pins) writes,
and a report that cannot be read names nothing instead of failing the episode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandgym.tasks import private_verify
from sandgym.tasks.check import failed_tests
from sandgym.tasks.verifier.ctrf import ctrf_tests

TESTS = """
import pytest

def test_ok():
    assert True

def test_broken():
    assert 4 in "four"

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

@pytest.fixture
def bad():
    raise RuntimeError("setup")

def test_setup_error(bad):
    pass
"""


@pytest.fixture(scope="module")
def real_report(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The CTRF report pytest-json-ctrf writes for TESTS, as a Harbor test script runs it."""
    root = tmp_path_factory.mktemp("ctrf")
    (root / "test_outputs.py").write_text(TESTS)
    report = root / "logs" / "ctrf.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--ctrf",
            str(report),
            str(root / "test_outputs.py"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return report.read_text()


def test_the_plugins_report_reads_as_each_tests_status(real_report: str) -> None:
    assert ctrf_tests(real_report) == {
        "test_outputs.py::test_ok": "PASSED",
        "test_outputs.py::test_broken": "FAILED",
        "test_outputs.py::test_param": "FAILED",  # one of its parameters failed
        "test_outputs.py::test_skipped": "SKIPPED",
        "test_outputs.py::test_setup_error": "FAILED",  # failed in its setup
    }


def test_the_failed_ones_are_named_sorted(real_report: str) -> None:
    tests = ctrf_tests(real_report)
    assert tests is not None
    assert failed_tests({"tests": tests}) == [
        "test_outputs.py::test_broken",
        "test_outputs.py::test_param",
        "test_outputs.py::test_setup_error",
    ]


@pytest.mark.parametrize(
    "text",
    [None, "", "{", "[]", "3", '{"results": {}}', '{"results": {"tests": {}}}', '{"results": 1}'],
)
def test_no_report_or_not_a_report_names_nothing(text: str | None) -> None:
    assert ctrf_tests(text) is None


def test_a_cut_report_names_nothing(real_report: str) -> None:
    assert ctrf_tests(real_report[: len(real_report) // 2]) is None


def test_entries_without_a_name_or_status_are_passed_over() -> None:
    text = '{"results": {"tests": [1, {"name": "a"}, {"status": "failed"}, {"name": "b", "status": "failed"}]}}'
    assert ctrf_tests(text) == {"b": "FAILED"}


def test_the_private_wrapper_reports_the_ctrf_file_only_up_to_its_cap(tmp_path: Path) -> None:
    """The wrapper's report block carries ctrf.json when it is at most CTRF_MAX_BYTES, and
    leaves a larger one out whole (never cut, never pushing the block past a stderr cap); the
    scored files are reported either way. Run with its /logs/verifier as a plain directory."""
    logs = tmp_path / "logs"

    def run(ctrf_bytes: int) -> dict[str, str]:
        if logs.exists():
            for f in logs.iterdir():
                f.unlink()
        logs.mkdir(exist_ok=True)
        script = (
            f"printf 1 > {logs}/reward.txt; "
            f"head -c {ctrf_bytes} /dev/zero | tr '\\0' x > {logs}/ctrf.json"
        )
        wrapper = private_verify.WRAPPER.replace("/logs/verifier", str(logs))
        body = wrapper.split("exec 3>&2 2>&1", 1)[1]  # from the script on: no mounts, no tar
        nonce = "n0nce"
        res = subprocess.run(
            ["sh", "-c", f"nonce={nonce}\nexec 3>&2 2>&1{body}", "w", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return private_verify.parse_report(res.stderr, nonce, res.stdout).files

    small = run(private_verify.CTRF_MAX_BYTES)
    assert small["reward.txt"] == "1"
    assert small[private_verify.CTRF_FILE] == "x" * private_verify.CTRF_MAX_BYTES
    big = run(private_verify.CTRF_MAX_BYTES + 1)
    assert big["reward.txt"] == "1"
    assert private_verify.CTRF_FILE not in big
