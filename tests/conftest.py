"""Suite-wide policy: in CI (`CI=true`) a skip is a failure, except for the live E2B checks
(tests/ci_policy.py)."""

from tests.ci_policy import pytest_make_collect_report, pytest_runtest_makereport

__all__ = ["pytest_make_collect_report", "pytest_runtest_makereport"]
