"""The smoke config end to end: a real env server (local backend), real Ray, two GRPO updates.

Runs the real entry points (`sandgym serve`, `sandgym train`, `sandgym plot`) as subprocesses,
as a user would, and checks what the run directory holds afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
#: `smoke-parity`: the verifier scores the seed's parity, so rewards are 0 and 1 whatever the
#: (random) policy does: the smoke run checks that rewards reach the records and the metrics
TRAIN_TASKS = REPO / "tests" / "fixtures" / "train_tasks"
SANDGYM = [sys.executable, "-m", "sandgym.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    port = _free_port()
    proc = subprocess.Popen(
        [*SANDGYM, "serve", "--backend", "local", "--port", str(port), "--tasks", str(TRAIN_TASKS)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(
                f"sandgym serve did not come up: {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.3)
    yield f"ws://127.0.0.1:{port}/v1/env"
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_smoke_config_trains_two_updates(server: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from sandgym.trainer.config import load_config
    from sandgym.trainer.models import load_model

    run_dir = tmp_path / "smoke"
    cmd = [
        *SANDGYM,
        "train",
        str(REPO / "sandgym/trainer/configs/smoke.yaml"),
        "--override",
        f'env.server_urls=["{server}"]',
        "--override",
        "env.task_ids=[smoke-parity]",
        "--run-dir",
        str(run_dir),
        "--json",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["version"] == 2
    assert summary["episodes"] >= 4
    # every episode ended normally: a random policy never solves it, but nothing broke
    assert set(summary["terminations"]) <= {"submitted", "turn_limit", "env_truncated"}

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all(r["learner/loss_tokens"] > 0 for r in train_rows)
    assert any((run_dir / "tensorboard").iterdir())
    episodes = [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == summary["episodes"]
    assert {(e["task_id"], e["server_url"]) for e in episodes} == {("smoke-parity", server)}
    # the verifier's reward reaches every record: odd seeds 1, even seeds 0 (a random policy
    # never solves a real task, so a run on one would only ever show zeros)
    assert [e["reward"] for e in episodes] == [float(e["seed"] % 2) for e in episodes]
    assert {e["reward"] for e in episodes} == {0.0, 1.0}
    # ... and the metrics: each update consumed one group (one seed), so its mean is 0 or 1
    assert {r["reward/mean"] for r in train_rows} <= {0.0, 1.0}
    assert sum(e["reward"] for e in episodes) > 0
    # the weights moved away from the (deterministic) random initialisation
    cfg = load_config(REPO / "sandgym/trainer/configs/smoke.yaml")
    initial = load_model(cfg.model).state_dict()
    trained = load_file(str(run_dir / "checkpoints/step_000002/model.safetensors"))
    changed = [k for k, v in trained.items() if not (v == initial[k]).all()]
    assert changed, "no parameter changed after two updates"

    plot = subprocess.run(
        [*SANDGYM, "plot", str(run_dir), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plot.returncode == 0, plot.stderr[-2000:]
    png = Path(json.loads(plot.stdout)["png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the server's cost ledger reached every record with the tokens, and `sandgym runs cost`
    # sums the records (docs/operations.md)
    assert all(e["cost"]["sandbox_s"] > 0 and e["cost"]["commands"] >= 0 for e in episodes)
    assert sum(e["cost"]["tokens_generated"] for e in episodes) > 0
    cost = subprocess.run(
        [*SANDGYM, "runs", "cost", str(run_dir), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cost.returncode == 0, cost.stderr[-2000:]
    report = json.loads(cost.stdout)
    assert report["run"]["episodes"] == len(episodes) and report["run"]["unmetered"] == 0
    assert abs(report["run"]["sandbox_s"] - sum(e["cost"]["sandbox_s"] for e in episodes)) < 1e-6
    assert report["money"] is None  # no price table: no money


async def test_oracle_and_noop_agents_bracket_the_reward(server: str) -> None:
    """The rollout path against the real server: the reference solution scores 1, doing
    nothing scores 0 (no model involved)."""
    from sandgym.trainer.agents import NoopAgent, OracleAgent, solutions_from_dir
    from sandgym.trainer.config import load_config
    from sandgym.trainer.rollout import EpisodeRunner

    cfg = load_config(
        REPO / "sandgym/trainer/configs/smoke.yaml", [f'env.server_urls=["{server}"]']
    )
    oracle = OracleAgent(solutions_from_dir(REPO / "sandgym/tasks/catalog"))
    good = await EpisodeRunner(cfg, None, oracle).run_episode("builtin/hello-file", 0)
    assert good.termination == "submitted", good.error
    assert good.reward == 1.0
    assert [s.action["kind"] for s in good.trajectories[0].steps if s.action] == [
        "write_file",
        "command",
        "submit",
    ]
    bad = await EpisodeRunner(cfg, None, NoopAgent()).run_episode("builtin/hello-file", 0)
    assert bad.termination == "submitted" and bad.reward == 0.0


def test_eval_cli_pass_at_k_through_the_server(server: str) -> None:
    cmd = [*SANDGYM, "eval", "--server-url", server, "--tasks", "builtin/hello-file"]
    cmd += ["--attempts", "2", "--json"]
    oracle = subprocess.run(
        [*cmd, "--agent", "oracle"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert oracle.returncode == 0, oracle.stderr[-2000:]
    (row,) = json.loads(oracle.stdout)["tasks"]
    assert row["successes"] == 2 and row["pass@1"] == 1.0 and row["pass@2"] == 1.0
    noop = subprocess.run(
        [*cmd, "--agent", "noop"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert noop.returncode == 0, noop.stderr[-2000:]
    assert json.loads(noop.stdout)["tasks"][0]["pass@1"] == 0.0
