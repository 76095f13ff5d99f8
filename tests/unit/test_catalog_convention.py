"""The catalog's verifier convention (sandgym/tasks/catalog/README.md), for all of its tasks: check.py
exits 0 (solved) or 10 (not solved); test.sh turns those into a reward and anything else (the
checker could not run) into no reward and a failing exit, hence a `verifier_error`. The shared
helpers turn what an agent left (a FIFO, a directory, a hanging program) into a FAIL, quickly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandgym.tasks.registry import CATALOG_DIR

TASKS = sorted(p for p in CATALOG_DIR.iterdir() if (p / "tests" / "check.py").exists())
TEST_SH = (CATALOG_DIR / "hello-file" / "tests" / "test.sh").read_text()


def test_every_task_follows_the_convention() -> None:
    assert len(TASKS) >= 41
    for task in TASKS:
        assert (task / "tests" / "test.sh").read_text() == TEST_SH, task.name
        check = (task / "tests" / "check.py").read_text()
        compile(check, str(task), "exec")
        assert "sys.exit(1)" not in check, f"{task.name}: a FAIL must exit 10, not 1"
        if not task.name.startswith("desktop-"):
            assert "\ndef read(path):" in check and "O_NONBLOCK" in check, task.name
            assert "subprocess.run([sys.executable" not in check, f"{task.name}: use run_agent"


def _run_test_sh(tmp_path: Path, check_py: str) -> tuple[int, str | None, str]:
    """test.sh with its /tests and /logs/verifier moved under tmp_path, around `check_py`."""
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "check.py").write_text(check_py)
    script = TEST_SH.replace("/tests/", f"{tmp_path}/tests/").replace(
        "/logs/verifier", f"{tmp_path}/logs"
    )
    reward = tmp_path / "logs" / "reward.txt"
    reward.unlink(missing_ok=True)
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    return r.returncode, reward.read_text().strip() if reward.exists() else None, r.stderr


@pytest.mark.parametrize(
    ("check_py", "want_reward"),
    [
        ("print('PASS')", "1"),
        ("import sys; print('FAIL: no'); sys.exit(10)", "0"),
        # the checker could not run: no reward at all, never a 0
        ("raise RuntimeError('bug in the checker')", None),
        ("def broken(:\n", None),  # a syntax error exits 1, like a failed assertion used to
        ("open('/nonexistent-sandgym-secret/expected').read()", None),  # a missing secret
        ("import os; os.kill(os.getpid(), 9)", None),
    ],
)
def test_test_sh_writes_a_reward_only_on_a_clean_checker_run(
    tmp_path: Path, check_py: str, want_reward: str | None
) -> None:
    code, reward, stderr = _run_test_sh(tmp_path, check_py)
    assert reward == want_reward
    if want_reward is None:
        assert code != 0 and "check.py could not run" in stderr
    else:
        assert code == 0


def _header() -> str:
    """The shared helpers of a catalog check.py (everything before its task-specific body)."""
    text = (CATALOG_DIR / "hello-file" / "tests" / "check.py").read_text()
    end = text.index("\n\n\n", text.index("def secret():"))
    return text[:end] + "\n"


def _helpers(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "probe.py"
    script.write_text(_header() + body + "\nprint('PASS')\n")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)


def test_read_refuses_what_the_agent_left_instead_of_blocking_or_crashing(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "ok").write_text("hello\n")
    cases = {
        str(fifo): "is not a regular file",
        str(tmp_path): "is not a regular file",
        str(tmp_path / "missing"): "does not exist",
        str(tmp_path / "bin"): "not UTF-8",
    }
    for path, reason in cases.items():
        # a read that blocked on the FIFO would run into _helpers' 60 s hang guard and raise
        r = _helpers(tmp_path, f"read({path!r})")
        assert r.returncode == 10 and reason in r.stdout, (path, r.stdout, r.stderr)
    r = _helpers(tmp_path, f"assert read({str(tmp_path / 'ok')!r}) == 'hello\\n'")
    assert r.returncode == 0 and "PASS" in r.stdout


def test_helpers_fail_on_the_agents_programs_and_paths(tmp_path: Path) -> None:
    r = _helpers(tmp_path, "run_agent(['sleep', '30'], timeout=1)")
    assert r.returncode == 10 and "did not finish within 1 s" in r.stdout
    r = _helpers(tmp_path, f"run_agent([{str(tmp_path / 'nope')!r}])")
    assert r.returncode == 10 and "cannot run" in r.stdout
    r = _helpers(tmp_path, "r = run_agent(['printf', '\\\\377']); assert r.returncode == 0")
    assert r.returncode == 0, r.stderr  # undecodable output is replaced, not a crash
    r = _helpers(tmp_path, f"stat({str(tmp_path / 'nope')!r})")
    assert r.returncode == 10 and "cannot stat" in r.stdout
    r = _helpers(tmp_path, f"listdir({str(tmp_path / 'nope')!r})")
    assert r.returncode == 10 and "cannot list" in r.stdout
    # a checker bug (here: no secret) is not a FAIL: it is an uncaught error, exit 1
    r = _helpers(tmp_path, "secret()")
    assert r.returncode not in (0, 10) and "Traceback" in r.stderr
