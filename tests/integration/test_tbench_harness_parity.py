"""Terminal-Bench 1 scoring against that benchmark's own released harness (terminal-bench 0.2.18,
images/terminal-bench-harness): each case below is a real pytest run (8.4.1, as its task images
run) in that package's container; the package scores it with its own `PytestParser` and
`Harness._is_resolved` (a parse failure is its `FailureMode.PARSE_ERROR`, unresolved), and
sandgym scores the same run's JUnit report and output as `sandgym.tasks.verifier.run` does for a
`tbench` task. The two verdicts must agree on every case."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lab.bench.harbor_runner import ensure_runner_image
from sandgym.tasks.errors import VerifierError
from sandgym.tasks.verifier.rewards import tbench_reward
from tests.reliability.conftest import docker_ready

REPO = Path(__file__).resolve().parents[2]
IMAGE = "sandgym/terminal-bench-harness:0.2.18"

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_ready(), reason="no Docker engine"),
    pytest.mark.timeout(900),
]

HEAD = "import pytest\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError('setup')\n\n"

#: case -> the test file's body (after HEAD); None: pytest is never run (it is missing)
CASES: dict[str, str | None] = {
    "all_pass": "def test_a(): pass\ndef test_b(): assert 1\n",
    "one_fails": "def test_a(): pass\ndef test_b(): assert 0\n",
    "all_skipped": "@pytest.mark.skip\ndef test_a(): pass\n",
    "skip_and_pass": "@pytest.mark.skip\ndef test_a(): pass\ndef test_b(): pass\n",
    "skip_and_fail": "def test_a(): pytest.skip('no service')\ndef test_b(): assert 0\n",
    "xfail": "@pytest.mark.xfail\ndef test_a(): assert 0\ndef test_b(): pass\n",
    "xpass": "@pytest.mark.xfail\ndef test_a(): pass\ndef test_b(): pass\n",
    "xpass_strict": "@pytest.mark.xfail(strict=True)\ndef test_a(): pass\n",
    "setup_error": "def test_a(broken): pass\ndef test_b(): pass\n",
    "collection_error": "import no_such_module\ndef test_a(): pass\n",
    "no_tests": "X = 1\n",
    "pytest_missing": None,
}

#: run in the harness container: run each case's tests and score them with the package
HARNESS = """
import json, os, pathlib, subprocess
from terminal_bench.harness.harness import Harness
from terminal_bench.parsers.pytest_parser import PytestParser

verdicts = {}
for case in sorted(pathlib.Path("/cases").iterdir()):
    run = subprocess.run(["bash", "run.sh"], cwd=case, capture_output=True, text=True)
    pane = run.stdout + run.stderr
    (case / "output.txt").write_text(pane)
    (case / "exit_code").write_text(str(run.returncode))
    try:  # Harness._parse_results: any exception is FailureMode.PARSE_ERROR, unresolved
        results = PytestParser().parse(pane)
    except Exception as exc:
        verdicts[case.name] = {"resolved": False, "failure_mode": "parse_error", "why": str(exc)}
        continue
    verdicts[case.name] = {
        "resolved": Harness._is_resolved(None, results),
        "failure_mode": "none",
        "results": {k: v.value for k, v in results.items()},
    }
print(json.dumps(verdicts))
"""


def _write_cases(root: Path) -> None:
    for name, body in CASES.items():
        case = root / name
        case.mkdir(parents=True)
        if body is None:
            run = 'echo "run-tests.sh: line 3: pytest: command not found"; exit 127\n'
        else:
            (case / "test_outputs.py").write_text(HEAD + body)
            run = "python -m pytest -rA --junitxml=junit.xml test_outputs.py -p no:cacheprovider\n"
        (case / "run.sh").write_text("#!/bin/bash\n" + run)


def _sandgym_resolved(case: Path) -> tuple[bool, str]:
    """sandgym's verdict on one run, as sandgym.tasks.verifier.run scores a `tbench` task: a pass is
    reward 1.0; no result at all is `parse_error`, reward 0.0."""
    junit = case / "junit.xml"
    output = (case / "output.txt").read_text()
    exit_code = int((case / "exit_code").read_text())
    try:
        reward, _ = tbench_reward(output, junit.read_text() if junit.exists() else None, exit_code)
    except VerifierError as exc:
        assert exc.cause == "no_results", exc
        return False, "parse_error"
    return reward == 1.0, "none"


def test_terminal_bench_1_verdicts_match_its_released_harness(tmp_path: Path) -> None:
    ensure_runner_image(IMAGE, context=REPO / "images" / "terminal-bench-harness")
    cases = tmp_path / "cases"
    _write_cases(cases)
    cases.chmod(0o777)
    for d in cases.iterdir():
        d.chmod(0o777)
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{cases}:/cases",
         "-e", "LITELLM_LOCAL_MODEL_COST_MAP=True", IMAGE, "python", "-c", HARNESS],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(theirs) == sorted(CASES)
    ours = {name: _sandgym_resolved(cases / name) for name in CASES}
    mismatched = {
        name: (theirs[name], ours[name])
        for name in CASES
        if (theirs[name]["resolved"], theirs[name]["failure_mode"]) != ours[name]
    }
    assert mismatched == {}
    # the cases cover both verdicts and the harness's parse failure
    assert ours["all_pass"] == ours["all_skipped"] == (True, "none")
    assert ours["one_fails"] == ours["xpass"] == (False, "none")
    assert ours["pytest_missing"] == ours["no_tests"] == (False, "parse_error")
