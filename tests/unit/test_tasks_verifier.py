"""Scoring rules: reward files, pytest summaries (Terminal-Bench, SETA), answers."""

from __future__ import annotations

import math

import pytest

from sandgym.tasks.errors import RewardOutOfRangeError, VerifierError
from sandgym.tasks.models import AnswerSpec
from sandgym.tasks.verifier import (
    answer_reward,
    parse_junit_xml,
    parse_number,
    parse_pytest_results,
    reward_from_files,
    seta_reward,
    tbench_reward,
)


@pytest.mark.parametrize(
    "txt, js, want",
    [
        ("1\n", None, 1.0),
        (" 0.25 ", None, 0.25),
        (None, '{"reward": 0.5, "accuracy": 0.9}', 0.5),
        (None, '{"score": 0.75}', 0.75),  # exactly one numeric value
        (None, "1", 1.0),
        ("0", '{"reward": 1}', 0.0),  # reward.txt wins, as in Harbor
    ],
)
def test_reward_files(txt: str | None, js: str | None, want: float) -> None:
    assert reward_from_files(txt, js)[0] == want


@pytest.mark.parametrize(
    "txt, js, message",
    [
        (None, None, "no reward"),
        ("", None, "empty"),
        ("yes", None, "one float"),
        ("nan", None, "finite"),
        (None, "{", "not valid JSON"),
        (None, '{"a": 1, "b": 2}', "exactly one numeric"),
        (None, '{"reward": "high"}', "must be a number"),
        (None, "true", "expected a number"),
    ],
)
def test_bad_reward_files_raise_with_output(txt: str | None, js: str | None, message: str) -> None:
    with pytest.raises(VerifierError, match=message) as info:
        reward_from_files(txt, js, output="the test log")
    assert info.value.output == "the test log"
    assert "the test log" in str(info.value)


SUMMARY = """
============================= test session starts ==============================
collected 3 items

../tests/test_outputs.py .F.                                             [100%]
=========================== short test summary info ============================
PASSED ../tests/test_outputs.py::test_config_exists
FAILED ../tests/test_outputs.py::test_config_values - assert {} == {'name': 'seta'}
PASSED ../tests/test_outputs.py::test_readme_mentions_port
========================= 1 failed, 2 passed in 0.03s ==========================
"""


def test_pytest_summary_parsing() -> None:
    assert parse_pytest_results(SUMMARY) == {
        "test_config_exists": "PASSED",
        "test_config_values": "FAILED",
        "test_readme_mentions_port": "PASSED",
    }
    verbose = "tests/test_a.py::test_x PASSED [ 50%]\ntests/test_a.py::test_y[1] FAILED [100%]\n"
    assert parse_pytest_results(verbose) == {"test_x": "PASSED", "test_y[1]": "FAILED"}


def test_tbench_is_all_or_nothing() -> None:
    assert tbench_reward(SUMMARY)[0] == 0.0
    assert tbench_reward(SUMMARY.replace("FAILED", "PASSED"))[0] == 1.0
    with pytest.raises(VerifierError, match="no pytest results"):
        tbench_reward("ModuleNotFoundError: No module named pytest")


def _junit(*cases: tuple[str, str]) -> str:
    """A pytest-style JUnit report; each case is (name, outcome) with outcome one of
    passed, failed, error, skipped, xfail."""
    body = {
        "passed": "",
        "failed": '<failure message="assert 1 == 2">assert 1 == 2</failure>',
        "error": '<error message="collection failure">ImportError</error>',
        "skipped": '<skipped type="pytest.skip" message="no">no</skipped>',
        "xfail": '<skipped type="pytest.xfail" message="known">known</skipped>',
    }
    items = "".join(
        f'<testcase classname="tests.test_outputs" name="{name}" time="0.01">{body[o]}</testcase>'
        for name, o in cases
    )
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
        f'errors="0" failures="0" skipped="0" tests="{len(cases)}">{items}</testsuite></testsuites>'
    )


# What pytest prints when code the tests import (from the agent's files) forges a summary: the
# real run fails test_config_values, then an atexit hook prints a summary where all passed.
FORGED = (
    SUMMARY
    + """=========================== short test summary info ============================
PASSED ../tests/test_outputs.py::test_config_exists
PASSED ../tests/test_outputs.py::test_config_values
PASSED ../tests/test_outputs.py::test_readme_mentions_port
"""
)
REAL_JUNIT = _junit(
    ("test_config_exists", "passed"),
    ("test_config_values", "failed"),
    ("test_readme_mentions_port", "passed"),
)


def test_tbench_scores_from_junit_not_from_a_forged_summary() -> None:
    # the text alone is fooled (this was the only source before): the forged summary wins
    assert tbench_reward(FORGED)[0] == 1.0
    reward, details = tbench_reward(FORGED, junit=REAL_JUNIT, exit_code=0)
    assert reward == 0.0
    assert details["result_source"] == "junit"
    assert details["tests"]["tests.test_outputs::test_config_values"] == "FAILED"
    passing = _junit(("test_a", "passed"), ("test_b[1]", "passed"), ("test_c", "xfail"))
    assert tbench_reward("", junit=passing, exit_code=0) == (
        1.0,
        {
            "tests": {
                "tests.test_outputs::test_a": "PASSED",
                "tests.test_outputs::test_b[1]": "PASSED",
                "tests.test_outputs::test_c": "XFAIL",
            },
            "result_source": "junit",
        },
    )


def test_tbench_text_fallback_says_so_and_needs_exit_code_zero() -> None:
    text = SUMMARY.replace("FAILED", "PASSED")
    reward, details = tbench_reward(text, junit=None, exit_code=0)
    assert reward == 1.0
    assert details["result_source"] == "text" and "forge" in details["result_warning"]
    # a summary that says "all passed" from a script that failed is no pass
    reward, details = tbench_reward(text, junit=None, exit_code=1)
    assert reward == 0.0 and "exited 1" in details["exit_code_mismatch"]
    passing = _junit(("test_a", "passed"))
    assert tbench_reward("", junit=passing, exit_code=2)[0] == 0.0


def test_junit_statuses_and_bad_reports() -> None:
    report = _junit(
        ("test_a", "passed"),
        ("test_b", "failed"),
        ("test_c", "error"),
        ("test_d", "skipped"),
        ("test_e", "xfail"),
    )
    got = parse_junit_xml(report)
    assert [got[f"tests.test_outputs::test_{n}"] for n in "abcde"] == [
        "PASSED",
        "FAILED",
        "ERROR",
        "SKIPPED",
        "XFAIL",
    ]
    # a test that passed, then failed its teardown, is listed twice: the failure counts
    twice = _junit(("test_a", "passed"), ("test_a", "error"), ("test_a", "passed"))
    assert parse_junit_xml(twice) == {"tests.test_outputs::test_a": "ERROR"}
    # a collection error (the agent's module did not import) is a failure, not "no tests"
    collect = _junit(("test_outputs", "error")).replace('classname="tests.test_outputs" ', "")
    assert tbench_reward("", junit=collect, exit_code=2)[0] == 0.0
    for bad in ("<testsuites", "<html></html>"):
        with pytest.raises(VerifierError, match="JUnit report") as info:
            tbench_reward("out", junit=bad)
        assert info.value.cause == "bad_report"
    with pytest.raises(VerifierError, match="no pytest results") as info:
        tbench_reward("", junit=_junit())
    assert info.value.cause == "no_results"


def test_tbench_counts_skipped_tests_as_passed_as_its_harness_does() -> None:
    """terminal-bench's PytestParser maps SKIPPED (and XFAIL) to PASSED, and a trial resolves
    when every parsed test PASSED: tests that all skip resolve it."""
    assert tbench_reward("", junit=_junit(("test_a", "skipped")), exit_code=0)[0] == 1.0
    mixed = _junit(("test_a", "passed"), ("test_b", "skipped"), ("test_c", "xfail"))
    assert tbench_reward("", junit=mixed, exit_code=0)[0] == 1.0
    assert tbench_reward("", junit=_junit(("test_a", "skipped"), ("test_b", "failed")))[0] == 0.0
    # the printed summary (no JUnit report written) reads the same
    text = (
        "=== short test summary info ===\nSKIPPED tests/t.py::test_a\nPASSED tests/t.py::test_b\n"
    )
    assert tbench_reward(text, junit=None, exit_code=0)[0] == 1.0
    assert tbench_reward(text.replace("PASSED", "FAILED"), junit=None)[0] == 0.0


def test_seta_weighted_share() -> None:
    weights = {
        "test_config_exists": 0.2,
        "test_config_values": 0.5,
        "test_readme_mentions_port": 0.3,
    }
    reward, details = seta_reward(SUMMARY, weights)
    assert reward == pytest.approx(0.5)
    assert details["result_source"] == "text"
    assert seta_reward(FORGED, weights, junit=REAL_JUNIT)[0] == pytest.approx(0.5)


def test_seta_weight_matching_no_test_is_a_verifier_error() -> None:
    weights = {
        "test_config_exists": 0.2,
        "test_config_values": 0.5,
        "test_readme_mentions_port": 0.3,
        "test_never_ran": 1.0,
    }
    with pytest.raises(
        VerifierError, match="weights matching no test \\['test_never_ran'\\]"
    ) as info:
        seta_reward(SUMMARY, weights)
    assert info.value.cause == "weights_mismatch"


def test_seta_test_matching_no_weight_is_a_verifier_error() -> None:
    weights = {"test_config_exists": 0.5, "test_config_values": 0.5}
    with pytest.raises(VerifierError, match="tests matching no weight") as info:
        seta_reward(SUMMARY, weights)
    assert "test_readme_mentions_port" in str(info.value)


def test_seta_parametrised_tests_match_their_base_name() -> None:
    weights = {"test_x": 0.5, "test_y": 0.25, "test_z[b]": 0.25}
    report = _junit(
        ("test_x[1]", "passed"),
        ("test_x[2]", "failed"),
        ("test_y", "passed"),
        ("test_z[a]", "failed"),  # an explicit parametrised key takes only its own instance
        ("test_z[b]", "passed"),
    )
    # test_z[a] matches no weight: refused, not silently dropped
    with pytest.raises(VerifierError, match="test_z\\[a\\]"):
        seta_reward("", weights, junit=report, exit_code=1)
    weights["test_z"] = 1.0
    reward, _ = seta_reward("", weights, junit=report, exit_code=1)
    # test_x: half of its instances passed; test_y passed; test_z[b] passed; test_z: 0 of 1
    assert reward == pytest.approx((0.25 + 0.25 + 0.25 + 0.0) / 2.0)
    # the same from the text summary, with class names and parameters holding '::'
    text = (
        "short test summary info\n"
        "PASSED t.py::TestC::test_x[1]\nFAILED t.py::TestC::test_x[a::b]\nPASSED t.py::test_y\n"
    )
    got = seta_reward(text, {"test_x": 3.0, "test_y": 1.0}, exit_code=1)[0]
    assert got == pytest.approx((1.5 + 1.0) / 4.0)
    assert parse_pytest_results(text)["test_x[a::b]"] == "FAILED"


def test_seta_full_marks_need_exit_code_zero() -> None:
    text = SUMMARY.replace("FAILED", "PASSED")
    weights = dict.fromkeys(
        ["test_config_exists", "test_config_values", "test_readme_mentions_port"], 1.0
    )
    assert seta_reward(text, weights, exit_code=0)[0] == 1.0
    assert seta_reward(text, weights, exit_code=1)[0] == 0.0


@pytest.mark.parametrize(
    "txt, js",
    [
        ("1.5", None),
        ("-0.1", None),
        (None, '{"reward": 2}'),
        (None, "100"),
        ("1e308", None),
    ],
)
def test_harbor_reward_outside_its_range_is_refused(txt: str | None, js: str | None) -> None:
    with pytest.raises(RewardOutOfRangeError, match="outside the task's range") as info:
        reward_from_files(txt, js, output="log")
    assert info.value.cause == "reward_out_of_range"


@pytest.mark.parametrize("txt", ["nan", "inf", "-inf", "Infinity"])
def test_harbor_non_finite_reward_is_refused(txt: str) -> None:
    with pytest.raises(VerifierError, match="finite") as info:
        reward_from_files(txt, None, output="log")
    assert info.value.cause == "bad_reward"
    with pytest.raises(VerifierError, match="finite"):
        reward_from_files(txt, None, reward_range=(-math.inf, math.inf))


def test_harbor_declared_range_is_honoured() -> None:
    assert reward_from_files("-0.5", None, reward_range=(-1.0, 1.0))[0] == -0.5
    assert reward_from_files(None, '{"reward": 7}', reward_range=(0.0, 10.0))[0] == 7.0
    with pytest.raises(RewardOutOfRangeError):
        reward_from_files("11", None, reward_range=(0.0, 10.0))


def test_numbers() -> None:
    assert parse_number("1,234.5") == 1234.5
    assert parse_number("\\boxed{3/4}") == 0.75
    assert parse_number("12%") == 0.12
    assert parse_number("$5") == 5.0
    assert parse_number("five") is None


def test_answers() -> None:
    exact = AnswerSpec(ground_truth="Iron")
    assert answer_reward("  iron.\n", exact)[0] == 1.0
    assert answer_reward("Steel", exact)[0] == 0.0
    assert answer_reward(None, exact)[0] == 0.0
    numeric = AnswerSpec(ground_truth="42.5", match="numeric")
    assert answer_reward("42.50000001", numeric)[0] == 1.0
    assert answer_reward("\\boxed{85/2}", numeric)[0] == 1.0
    assert answer_reward("43", numeric)[0] == 0.0
    assert answer_reward("about 42", numeric)[0] == 0.0
    with pytest.raises(VerifierError, match="numeric ground truth"):
        answer_reward("1", AnswerSpec(ground_truth="many", match="numeric"))


def test_tbench_an_unexpected_pass_fails_and_the_summary_only_lowers() -> None:
    """A non-strict XPASS is a plain pass in the JUnit report and XPASS in the printed summary
    (FAILED for Terminal-Bench's parser); the summary may mark a JUnit pass XPASS, but a forged
    PASSED line never lifts a JUnit failure."""
    junit = _junit(("test_a", "passed"), ("test_b", "passed"))
    summary = "=== short test summary info ===\nXPASS tests/test_outputs.py::test_a\n"
    reward, details = tbench_reward(summary, junit=junit, exit_code=0)
    assert reward == 0.0 and details["xpass_from_summary"] == ["tests.test_outputs::test_a"]
    assert tbench_reward("", junit=junit, exit_code=0)[0] == 1.0
    failing = _junit(("test_a", "failed"))
    forged = "=== short test summary info ===\nPASSED tests/test_outputs.py::test_a\n"
    assert tbench_reward(forged, junit=failing, exit_code=0)[0] == 0.0
