"""`sandgym bench step` end to end on the null backend, tiny: the direct and websocket round
trips are timed, and every reported figure is recomputed from the raw record written beside the
result (`step.raw.jsonl`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.bench.step import summarize_backend
from sandgym.cli import main


def test_bench_step_figures_come_from_the_raw_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "step.json"
    rc = main(["bench", "step", "--json", "--backends", "null", "--n", "20", "--warmup", "2",
               "--out", str(out)])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert json.loads(out.read_text()) == doc and doc["raw"] == "step.raw.jsonl"
    (raw,) = [json.loads(x) for x in (tmp_path / "step.raw.jsonl").read_text().splitlines()]
    (res,) = doc["results"]
    assert len(raw["direct_us"]) == len(raw["websocket_us"]) == 20
    assert res == summarize_backend(raw)
    assert res["websocket"]["n"] == 20 and res["websocket"]["p50_us"] > res["direct"]["p50_us"]
    assert res["websocket"]["p50_us"] == sorted(raw["websocket_us"])[9]  # nearest rank
