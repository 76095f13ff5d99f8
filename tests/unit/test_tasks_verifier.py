"""Scoring rules: reward files, pytest summaries (Terminal-Bench, SETA), answers."""

from __future__ import annotations

import pytest

from tasks.errors import VerifierError
from tasks.models import AnswerSpec
from tasks.verifier import (
    answer_reward,
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


def test_seta_weighted_share() -> None:
    weights = {
        "test_config_exists": 0.2,
        "test_config_values": 0.5,
        "test_readme_mentions_port": 0.3,
        "test_never_ran": 1.0,
    }
    reward, details = seta_reward(SUMMARY, weights)
    assert reward == pytest.approx(0.5 / 2.0)
    assert details["unweighted_tests"] == []


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
