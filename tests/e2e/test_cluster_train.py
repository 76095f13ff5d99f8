"""`sandgym train` across a Ray cluster of a head and two worker nodes on this machine
(`ray.cluster_utils.Cluster`, every node on 127.0.0.1), each worker offering the `sandgym`
resource: the trainer places one env server per worker (local backend), finds them through Ray
and balances groups over both; one worker node is killed mid-run (its env server and its
rollout actor die with it): its episodes in flight are masked (infrastructure failures, their
groups dropped), the run keeps training on the other node, a node that joins is used (its
server reaps what the dead one left), and `touch RUN_DIR/STOP` ends the run cleanly; every
sandbox is removed by the end.

CPU budget (2 cores): one CPU per node: the learner and two rollout actors (noop agent, a tiny
model) fill them, so the killed worker holds one rollout actor; env servers take no CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SANDGYM = [sys.executable, "-m", "sandgym.cli"]
SLOW_TASK = "slow-verify"
VERIFY_S = 2.0  # the slow task's verifier sleeps this long before it scores
MB = 1024 * 1024

pytestmark = pytest.mark.timeout(420)


def _wait(what: str, cond: Callable[[], Any], timeout_s: float, proc: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            log = getattr(proc, "log_path", None)
            tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
            raise AssertionError(
                f"the trainer exited ({proc.returncode}) while waiting for {what}; its log:\n{tail}"
            )
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")


def _episodes(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "episodes.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def _answers(http_url: str) -> bool:
    """Whether a server still accepts connections at `http_url` (any HTTP answer counts)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{http_url}/healthz", timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _owners(root: Path) -> dict[str, str]:
    """sandbox dir -> owner id of every local sandbox under root."""
    out = {}
    for d in [*root.glob("sg-*"), *root.glob("snap-*")]:
        try:
            out[d.name] = json.loads((d / "labels.json").read_text()).get("sandgym.owner", "")
        except (OSError, ValueError):
            continue
    return out


@pytest.fixture
def slow_task(tmp_path: Path) -> Path:
    """A task whose verifier takes 2 s, so that episodes are in flight when a node dies."""
    root = tmp_path / "tasks"
    t = root / SLOW_TASK
    for sub in ("environment", "tests", "solution"):
        (t / sub).mkdir(parents=True)
    (t / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30\n')
    (t / "instruction.md").write_text("Wait.\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "tests" / "test.sh").write_text(
        textwrap.dedent(
            """\
            #!/bin/bash
            mkdir -p /logs/verifier
            sleep 2  # VERIFY_S
            echo 0 > /logs/verifier/reward.txt
            """
        )
    )
    (t / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    return root


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    pytest.importorskip("torch")
    from ray.cluster_utils import Cluster

    # every node (and so every env server) keeps its local sandboxes here
    monkeypatch.setenv("SANDGYM_LOCAL_ROOT", str(tmp_path / "sandboxes"))
    (tmp_path / "sandboxes").mkdir()
    # Ray's single-machine mode: every node (and the driver) on 127.0.0.1, so the env
    # servers listen, and the trainer connects, on loopback only
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # (nodes, trainer)
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)  # (this one)
    # the nodes' workers at nice 0, as the README's `ray start` lines and sandgym's own local
    # Ray have them (Ray's default, 15, starves them on a busy host: sandgym/trainer/priority.py)
    monkeypatch.setenv("RAY_worker_niceness", "0")
    node = {"object_store_memory": 100 * MB}
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, **node},
    )
    try:
        c.workers = [c.add_node(num_cpus=1, resources={"sandgym": 1}, **node) for _ in range(2)]
        c.node_args = node
        c.wait_for_nodes()
        ray.init(address=c.address, namespace="sandgym-test")
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _nodes_of(cls: str) -> set[str]:
    """Nodes holding a live actor of class `cls` (GCS's actor table: no dashboard needed)."""
    from ray._private.state import actors

    return {
        a["Address"]["NodeID"]
        for a in actors().values()
        if a["ActorClassName"].split(".")[-1] == cls and a["State"] == "ALIVE"
    }


def test_train_across_two_nodes_survives_a_dead_node(
    cluster: Any, slow_task: Path, tmp_path: Path
) -> None:
    from sandgym.trainer.cluster import discover_servers

    run_dir = tmp_path / "run"
    settings = {"backend": "local", "task_dirs": [str(slow_task)], "pool_size": 1}
    overrides = [
        "env.server_urls=[]",
        "env.ray_servers=place",
        f"env.server_settings={json.dumps(settings)}",
        f"env.task_ids=[{SLOW_TASK}]",
        "env.refresh_s=1",
        "env.connect_retries=0",
        "agent.kind=noop",
        "rollout.num_workers=2",
        "rollout.num_cpus_per_worker=1",
        "rollout.concurrent_episodes=2",
        "algorithm.group_size=2",
        "algorithm.groups_per_update=1",
        "algorithm.max_staleness=100",
        # half the cluster dies on purpose: with one group of two per update, the update after
        # the kill may hold more lost episodes than scored ones (the ceiling is tested in
        # tests/unit/test_trainer_failures.py)
        "algorithm.max_masked_frac=1.0",
        "run.num_updates=1000",  # ended by STOP once every phase was seen
        f"run.ray_address={cluster.address}",
    ]
    cmd = [*SANDGYM, "train", str(REPO / "sandgym/trainer/configs/smoke.yaml"), "--run-dir",
           str(run_dir), "--json"]  # fmt: skip
    for ov in overrides:
        cmd += ["--override", ov]
    log_path = tmp_path / "train.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
    proc.log_path = log_path  # type: ignore[attr-defined]  # (for _wait's message)
    try:
        # 1. both nodes' servers are placed, found through Ray, and both get episodes
        _wait("two env servers", lambda: len(discover_servers()) == 2 or None, 180, proc)
        by_node = {s.node_id: s for s in discover_servers()}
        assert len(cluster.workers) == 2 and set(by_node) == {w.node_id for w in cluster.workers}
        assert [s.url.startswith("ws://127.0.0.1:") for s in by_node.values()] == [True, True]

        def done_on(url: str) -> list[dict[str, Any]]:
            return [e for e in _episodes(run_dir) if e["server_url"] == url
                    and e["termination"] == "submitted"]  # fmt: skip

        _wait(
            "episodes on both servers",
            lambda: all(done_on(s.url) for s in by_node.values()),
            180,
            proc,
        )

        # 2. kill the worker node that does not hold the learner (a node with a rollout actor)
        learner_nodes = _nodes_of("LearnerWorker")
        assert learner_nodes, "the learner is placed"
        victim = next(w for w in cluster.workers if w.node_id not in learner_nodes)
        assert victim.node_id in _nodes_of("RolloutWorker"), "a rollout actor is there"
        dead = by_node[victim.node_id]
        # episodes in flight on it (the verifier takes 2 s): wait for one to have a sandbox
        root = Path(os.environ["SANDGYM_LOCAL_ROOT"])
        _wait(
            "a sandbox of the victim's server",
            lambda: dead.owner_id in _owners(root).values(),
            60,
            proc,
        )
        before = len(_episodes(run_dir))
        # a machine lost: its raylet and, at once, the env server's process (a worker process
        # only notices its raylet's death a while later and would go on serving until then)
        cluster.remove_node(victim, allow_graceful=False)
        with contextlib.suppress(ProcessLookupError):
            os.kill(dead.pid, signal.SIGKILL)
        # gone: its port refuses; no result can be scored there after this moment
        _wait("the dead server refusing connections", lambda: not _answers(dead.http_url), 60)
        killed_at = time.time()
        survivor = next(s for n, s in by_node.items() if n != victim.node_id)

        # 3. the run goes on: new groups finish on the surviving node's server
        _wait(
            "episodes on the surviving server after the kill",
            lambda: len([e for e in done_on(survivor.url) if e["started_at"] > killed_at + 1]) >= 4,
            120,
            proc,
        )
        eps = _episodes(run_dir)
        on_dead = [e for e in eps[before:] if e["server_url"] == dead.url]
        # episodes in flight at the kill (or sent there before the trainer noticed) fail as
        # infrastructure, never as a score of the agent's
        # (Whether any is recorded depends on timing: the victim's own rollout actor dies with
        # its node, so only the survivor's episodes in flight there come back; 2 of 4 runs on
        # 2026-12-02 had none, so their presence is not asserted, only their kind.)
        lost = [e for e in on_dead if e["termination"] != "submitted"]
        # what failed after the kill, on any server: only infrastructure kinds. Its presence is
        # not asserted: the victim's rollout actor dies with its node, so its episodes in
        # flight may never come back (2 of 4 runs on 2026-12-02; the merged suite of
        # 2026-12-03 failed here once under load). What is asserted unconditionally: the
        # death is seen, nothing is scored after it and no new group goes there (below).
        failed = [e for e in eps[before:] if e["termination"] != "submitted"]
        kinds = {e["termination"] for e in failed}
        assert kinds <= {"connection", "error", "sandbox_lost"}, [
            (e["termination"], e["error"]) for e in failed
        ]
        # nothing is scored on the dead server once it is gone: an episode scored there ran its
        # 2 s verifier after it started, so it started more than VERIFY_S before the server died
        scored_late = [
            e for e in on_dead
            if e["termination"] == "submitted" and e["started_at"] > killed_at - VERIFY_S
        ]  # fmt: skip
        assert not scored_late, [(e["started_at"] - killed_at, e["seed"]) for e in scored_late]
        # and no new group goes there once the trainer noticed (its next capacity poll, or the
        # first lost connection)
        late = [e for e in lost if e["started_at"] > killed_at + 10]
        assert not late, [(e["started_at"] - killed_at, e["termination"]) for e in late]

        # 4. a node that joins is used, and its server reaps what the dead one left
        assert dead.owner_id in _owners(root).values(), "the dead server left sandboxes"
        fresh = cluster.add_node(num_cpus=1, resources={"sandgym": 1}, **cluster.node_args)
        newcomer = _wait(
            "a server on the new node",
            lambda: next((s for s in discover_servers() if s.node_id == fresh.node_id), None),
            180,
            proc,
        )
        _wait("episodes on the new node's server", lambda: done_on(newcomer.url), 180, proc)
        assert dead.owner_id not in _owners(root).values(), "the dead server's sandboxes stay"

        # 5. STOP ends the run cleanly; the summary counts the masked groups
        (run_dir / "STOP").touch()
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, log_path.read_text()[-3000:]
        # the summary is the trainer's last JSON line: Ray forwards the killed node's raylet
        # message to the driver's stdout when it arrives, after the summary at times
        printed = [ln for ln in out.splitlines() if ln.startswith("{")]
        assert printed, out[-3000:]
        summary = json.loads(printed[-1])
        assert summary["stopped_early"] and summary["version"] >= 2
        assert summary["groups"].get("dropped_groups_infra", 0) >= 1, summary
        assert summary["terminations"]["submitted"] >= 6
        # the trainer's servers were drained and removed: no sandbox is left
        assert _owners(root) == {}, _owners(root)
        assert not discover_servers()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
