"""A tiny run of `sandgym bench host_scale` (issue 59) on local: six sandboxes through a real
`sandgym serve`, so the bench that makes the committed record keeps working. The figures are
not checked (a noisy shared host); what is: every sandbox made, claimed from the pool, closed,
nothing leased after the closes, none left behind, and the per-sandbox lines written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from lab.bench import host_scale
from tests.e2e.conftest import local_available

pytestmark = pytest.mark.skipif(not local_available(), reason="bubblewrap not installed")


async def test_host_scale_smoke(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    host_scale.add_arguments(parser)
    raw = tmp_path / "raw.jsonl"
    args = parser.parse_args(
        [
            "--count",
            "6",
            "--window",
            "2",
            "--concurrency",
            "3",
            "--claims",
            "2",
            "--bare",
            "3",
            "--raw-out",
            str(raw),
        ]  # fmt: skip
    )
    doc = await host_scale.main(args)
    local = doc["backends"]["local"]
    assert local["create"]["made"] == 6 and local["create"]["errors"] == 0, local["create"]
    assert local["claim"]["hits"] == 2 and local["claim"]["errors"] == 0, local["claim"]
    assert local["close"]["closed"] == 6 and local["close"]["errors"] == 0, local["close"]
    assert local["leftovers_after_stop"] == 0, local
    assert local["after_close"]["pool_leased"] == 0, local["after_close"]
    assert local["memory"]["held"] == 6 and local["memory"]["per_sandbox_mib"] > 0
    ops = [json.loads(line)["op"] for line in raw.read_text().splitlines()]
    assert (ops.count("create"), ops.count("claim"), ops.count("close")) == (6, 2, 6), ops
