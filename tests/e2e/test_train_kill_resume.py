"""A whole `sandgym train` SIGKILLed mid-run loses no episode it had in flight (issue 36 item 4).

The trainer (tiny model, four model turns an episode on a catalog task) runs against a real
`sandgym serve --backend local` process on a Ray cluster of its own; once an episode is in
flight in `RUN_DIR/inflight/`, the trainer's whole process group is SIGKILLed
(driver, its rollout actor and learner die with it; the server and Ray stay). The restart (the
same command: `run.resume` is the default) resumes each episode left there on its server and
scores it, or records it as it ended; none is lost while its server lives, each is recorded
once, marked `recovered`, and the run goes on to its last update.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.server.runner import ServerProcess

REPO = Path(__file__).resolve().parents[2]
MB = 1024 * 1024
TASK = "builtin/hello-file"

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
]


@pytest.fixture
def ray_head(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    ray = pytest.importorskip("ray")
    pytest.importorskip("torch")
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_worker_niceness", "0")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # (the trainer: 127.0.0.1)
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False, "object_store_memory": 100 * MB},
    )
    try:
        yield c.address
    finally:
        c.shutdown()


def _live_inflight(run_dir: Path) -> list[dict[str, Any]]:
    """The in-flight records of episodes that have not ended."""
    out = []
    for path in (run_dir / "inflight").glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):  # being written
            continue
        if not data.get("ended") and data.get("session_id"):  # not an intent: a session
            out.append(data)
    return out


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "episodes.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _train(run_dir: Path, server_url: str, address: str, updates: int) -> list[str]:
    overrides = [
        f"env.server_urls=[{server_url}]",
        f"env.task_ids=[{TASK}]",
        "agent.max_turns=4",
        "sampling.max_new_tokens=8",
        "rollout.concurrent_episodes=4",
        "algorithm.group_size=2",
        "algorithm.max_staleness=100",
        f"run.num_updates={updates}",
        f"run.ray_address={address}",
    ]
    cmd = [sys.executable, "-m", "sandgym.cli", "train", str(REPO / "sandgym/trainer/configs/smoke.yaml"),
           "--run-dir", str(run_dir), "--json"]  # fmt: skip
    for ov in overrides:
        cmd += ["--override", ov]
    return cmd


def test_a_killed_train_resumes_and_scores_its_episodes_in_flight(
    ray_head: str, tmp_path: Path
) -> None:
    srv = ServerProcess(
        "local", env={"SANDGYM_RESUME_GRACE_S": "300", "SANDGYM_LOCAL_ROOT": str(tmp_path / "sb")}
    )
    run_dir = tmp_path / "run"
    log = (tmp_path / "train1.log").open("w")
    first = subprocess.Popen(
        _train(run_dir, srv.url, ray_head, 1000), cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=log, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not _live_inflight(run_dir):
            assert first.poll() is None, (tmp_path / "train1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no episode in flight within 300 s"
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)  # the driver, and its actors with their job
        first.wait(timeout=60)
        # what the dead trainer left: the files of its episodes in flight
        left = {p.stem for p in (run_dir / "inflight").glob("*.json")}
        assert left, "the killed trainer left no episode in flight"
        done_before = len(_records(run_dir))

        # the restart: the same command, one update more than the checkpoint it finds (none:
        # a run killed before its first checkpoint starts again at version 0)
        second = subprocess.run(
            _train(run_dir, srv.url, ray_head, 1), cwd=REPO, capture_output=True, text=True,
            timeout=400,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        summary = json.loads(second.stdout.strip().splitlines()[-1])
        assert summary["version"] >= 1, summary

        recovery = json.loads((run_dir / "inflight_recovery.json").read_text())
        records = _records(run_dir)
        recovered = [r for r in records if r.get("recovered")]
        # every file left was accounted for: resumed and scored, or recorded as it ended
        assert recovery["lost"] == 0, recovery  # its server lives: nothing may be lost
        # an orphan: a worker killed between a reset's reply and writing its session (its
        # intent left): counted and masked (test_trainer_restart.py tests it on its own)
        counted = recovery["resumed"] + recovery["ended"] + recovery["orphaned"]
        assert counted == recovery["episodes"], recovery
        assert recovery["resumed"] + recovery["ended"] >= 1, recovery
        assert len(recovered) == recovery["episodes"], (len(recovered), recovery)
        assert not left & {p.stem for p in (run_dir / "inflight").glob("*.json")}
        orphans = [r for r in recovered if str(r.get("error") or "").startswith("orphaned")]
        assert len(orphans) == recovery["orphaned"], orphans
        assert all(r["termination"] == "connection" for r in orphans)
        for r in recovered:  # scored by the task's verifier (a random model: 0), never masked
            if r in orphans:
                continue
            assert r["termination"] in ("submitted", "turn_limit", "env_truncated"), r
            assert r["reward"] == 0.0 and r["error"] is None
        assert len(records) > done_before  # and the run went on
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        srv.stop()


def _demo(run_dir: Path, server_url: str, address: str, updates: int | None) -> list[str]:
    """The shipped demo config as it is, its checkpoint policy included; only what makes it fit
    a test changes (a tiny random model, small groups, this test's server and Ray)."""
    overrides = [
        f"env.server_urls=[{server_url}]",
        "model.source=tiny",
        "sampling.max_new_tokens=8",
        "rollout.concurrent_episodes=2",
        "algorithm.group_size=2",
        "algorithm.groups_per_update=1",
        "run.progress=false",
        f"run.ray_address={address}",
    ] + ([f"run.num_updates={updates}"] if updates is not None else [])
    cmd = [sys.executable, "-m", "sandgym.cli", "train", str(REPO / "sandgym/trainer/configs/demo.yaml"),
           "--run-dir", str(run_dir), "--json"]  # fmt: skip
    for ov in overrides:
        cmd += ["--override", ov]
    return cmd


def _checkpoints(run_dir: Path) -> list[int]:
    """The versions of the complete checkpoints (their schedule written last)."""
    root = run_dir / "checkpoints"
    return sorted(int(p.parent.name.split("_")[1]) for p in root.glob("step_*/schedule.json"))


def test_a_killed_demo_run_resumes_mid_way(ray_head: str, tmp_path: Path) -> None:
    """The shipped demo config checkpoints often enough (run.checkpoint_every) that a run
    SIGKILLed after a few of its 20 updates resumes from there: the restart starts at the
    checkpoint's version and its schedule's next group, not at version 0 and group 0."""
    from sandgym.trainer.config import load_config

    shipped = load_config(REPO / "sandgym/trainer/configs/demo.yaml")
    assert 0 < shipped.run.checkpoint_every < shipped.run.num_updates, shipped.run
    srv = ServerProcess("local", env={"SANDGYM_LOCAL_ROOT": str(tmp_path / "sb")})
    run_dir = tmp_path / "run"
    log = (tmp_path / "train1.log").open("w")
    first = subprocess.Popen(
        _demo(run_dir, srv.url, ray_head, None), cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=log, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        while not _checkpoints(run_dir):
            assert first.poll() is None, (tmp_path / "train1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 400 s"
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
        saved = _checkpoints(run_dir)[-1]
        assert 0 < saved < shipped.run.num_updates, saved  # mid-way
        before = {r["group_id"] for r in _records(run_dir)}
        second = subprocess.run(
            _demo(run_dir, srv.url, ray_head, saved + 1), cwd=REPO, capture_output=True,
            text=True, timeout=400,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        summary = json.loads(second.stdout.strip().splitlines()[-1])
        assert summary["start_version"] == saved and summary["version"] == saved + 1, summary
        schedule = json.loads(
            (run_dir / "checkpoints" / f"step_{saved:06d}" / "schedule.json").read_text()
        )
        assert schedule["next_group"] >= saved  # one group an update at least
        # the restart's own episodes (those it recovered from the killed run's flight are not)
        new = [
            r for r in _records(run_dir) if r["group_id"] not in before and not r.get("recovered")
        ]
        assert new, "the restart recorded no episode"
        groups = {int(str(r["group_id"]).rsplit("-g", 1)[1]) for r in new if r.get("group_id")}
        assert groups and min(groups) >= schedule["next_group"], (groups, schedule)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        srv.stop()
