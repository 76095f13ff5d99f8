"""tests/ci_policy.py: in CI (`CI=true`) skips fail, except the live E2B checks'; elsewhere
skips stay skips. Run on a small generated suite in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

SUITE = {
    "test_marks.py": """
        import shutil
        import pytest

        @pytest.mark.skipif(True, reason="no Docker engine answers")
        def test_needs_docker():
            pass

        def test_needs_bwrap():
            if True:
                pytest.skip("bubblewrap not installed")

        @pytest.fixture(params=["docker"])
        def backend(request):
            pytest.skip("image sandgym/terminal missing")

        def test_fixture_skip(backend):
            pass

        @pytest.mark.e2b
        @pytest.mark.skipif(True, reason="E2B_API_KEY is not set")
        def test_live_e2b():
            pass

        @pytest.mark.xfail(reason="known", strict=True)
        def test_expected_failure():
            assert False

        def test_plain():
            pass
    """,
    "test_module_skip.py": """
        import pytest

        pytest.skip("no Docker engine answers", allow_module_level=True)

        def test_never_collected():
            pass
    """,
}


def run_suite(tmp_path: Path, ci: str | None) -> tuple[dict[str, str], str]:
    """Outcome per test name (junit: passed, failure, error, skipped), and pytest's output."""
    for name, body in SUITE.items():
        (tmp_path / name).write_text(textwrap.dedent(body))
    (tmp_path / "conftest.py").write_text(
        "def pytest_configure(config):\n    config.addinivalue_line('markers', 'e2b: live E2B')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.ci_policy", "-p", "no:cacheprovider",
         "-q", "-rA", "--rootdir", str(tmp_path), str(tmp_path), f"--junitxml={junit}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    outcomes = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name", "")] = kinds[0] if kinds else "passed"
    return outcomes, proc.stdout


@pytest.mark.parametrize("ci", [None, "true"])
def test_skips_fail_only_in_ci_except_e2b(tmp_path: Path, ci: str | None) -> None:
    got, out = run_suite(tmp_path, ci)
    missing = ("test_needs_docker", "test_needs_bwrap", "test_fixture_skip[docker]")
    if ci == "true":
        # failed where they would have skipped: in the call, or in set-up (pytest: error)
        assert {t: got[t] for t in missing} == {
            "test_needs_docker": "error",  # a skipif mark acts in set-up
            "test_needs_bwrap": "failure",
            "test_fixture_skip[docker]": "error",
        }, out
        assert "would have been skipped (no Docker engine answers)" in out
        assert got["test_module_skip"] == "failure", out  # one failing stand-in, run goes on
    else:
        assert {t: got[t] for t in missing} == dict.fromkeys(missing, "skipped"), out
        assert got["test_module_skip"] == "skipped", out
        assert "would have been skipped" not in out
    assert got["test_live_e2b"] == "skipped", out  # the live E2B checks may skip anywhere
    assert got["test_expected_failure"] == "skipped", out  # xfail (junit calls it skipped)
    assert got["test_plain"] == "passed", out
