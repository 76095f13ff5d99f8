"""`sandgym bench sessions` end to end, tiny: a real `sandgym serve` child on the null backend and
OpenEnv's current release (the `openenv` distribution the dev extra pins; another python with
`SANDGYM_BENCH_OPENENV_PYTHON`) driven by the load generator in child processes, as real pairs of
runs whose every reported figure is recomputed from the raw records written beside the result;
then OpenEnv pointed at a python that cannot import it (the reason is recorded, no OpenEnv
figure is reported, nothing is invented)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from lab.bench.sessions_load import summarize_run
from sandgym.cli import main

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints" / "server.txt"


def _pinned_openenv() -> str:
    """The OpenEnv release setup installs (constraints/server.txt; pyproject has a floor)."""
    lines = CONSTRAINTS.read_text(encoding="utf-8").splitlines()
    (pin,) = [line for line in lines if re.match(r"openenv\s*==", line)]
    return pin.split("==")[1].strip()


def _run(tmp_path: Path, python: str, extra: list[str], capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "sessions.json"
    argv = ["bench", "sessions", "--json", "--levels", "3", "--steps", "2", "--client-procs", "1",
            "--servers", "sandgym,openenv", "--openenv-python", python, "--out", str(out),
            *extra]  # fmt: skip
    rc = main(argv)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert json.loads(out.read_text()) == doc
    raw = [json.loads(line) for line in (tmp_path / "sessions.raw.jsonl").read_text().splitlines()]
    assert doc["raw"] == "sessions.raw.jsonl"
    return doc, raw


def _check_run(r: dict[str, Any], barrier: bool) -> None:
    assert r["sessions"] == 3 and r["ok_sessions"] == 3 and r["errors"] == {}, r
    assert r["steps"] == 6 and r["step_p50_ms"] > 0 and r["steps_per_s"] > 0
    assert r["server_cpu_us_per_step"] >= 0  # 10 ms CPU ticks: 6 steps may read 0
    assert (r["server_cpu_us_per_connect_reset"] is not None) is barrier


def _check_stack(meta: dict[str, Any]) -> None:
    stack = meta["stack"]
    assert stack["loop"] and stack["http"] and stack["ws"], stack
    assert stack["versions"]["uvicorn"], stack


def test_bench_sessions_paired_runs_against_the_current_openenv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = os.environ.get("SANDGYM_BENCH_OPENENV_PYTHON", sys.executable)
    doc, raw = _run(
        tmp_path, python, ["--repeats", "2", "--barrier", "--client", "websockets"], capsys
    )
    assert doc["client"].startswith("websockets")
    assert "skipped" not in doc["openenv"], doc["openenv"]
    assert doc["openenv"]["openenv_distribution"] == "openenv"
    assert doc["openenv"]["openenv_version"] == _pinned_openenv()
    _check_stack(doc["sandgym"])
    _check_stack(doc["openenv"])
    assert doc["sandgym"]["stack"]["ws_impl"] == "sandgym"
    # Pinned apart when there are two CPUs, as read back from the processes themselves.
    cpus = doc["machine"]["usable_cpus"]
    if len(cpus) >= 2:
        assert doc["pinning"]["servers"] == cpus[:1] == doc["sandgym"]["cpus"]
        assert doc["openenv"]["cpus"] == cpus[:1]
        assert doc["pinning"]["load_generator"] == cpus[1:]

    (level,) = doc["levels"]
    pairs = level["pairs"]
    assert [p["order"] for p in pairs] == [["sandgym", "openenv"], ["openenv", "sandgym"]]
    for p in pairs:
        _check_run(p["sandgym"], True)
        _check_run(p["openenv"], True)
        assert p["ratios"]["steps_per_s"] == round(
            p["sandgym"]["steps_per_s"] / p["openenv"]["steps_per_s"], 3
        )
    # The level is one real pair (the lower median by the steps/s ratio), not a per-metric blend.
    m = level["median_pair"]
    ratios = [p["ratios"]["steps_per_s"] for p in pairs]
    assert ratios[m] == min(ratios)  # the lower median of two
    for name in ("sandgym", "openenv"):
        (res,) = doc[name]["results"]
        assert res == {**pairs[m][name], "from_pair": m}
    (vs,) = doc["vs_openenv"]
    assert vs["pairs"] == 2 and vs["median_pair"] == m and vs["all_ok"] is True
    assert vs["steps_per_s_ratio"] == ratios[m] and vs["steps_per_s_ratio_by_pair"] == ratios

    # Every reported run is recomputed from its raw record.
    assert len(raw) == 4
    for rec in raw:
        assert len(rec["latencies_us"]) == 6
        assert pairs[rec["pair"]][rec["server"]] == summarize_run(rec)
        assert pairs[rec["pair"]]["order"][rec["position"]] == rec["server"]


def test_bench_sessions_without_openenv_reports_no_openenv_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # This test's python without its site-packages (-S): OpenEnv is not importable there.
    python = tmp_path / "python-without-site"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    doc, raw = _run(tmp_path, str(python), [], capsys)
    (r,) = doc["sandgym"]["results"]
    _check_run(r, False)
    assert "importing OpenEnv's server failed" in doc["openenv"]["skipped"]
    assert set(doc["openenv"]) == {"skipped"}
    assert "vs_openenv" not in doc and "openenv_reference" not in doc
    (level,) = doc["levels"]
    assert [set(p) for p in level["pairs"]] == [{"pair", "order", "sandgym"}]
    (rec,) = raw
    assert rec["server"] == "sandgym" and summarize_run(rec) == level["pairs"][0]["sandgym"]
