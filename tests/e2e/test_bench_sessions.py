"""`sandgym bench sessions` end to end, tiny: a real `sandgym serve` child on the null backend,
the load generator in a child process, and OpenEnv pointed at a python that lacks it (the run
must record why and keep the labelled reference figures, not fail or invent numbers)."""

from __future__ import annotations

import json
import sys

import pytest

from envserver.cli import main


@pytest.mark.parametrize(("barrier", "client"), [(False, "lean"), (True, "websockets")])
def test_bench_sessions_small_run_reports_every_field(
    barrier: bool, client: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "sessions", "--json", "--levels", "3", "--steps", "2", "--client-procs", "1",
            "--servers", "sandgym,openenv", "--openenv-python", sys.executable,
            "--client", client]  # fmt: skip
    rc = main(argv + (["--barrier"] if barrier else []))
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    (r,) = doc["sandgym"]["results"]
    assert r["sessions"] == 3 and r["ok_sessions"] == 3 and r["errors"] == {}
    assert r["steps"] == 6 and r["step_p50_ms"] > 0 and r["steps_per_s"] > 0
    assert r["server_cpu_us_per_step"] >= 0  # /proc counts 10 ms ticks: 6 steps may read 0
    assert (r["server_cpu_us_per_connect_reset"] is not None) is barrier
    assert doc["client"].startswith("bench/wsclient.py" if client == "lean" else "websockets")
    # This test's python has no openenv-core: skipped with the reason, reference kept.
    assert "openenv-core is not importable" in doc["openenv"]["skipped"]
    assert doc["openenv_reference"]["sessions"] == 2048
    assert "vs_openenv" not in doc
