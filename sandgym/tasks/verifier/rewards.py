"""Scoring rules, as pure functions over text (the runtime fetches the text from the sandbox).

Reward files (Harbor): `/logs/verifier/reward.txt` holds one float; `/logs/verifier/reward.json`
holds either a number or an object. For an object the rule is: its `"reward"` key if present;
otherwise, when it has exactly one numeric value, that value; anything else (several metrics,
none numeric) is refused with `VerifierError`, because picking one silently would be a guess.
When both files exist, `reward.txt` wins (Harbor reads it first). A missing, empty,
unparseable or non-finite reward is a `VerifierError` carrying the test output, never a 0; a
reward outside [0, 1] (or the range the task declares in `metadata.reward_range`) is a
`RewardOutOfRangeError`.

pytest results (Terminal-Bench, SETA): pytest's own machine-readable report, a JUnit XML file
the runtime asks for (`PYTEST_ADDOPTS=--junitxml=...` pointing into the verifier's private
/logs/verifier, sandgym/tasks/verifier/run.py), is the source when it exists. Only when no report was
written is the text read instead: the `short test summary info` section of `pytest -rA` (or `-v`
result lines); the details then say `result_source: "text"`, because code the tests import from the
agent's files can print a fake summary. A pass also needs the test script's exit code to be 0
(when it is known). Terminal-Bench is all-or-nothing; SETA is the weighted share of passed tests.

SETA weights: a weight key names a test by its function name (`test_x`), and matches every
parametrisation of it (`test_x[1]`, `test_x[2]`), which share its weight in proportion to how
many of them passed; a key with parameters (`test_x[1]`) matches that one test. A weight that
matches no test, or a test that matches no weight, is a `VerifierError` (`weights_mismatch`):
the reward would otherwise be silently partial.

Answers (LLM-in-Sandbox): exact match after normalisation, or numeric match with tolerance.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from fractions import Fraction

from sandgym.tasks.errors import RewardOutOfRangeError, VerifierError
from sandgym.tasks.models import AnswerSpec

PASS_STATUSES = {"PASSED", "XFAIL"}
FAIL_STATUSES = {"FAILED", "ERROR", "XPASS"}
#: what Terminal-Bench 1's harness counts as passed (`PytestTestStatus.to_test_status`)
TBENCH_PASS_STATUSES = PASS_STATUSES | {"SKIPPED"}


def _finite(value: float, where: str, output: str) -> float:
    if not math.isfinite(value):
        raise VerifierError(
            f"{where}: expected a finite reward, found {value!r}", output, cause="bad_reward"
        )
    return float(value)


#: the reward range a task gets unless it declares another (`metadata.reward_range`)
DEFAULT_REWARD_RANGE = (0.0, 1.0)


def reward_from_files(
    txt: str | None,
    js: str | None,
    output: str = "",
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE,
) -> tuple[float, dict]:
    """Apply the reward-file rule above. `None` means the file does not exist. A reward outside
    `reward_range` (inclusive) is refused with `RewardOutOfRangeError`."""
    value, details = _reward_from_files(txt, js, output)
    lo, hi = reward_range
    if not lo <= value <= hi:
        raise RewardOutOfRangeError(
            f"{details['reward_file']}: reward {value!r} is outside the task's range "
            f"[{lo:g}, {hi:g}] (a task may declare another with metadata.reward_range)",
            output,
        )
    return value, details


def _reward_from_files(txt: str | None, js: str | None, output: str) -> tuple[float, dict]:
    if txt is not None:
        text = txt.strip()
        if not text:
            raise VerifierError(
                "reward.txt is empty; expected one float", output, cause="bad_reward"
            )
        try:
            value = float(text.split()[0]) if len(text.split()) == 1 else float(text)
        except ValueError:
            raise VerifierError(
                f"reward.txt: expected one float, found {text[:80]!r}", output, cause="bad_reward"
            ) from None
        return _finite(value, "reward.txt", output), {"reward_file": "reward.txt"}
    if js is not None:
        if not js.strip():
            raise VerifierError(
                "reward.json is empty; expected a number or an object", output, cause="bad_reward"
            )
        try:
            data = json.loads(js)
        except json.JSONDecodeError as exc:
            raise VerifierError(
                f"reward.json is not valid JSON: {exc}", output, cause="bad_reward"
            ) from None
        details: dict = {"reward_file": "reward.json"}
        if isinstance(data, bool):
            raise VerifierError(
                f"reward.json: expected a number, found {data!r}", output, cause="bad_reward"
            )
        if isinstance(data, int | float):
            return _finite(float(data), "reward.json", output), details
        if isinstance(data, dict):
            details["rewards"] = data
            if "reward" in data:
                value = data["reward"]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise VerifierError(
                        f"reward.json: 'reward' must be a number, found {value!r}",
                        output,
                        cause="bad_reward",
                    )
                return _finite(float(value), "reward.json", output), details
            numeric = [
                v for v in data.values() if isinstance(v, int | float) and not isinstance(v, bool)
            ]
            if len(numeric) == 1:
                return _finite(float(numeric[0]), "reward.json", output), details
            raise VerifierError(
                "reward.json: expected a 'reward' key or exactly one numeric value, "
                f"found keys {sorted(data)}",
                output,
                cause="bad_reward",
            )
        raise VerifierError(
            f"reward.json: expected a number or object, found {data!r}", output, cause="bad_reward"
        )
    raise VerifierError(
        "the verifier wrote no reward: expected /logs/verifier/reward.txt or reward.json",
        output,
        cause="no_reward",
    )


_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)")
_VERBOSE_LINE = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\b")


def _test_name(node: str) -> str:
    """`tests/t.py::TestC::test_x[a::b]` -> `test_x[a::b]` (parameters may hold `::`)."""
    head, bracket, params = node.partition("[")
    return head.split("::")[-1] + bracket + params


def base_test_name(node: str) -> str:
    """A test id without its path, class and parameters: `t.py::TestC::test_x[1]` -> `test_x`."""
    return node.partition("[")[0].split("::")[-1]


def parse_pytest_results(output: str, skipped: bool = False) -> dict[str, str]:
    """Test name -> status, from pytest's `short test summary info` (or `-v` lines). Skipped
    tests are left out unless `skipped` (Terminal-Bench 1 counts them: `tbench_reward`)."""
    results: dict[str, str] = {}
    marker = "short test summary info"
    if marker in output:
        section = output.split(marker, 1)[1]
        for line in section.splitlines():
            m = _SUMMARY_LINE.match(line.strip())
            if m and (skipped or m.group(1) != "SKIPPED"):
                results[_test_name(m.group(2))] = m.group(1)
    if not results:
        for line in output.splitlines():
            m = _VERBOSE_LINE.match(line.strip())
            if m and (skipped or m.group(2) != "SKIPPED"):
                results[_test_name(m.group(1))] = m.group(2)
    return results


def parse_junit_xml(xml: str, output: str = "") -> dict[str, str]:
    """Test id (`classname::name`) -> status, from pytest's `--junitxml` report. Statuses as in
    the text summary: PASSED, FAILED, ERROR (also a collection error), XFAIL, SKIPPED; a strict
    XPASS is reported by pytest as a failure. An unreadable report is a `VerifierError`."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise VerifierError(
            f"the pytest JUnit report is not valid XML: {exc}", output, cause="bad_report"
        ) from None
    if root.tag not in ("testsuites", "testsuite"):
        raise VerifierError(
            f"the pytest JUnit report has root <{root.tag}>, expected <testsuites>",
            output,
            cause="bad_report",
        )
    results: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = case.get("name") or ""
        classname = case.get("classname") or ""
        node = f"{classname}::{name}" if classname else name
        tags = {child.tag: child for child in case}
        if "error" in tags:
            status = "ERROR"
        elif "failure" in tags:
            status = "FAILED"
        elif "skipped" in tags:
            status = "XFAIL" if tags["skipped"].get("type") == "pytest.xfail" else "SKIPPED"
        else:
            status = "PASSED"
        # a test that passed and then failed its teardown appears twice: the worse one counts
        if results.get(node) in FAIL_STATUSES and status not in FAIL_STATUSES:
            continue
        results[node] = status
    return results


def _pytest_results(
    output: str, junit: str | None, skipped: bool = False
) -> tuple[dict[str, str], dict[str, object]]:
    """The results and how they were read (`result_source`: junit, or text as a fallback)."""
    if junit is not None:
        return parse_junit_xml(junit, output), {"result_source": "junit"}
    return parse_pytest_results(output, skipped), {
        "result_source": "text",
        "result_warning": "no pytest JUnit report was written; scored from the printed "
        "summary, which code under test can forge",
    }


def _exit_code_vetoes(passed: bool, exit_code: int | None, details: dict) -> bool:
    """A pass needs the test script to have exited 0 (when its exit code is known)."""
    if passed and exit_code not in (None, 0):
        details["exit_code_mismatch"] = (
            f"pytest reported every test passed but the test script exited {exit_code}: not a pass"
        )
        return True
    return False


def _mark_unexpected_passes(results: dict[str, str], output: str, details: dict) -> None:
    """A non-strict xfail test that passed is a plain pass in pytest's JUnit report but `XPASS`
    in its printed summary, which Terminal-Bench's parser counts as FAILED: a JUnit pass that the
    summary lists as XPASS is marked XPASS. The summary is text that code under test could
    print; it is read here only to lower a pass, never to raise one."""
    xpassed = {name for name, st in parse_pytest_results(output).items() if st == "XPASS"}
    marked = sorted(k for k, st in results.items() if st == "PASSED" and _test_name(k) in xpassed)
    for key in marked:
        results[key] = "XPASS"
    if marked:
        details["xpass_from_summary"] = marked


def tbench_reward(
    output: str, junit: str | None = None, exit_code: int | None = None
) -> tuple[float, dict]:
    """1.0 when every test pytest reported passed, was skipped or failed as expected (and the
    script exited 0), else 0.0; no results at all is a VerifierError (cause `no_results`).
    `junit` is pytest's JUnit report when one was written (see module doc).

    Skipped tests count as passed, as in Terminal-Bench's own harness (terminal-bench 0.2.18,
    `parsers/pytest_parser.py`: SKIPPED and XFAIL map to `UnitTestStatus.PASSED`, and
    `Harness._is_resolved` wants every parsed test PASSED), so tests that all skip resolve the
    trial there and score 1.0 here, and a non-strict xfail test that passed (XPASS) fails it
    (`_mark_unexpected_passes`). A run with no results is what that harness calls
    `FailureMode.PARSE_ERROR`; `sandgym.tasks.verifier.run` scores it as the harness does."""
    results, details = _pytest_results(output, junit, skipped=True)
    if junit is not None:
        _mark_unexpected_passes(results, output, details)
    if not results:
        raise VerifierError(
            "no pytest results: expected a JUnit report, a 'short test summary info' "
            "section (pytest -rA) or verbose result lines",
            output,
            cause="no_results",
        )
    passed = all(s in TBENCH_PASS_STATUSES for s in results.values())
    if _exit_code_vetoes(passed, exit_code, details):
        passed = False
    return (1.0 if passed else 0.0), {"tests": results, **details}


def _weight_key_for(node: str, weights: dict[str, float]) -> str | None:
    """The weight key a test id matches: the id itself, its name with parameters, or its base
    name (parameters stripped), most specific first."""
    for key in (node, _test_name(node), base_test_name(node)):
        if key in weights:
            return key
    return None


def seta_reward(
    output: str,
    weights: dict[str, float],
    junit: str | None = None,
    exit_code: int | None = None,
) -> tuple[float, dict]:
    """Weighted share of passed tests (see module doc for the matching rule). A weight that
    matches no test that ran (a test file that did not even import) or a test that matches no
    weight is a `VerifierError`, never a silently partial reward."""
    results, details = _pytest_results(output, junit)
    if not results:
        raise VerifierError(
            "no pytest results in the test output (SETA task)", output, cause="no_results"
        )
    by_key: dict[str, list[str]] = {}
    unweighted: list[str] = []
    for node, status in results.items():
        key = _weight_key_for(node, weights)
        if key is None:
            unweighted.append(node)
        else:
            by_key.setdefault(key, []).append(status)
    unmatched = sorted(k for k in weights if k not in by_key)
    if unmatched or unweighted:
        raise VerifierError(
            "SETA weights and tests do not match: weights matching no test "
            f"{unmatched[:20]}, tests matching no weight {sorted(unweighted)[:20]}",
            output,
            cause="weights_mismatch",
        )
    total = sum(weights.values())
    got = 0.0
    for key, statuses in by_key.items():
        got += weights[key] * sum(s in PASS_STATUSES for s in statuses) / len(statuses)
    reward = got / total
    if _exit_code_vetoes(reward >= 1.0, exit_code, details):
        reward = 0.0
    return reward, {"tests": results, "weights": weights, **details}


_BOXED = re.compile(r"\\boxed\{(.*)\}", re.DOTALL)


def normalize_answer(text: str) -> str:
    """Case-folded, whitespace-collapsed, `\\boxed{}` and surrounding quotes/periods removed."""
    text = text.strip()
    m = _BOXED.search(text)
    if m:
        text = m.group(1)
    text = " ".join(text.split()).strip().strip("\"'`").rstrip(".").strip()
    return text.casefold()


def parse_number(text: str) -> float | None:
    """A float from '1,234.5', '3/4', '12%', '$5', '\\boxed{2}'; None when it is no number."""
    t = normalize_answer(text).replace(",", "").replace("$", "").strip()
    percent = t.endswith("%")
    t = t.rstrip("%").strip()
    try:
        value = float(Fraction(t)) if "/" in t else float(t)
    except (ValueError, ZeroDivisionError):
        return None
    if not math.isfinite(value):
        return None
    return value / 100 if percent else value


def answer_reward(answer: str | None, spec: AnswerSpec) -> tuple[float, dict]:
    """Score the agent's answer file. No file is the agent's failure (0.0), not the verifier's."""
    details: dict = {"match": spec.match, "answer": answer}
    if answer is None or not answer.strip():
        details["reason"] = f"no answer in {spec.answer_path}"
        return 0.0, details
    if spec.match == "numeric":
        got, want = parse_number(answer), parse_number(spec.ground_truth)
        if want is None:
            raise VerifierError(
                f"numeric match needs a numeric ground truth, found {spec.ground_truth!r}"
            )
        ok = got is not None and math.isclose(got, want, rel_tol=spec.rel_tol, abs_tol=spec.abs_tol)
        return (1.0 if ok else 0.0), details
    ok = normalize_answer(answer) == normalize_answer(spec.ground_truth)
    return (1.0 if ok else 0.0), details
