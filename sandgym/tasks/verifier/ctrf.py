"""Per-test results from a Harbor verifier's CTRF report, for naming the tests that failed.

Harbor's test scripts (Terminal-Bench 2.0's, TermiGen's and most others) run pytest with the
`pytest-json-ctrf` plugin, `pytest --ctrf /logs/verifier/ctrf.json ...`, and then write the
reward file from pytest's exit code. The reward file alone scores the episode, as Harbor scores
it (`sandgym.tasks.verifier.rewards.reward_from_files`); this report is read only to say *which* tests
failed (`VerifierResult.details["tests"]`, `tasks check`'s `failed_tests`). It never changes a
reward: the tests may import code the agent wrote, which could write anything here.

The report (Common Test Report Format, as pytest-json-ctrf 0.3.5 writes it) is
`{"results": {"tests": [{"name": NODEID, "status": "passed" | "failed" | "skipped" | "pending"
| "other", ...}, ...], ...}}`; a parametrised test is one entry under its name without the
parameters. Statuses are returned upper-cased, so `failed` reads as `FAILED`, as in a JUnit
report (`sandgym.tasks.verifier.rewards.FAIL_STATUSES`).
"""

from __future__ import annotations

import json


def ctrf_tests(text: str | None) -> dict[str, str] | None:
    """Test name -> upper-cased CTRF status, from the report's text; None when there is no
    report or it is not one (truncated, not JSON, no `results.tests` list): a report that
    cannot be read names no tests, and is never an error (the reward file scores)."""
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    results = doc.get("results") if isinstance(doc, dict) else None
    tests = results.get("tests") if isinstance(results, dict) else None
    if not isinstance(tests, list):
        return None
    out: dict[str, str] = {}
    for test in tests:
        if not isinstance(test, dict):
            continue
        name, status = test.get("name"), test.get("status")
        if isinstance(name, str) and isinstance(status, str):
            out[name] = status.upper()
    return out
