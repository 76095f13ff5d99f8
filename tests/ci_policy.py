"""In CI (`CI=true`) a skipped test is a failed one: a run without its Docker engine, an image or
bubblewrap must not pass by skipping what it was meant to check. Only the live E2B checks (marked
`e2b`: they need an API key and E2B's service, which CI does not have) may skip there.

Loaded by tests/conftest.py (its hooks are imported there); `pytest -p tests.ci_policy` loads it
on its own. Outside CI nothing changes: skips stay skips, with their reasons (`-rs`).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

#: markers whose tests may skip even in CI
MAY_SKIP_IN_CI = ("e2b",)


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def _reason(longrepr: Any) -> str:
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def _failed(reason: str) -> str:
    return (
        f"CI=true: this test would have been skipped ({reason}); in CI that is a failure "
        "(only the live E2B checks may skip): install what it needs (scripts/setup.sh)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator:
    outcome = yield
    report = outcome.get_result()
    if not (in_ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    if any(item.get_closest_marker(m) is not None for m in MAY_SKIP_IN_CI):
        return
    report.outcome = "failed"
    report.longrepr = _failed(_reason(report.longrepr))


class ModuleWouldSkip(pytest.Item):
    """Stands in, in CI, for a module that skipped itself at import: one failing test, so the
    run goes on (a failed collection would stop the whole session)."""

    def __init__(self, *, reason: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reason = reason

    def runtest(self) -> None:
        pytest.fail(_failed(self.reason), pytrace=False)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator:
    # A module that skips itself at import (`pytest.skip(..., allow_module_level=True)`).
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and isinstance(collector, pytest.Module):
        item = ModuleWouldSkip.from_parent(
            collector, name=collector.path.stem, reason=_reason(report.longrepr)
        )
        report.outcome = "passed"
        report.longrepr = None
        report.result = [item]
