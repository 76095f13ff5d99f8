"""`sandgym train` on the other rollout kinds, one short update each: harness episodes
(`agent.kind: harness`, the ReAct agent inside local-backend sandboxes, its calls through the
rollout worker's gateway) and solver-judge episodes (`agent.workflow: solver_judge`).

Runs the real entry point as a subprocess against a real env server (in this process, on a
thread) and real Ray, with the smoke config's tiny random model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandgym.server.runner import BackgroundServer
from tests.e2e.conftest import local_available

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "sandgym/trainer/configs/smoke.yaml"

pytestmark = pytest.mark.skipif(not local_available(), reason="bwrap missing")


def _train(server_url: str, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    cmd = [sys.executable, "-m", "sandgym.cli", "train", str(SMOKE), "--run-dir", str(run_dir)]
    for ov in [f'env.server_urls=["{server_url}"]', "run.num_updates=1", *overrides]:
        cmd += ["--override", ov]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [*cmd, "--json"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert summary["version"] == 1
    return summary


def _train_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def test_train_on_harness_episodes(
    make_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from sandgym.trainer.config import load_config
    from sandgym.trainer.models import load_model

    srv = make_server("local")
    run_dir = tmp_path / "harness"
    overrides = ["agent.kind=harness", "agent.max_turns=2", "sampling.max_new_tokens=8"]
    summary = _train(srv.url, run_dir, [*overrides, "run.save_tokens=true"])
    # a random policy solves nothing, but every harness episode ran and was scored
    assert set(summary["terminations"]) == {"submitted"}, summary
    (row,) = _train_rows(run_dir)
    assert row["learner/loss_tokens"] > 0 and row["batch/samples"] >= 2
    episodes = [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == summary["episodes"] >= 2
    for ep in episodes:
        assert ep["error"] is None and ep["server_url"] == srv.url
        (traj,) = ep["trajectories"]
        assert 1 <= len(traj["steps"]) <= 2  # one step per model call of the harness
        for step in traj["steps"]:
            assert step["prompt_ids"] and 1 <= len(step["response_ids"]) <= 8
            assert len(step["response_logprobs"]) == len(step["response_ids"])
            assert step["loss_mask"] == [1] * len(step["response_ids"])
    # the gateway's store lies under the run dir and holds nothing once episodes are consumed
    import sqlite3

    (store,) = (run_dir / "gateway").glob("*.sqlite")
    with sqlite3.connect(store) as db:
        left = db.execute("SELECT session_id, idx FROM calls").fetchall()
    # (the CI of 2026-12-03 found 4 calls left once, under load: which sessions, to find why)
    recorded = sorted({e["group_id"] for e in episodes})
    assert left == [], (left, recorded)
    cfg = load_config(SMOKE)
    initial = load_model(cfg.model).state_dict()
    trained = load_file(str(run_dir / "checkpoints/step_000001/model.safetensors"))
    assert [k for k, v in trained.items() if not (v == initial[k]).all()], "no weight changed"


def test_train_on_solver_judge_episodes(
    make_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    srv = make_server("local")
    run_dir = tmp_path / "solver-judge"
    overrides = [
        "agent.workflow=solver_judge",
        "agent.max_turns=1",
        "sampling.max_new_tokens=8",
        "algorithm.roles={solver: grpo, judge: reinforce}",
    ]
    summary = _train(srv.url, run_dir, overrides)
    assert set(summary["terminations"]) <= {"submitted", "turn_limit", "env_truncated"}, summary
    (row,) = _train_rows(run_dir)
    for role in ("solver", "judge"):
        assert row[f"role/{role}/trajectories"] >= 2
        assert 0.0 <= row[f"role/{role}/reward_mean"] <= 1.0
    episodes = [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == summary["episodes"] >= 2, summary
    assert all([t["role"] for t in e["trajectories"]] == ["solver", "judge"] for e in episodes)
