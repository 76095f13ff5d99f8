"""Scoring rules, as pure functions over text (the runtime fetches the text from the sandbox).

Reward files (Harbor): `/logs/verifier/reward.txt` holds one float; `/logs/verifier/reward.json`
holds either a number or an object. For an object the rule is: its `"reward"` key if present;
otherwise, when it has exactly one numeric value, that value; anything else (several metrics,
none numeric) is refused with `VerifierError`, because picking one silently would be a guess.
When both files exist, `reward.txt` wins (Harbor reads it first). A missing, empty,
unparseable or non-finite reward is a `VerifierError` carrying the test output, never a 0.

pytest summaries (Terminal-Bench, SETA): the `short test summary info` section of
`pytest -rA` (or `-v` result lines) gives each test's status. Terminal-Bench is all-or-nothing;
SETA is the weighted share of passed tests.

Answers (LLM-in-Sandbox): exact match after normalisation, or numeric match with tolerance.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction

from tasks.errors import VerifierError
from tasks.models import AnswerSpec

PASS_STATUSES = {"PASSED", "XFAIL"}
FAIL_STATUSES = {"FAILED", "ERROR", "XPASS"}


def _finite(value: float, where: str, output: str) -> float:
    if not math.isfinite(value):
        raise VerifierError(f"{where}: expected a finite reward, found {value!r}", output)
    return float(value)


def reward_from_files(txt: str | None, js: str | None, output: str = "") -> tuple[float, dict]:
    """Apply the reward-file rule above. `None` means the file does not exist."""
    if txt is not None:
        text = txt.strip()
        if not text:
            raise VerifierError("reward.txt is empty; expected one float", output)
        try:
            value = float(text.split()[0]) if len(text.split()) == 1 else float(text)
        except ValueError:
            raise VerifierError(
                f"reward.txt: expected one float, found {text[:80]!r}", output
            ) from None
        return _finite(value, "reward.txt", output), {"reward_file": "reward.txt"}
    if js is not None:
        if not js.strip():
            raise VerifierError("reward.json is empty; expected a number or an object", output)
        try:
            data = json.loads(js)
        except json.JSONDecodeError as exc:
            raise VerifierError(f"reward.json is not valid JSON: {exc}", output) from None
        details: dict = {"reward_file": "reward.json"}
        if isinstance(data, bool):
            raise VerifierError(f"reward.json: expected a number, found {data!r}", output)
        if isinstance(data, int | float):
            return _finite(float(data), "reward.json", output), details
        if isinstance(data, dict):
            details["rewards"] = data
            if "reward" in data:
                value = data["reward"]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise VerifierError(
                        f"reward.json: 'reward' must be a number, found {value!r}", output
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
            )
        raise VerifierError(f"reward.json: expected a number or object, found {data!r}", output)
    raise VerifierError(
        "the verifier wrote no reward: expected /logs/verifier/reward.txt or reward.json", output
    )


_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)")
_VERBOSE_LINE = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\b")


def _test_name(node: str) -> str:
    return node.split("::")[-1]


def parse_pytest_results(output: str) -> dict[str, str]:
    """Test name -> status, from pytest's `short test summary info` (or `-v` lines)."""
    results: dict[str, str] = {}
    marker = "short test summary info"
    if marker in output:
        section = output.split(marker, 1)[1]
        for line in section.splitlines():
            m = _SUMMARY_LINE.match(line.strip())
            if m and m.group(1) != "SKIPPED":
                results[_test_name(m.group(2))] = m.group(1)
    if not results:
        for line in output.splitlines():
            m = _VERBOSE_LINE.match(line.strip())
            if m and m.group(2) != "SKIPPED":
                results[_test_name(m.group(1))] = m.group(2)
    return results


def tbench_reward(output: str) -> tuple[float, dict]:
    """1.0 when every test in the summary passed, else 0.0; no summary is a VerifierError."""
    results = parse_pytest_results(output)
    if not results:
        raise VerifierError(
            "no pytest results in the test output: expected a 'short test summary info' "
            "section (pytest -rA) or verbose result lines",
            output,
        )
    passed = all(s in PASS_STATUSES for s in results.values())
    return (1.0 if passed else 0.0), {"tests": results}


def seta_reward(output: str, weights: dict[str, float]) -> tuple[float, dict]:
    """Weighted share of passed tests. Weighted tests missing from the output count as failed
    (a test file that did not even import must not score)."""
    results = parse_pytest_results(output)
    if not results:
        raise VerifierError("no pytest results in the test output (SETA task)", output)
    total = sum(weights.values())
    got = sum(w for name, w in weights.items() if results.get(name) in PASS_STATUSES)
    unweighted = sorted(set(results) - set(weights))
    return got / total, {"tests": results, "weights": weights, "unweighted_tests": unweighted}


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
