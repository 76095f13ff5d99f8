"""`sandgym bench sessions` end to end, tiny: a real `sandgym serve` child on the null backend,
the load generator in a child process, and OpenEnv's own server (openenv-core, in the dev extra)
driven the same way; then OpenEnv pointed at a python that cannot import it (the run must record
why and keep the labelled reference figures, not fail or invent numbers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sandgym_cli import main


def _small_run(python: str, client: str, barrier: bool, capsys: pytest.CaptureFixture[str]):
    argv = ["bench", "sessions", "--json", "--levels", "3", "--steps", "2", "--client-procs", "1",
            "--servers", "sandgym,openenv", "--openenv-python", python,
            "--client", client]  # fmt: skip
    rc = main(argv + (["--barrier"] if barrier else []))
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    return doc


def _check_results(r: dict, barrier: bool) -> None:
    assert r["sessions"] == 3 and r["ok_sessions"] == 3 and r["errors"] == {}, r
    assert r["steps"] == 6 and r["step_p50_ms"] > 0 and r["steps_per_s"] > 0
    assert r["server_cpu_us_per_step"] >= 0  # /proc counts 10 ms ticks: 6 steps may read 0
    assert (r["server_cpu_us_per_connect_reset"] is not None) is barrier


@pytest.mark.parametrize(("barrier", "client"), [(False, "lean"), (True, "websockets")])
def test_bench_sessions_small_run_reports_every_field(
    barrier: bool, client: str, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _small_run(sys.executable, client, barrier, capsys)
    assert doc["client"].startswith("bench/wsclient.py" if client == "lean" else "websockets")
    (r,) = doc["sandgym"]["results"]
    _check_results(r, barrier)
    # OpenEnv's server ran the same workload (every step's echo checked by the bench).
    assert "skipped" not in doc["openenv"], doc["openenv"]
    assert doc["openenv"]["openenv_core_version"] == "0.3.0"
    (o,) = doc["openenv"]["results"]
    _check_results(o, barrier)
    (vs,) = doc["vs_openenv"]
    assert vs["sessions"] == 3 and vs["all_ok"] is True
    assert vs["p99_ratio"] > 0 and vs["steps_per_s_ratio"] > 0


def test_bench_sessions_without_openenv_keeps_the_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # This test's python without its site-packages (-S): openenv-core is not importable there.
    python = tmp_path / "python-without-site"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    doc = _small_run(str(python), "lean", False, capsys)
    (r,) = doc["sandgym"]["results"]
    _check_results(r, False)
    assert "openenv-core is not importable" in doc["openenv"]["skipped"]
    assert doc["openenv_reference"]["sessions"] == 2048
    assert "vs_openenv" not in doc
