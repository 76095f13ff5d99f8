"""Scoring an episode, one module a job:

- `run`: `run_verifier` copies the tests in (only now), runs them where the agent cannot reach
  them, and reads what they leave; `reward_range` is a task's declared reward range;
- `separate`: Harbor's separate verifier, in a sandbox of its own holding the agent's artifacts;
- `rewards`: the pure rules that turn that text into a reward (Harbor reward files, pytest
  reports for Terminal-Bench and SETA, answers for LLM-in-Sandbox);
- `ctrf`: a Harbor task's CTRF test report, read to name the tests that failed (never to score);
- `choice`: which verify mode an episode gets (read at its start); `modes`: the tamper report,
  then each mode (`shared`, `pristine`, `refuse-tampered`); `pristine`: that mode's fresh sandbox.

The protocol of the private verifier namespace itself is `sandgym.tasks.private_verify`.
"""

from sandgym.tasks.episode_models import VerifierResult
from sandgym.tasks.verifier.rewards import (
    DEFAULT_REWARD_RANGE,
    FAIL_STATUSES,
    PASS_STATUSES,
    answer_reward,
    base_test_name,
    normalize_answer,
    parse_junit_xml,
    parse_number,
    parse_pytest_results,
    reward_from_files,
    seta_reward,
    tbench_reward,
)
from sandgym.tasks.verifier.run import reward_range, run_verifier
from sandgym.tasks.verifier.separate import separate_verifier_sandbox, verifier_sandbox_spec

__all__ = [
    "DEFAULT_REWARD_RANGE",
    "FAIL_STATUSES",
    "PASS_STATUSES",
    "VerifierResult",
    "answer_reward",
    "base_test_name",
    "normalize_answer",
    "parse_junit_xml",
    "parse_number",
    "parse_pytest_results",
    "reward_from_files",
    "reward_range",
    "run_verifier",
    "separate_verifier_sandbox",
    "seta_reward",
    "tbench_reward",
    "verifier_sandbox_spec",
]
