"""`bench.compat_outcome.agent_processes_unseen`: a task whose oracle fell short while its tests
look for running processes (get-bitcoin-nodes' psutil, home-server-https' pgrep) gets an action
that says why (sandgym's private verifier does not see the agent's processes), and stays
`failing`: a failure in sandgym by design, never an exclusion."""

from __future__ import annotations

from typing import Any

from bench.compat_outcome import NOT_REACHABLE, agent_processes_unseen, decide

PSUTIL = (
    "    def test_service_process_running():\n"
    '        for proc in psutil.process_iter(["pid", "name", "cmdline"]):\n'
    '>       assert False, "Bitcoin service process not found"\n'
    "E       AssertionError: Bitcoin service process not found\n"
)
PGREP = (
    "    def test_nginx_is_running():\n"
    '        result = subprocess.run(["pgrep", "nginx"], capture_output=True, text=True)\n'
    '>       assert result.returncode == 0, "nginx is not running"\n'
)


def _line(**kw: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "task_id": "t",
        "base_image": "ghcr.io/laude-institute/t-bench/python-3-13:20250620",
        "oracle_reward": 0.0,
        "noop_reward": 0.0,
        "oracle_output": "Service started with PID: 28",
        "oracle_verifier_output": PSUTIL,
        "phase_errors": [],
    }
    entry.update(kw)
    return entry


def test_a_test_looking_for_processes_is_named_and_stays_failing() -> None:
    for output, needle in ((PSUTIL, "psutil.process_iter"), (PGREP, '["pgrep", "nginx"]')):
        out = decide(_line(oracle_verifier_output=output), ["oracle_below_one"])
        assert out.category == "failing" and out.category not in NOT_REACHABLE
        assert out.reason == "oracle_below_one"
        assert "look for the agent's processes" in out.action and needle in out.action, out
        assert "private verifier" in out.action


def test_a_process_tool_the_image_lacks_is_said_first() -> None:
    """home-server-https: the traceback's last line is pgrep's FileNotFoundError (its source
    line scrolled out of the kept output): the action names the missing tool, then the
    private verifier."""
    missing = (
        ">  raise child_exception_type(errno_num, err_msg, err_filename)\n"
        "E  FileNotFoundError: [Errno 2] No such file or directory: 'pgrep'\n"
    )
    out = decide(_line(oracle_verifier_output=missing), ["oracle_below_one"])
    assert out.category == "failing"
    assert out.action.startswith("its tests run `pgrep`"), out.action
    assert "the image has no `pgrep` here" in out.action and "private verifier" in out.action


def test_no_process_lookup_or_a_passing_oracle_is_not_it() -> None:
    plain = _line(oracle_verifier_output="E       assert 41 == 42\n")
    assert agent_processes_unseen(plain) is None
    assert "processes" not in decide(plain, ["oracle_below_one"]).action
    assert agent_processes_unseen(_line(oracle_reward=1.0)) is None
    # words that only contain the names are not lookups
    assert agent_processes_unseen(_line(oracle_verifier_output="E  apps = happs()\n")) is None
