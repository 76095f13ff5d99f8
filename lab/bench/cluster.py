"""`sandgym bench cluster`: episodes per minute with one Ray node and with two, on a workload
bound by sandbox time (the task's solution is `sleep S`), and the time from a node's loss to the
run using the survivor only (issue 23).

Set-up (all on this machine, `ray.cluster_utils.Cluster`, every node on 127.0.0.1): a head that
offers no `sandgym` resource and worker nodes of `num_cpus=1, resources={"sandgym": 1}`. The
env servers are placed by the trainer's own fleet (`sandgym.trainer.cluster.EnvServerFleet`: one per
worker node, local backend, `--max-sessions` each), so a server's capacity, not the CPU, bounds
throughput. Episodes are driven the way `sandgym train` drives them: the `ServerBalancer` sends
each one to the least-loaded healthy server with room (its capacity as the server answers
`GET /v1/sessions`), an `EpisodeRunner` with the oracle agent plays it (writes the solution,
runs it: `sleep S` and a file the verifier checks, then submits). Every `--refresh-s` the fleet
follows nodes coming and going and the balancer asks every server its capacity; an episode that
lost its connection gets its server asked at once (the trainer's `_collect`).

Phases, one cluster: `one_node` (one worker node), then a second worker node joins
(`two_nodes`, same episodes and settings), then `node_loss`: with both nodes busy, once an
episode of this phase has ended submitted on the victim and the balancer has sent it the next
ones, the victim node is removed (`remove_node(allow_graceful=False)`: its raylet is killed,
and the env server's process with it, a moment later). Each throughput phase starts with one
unmeasured wave (`--max-sessions` episodes per server: servers load the task, pools fill). The
runner keeps the trainer's default `env.connect_retries` (a `capacity` refusal at reset and a
dropped connection are retried before the episode ends as a masked failure).

Figures (times in seconds from `killed_at`, the moment `remove_node` returned):
- `episodes_per_min`: measured episodes solved (submitted, reward 1) / (last end - first
  dispatch) * 60; `dispatched_at` is when the balancer chose the episode's server.
- `left_out_s`: until the balancer no longer offers the dead server (it did not answer a
  capacity poll, or the fleet saw its node die): from then on the run uses the survivor only.
- `first_survivor_dispatch_s`: until the first episode dispatched after that (it goes to the
  survivor); `first_survivor_episode_done_s`: until the first episode dispatched after the kill
  ends submitted on the survivor (episodes flow again on the survivor alone).
- `in_flight_at_kill` on the victim, and how they ended: `masked` (infrastructure failures,
  left out of their groups by the trainer), `submitted` (ended before the kill took effect);
  `dispatched_to_dead_after_kill`: episodes sent to the victim after the kill (before it was
  left out), each a masked failure too; `capacity_refusals`: episodes the server refused at
  reset (`capacity`) even after the retries.

Raw data: one record per episode (`--raw`, JSON lines), from which every figure is recomputed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.bench.report import save_json
from sandgym.sandboxes.reaper import reap
from sandgym.trainer.agents import OracleAgent, solutions_from_dir
from sandgym.trainer.cluster import EnvServerFleet, ServerBalancer
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.priority import local_ray_env
from sandgym.trainer.rollout import EpisodeRunner

TASK_ID = "bench-sleep"
MB = 1024 * 1024
PHASES = ("one_node", "two_nodes", "node_loss")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=48, help="measured episodes per phase")
    parser.add_argument("--sleep-s", type=float, default=3.0, help="the solution's `sleep`")
    parser.add_argument(
        "--max-sessions", type=int, default=4, help="max_sessions of each env server"
    )
    parser.add_argument(
        "--loss-episodes", type=int, default=32, help="episodes of the node-loss phase"
    )
    parser.add_argument("--refresh-s", type=float, default=1.0, help="fleet refresh and polls")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--out", type=Path, help="write the result here (lab/bench/results/...)")
    parser.add_argument("--raw", type=Path, help="per-episode records (JSON lines)")


def write_sleep_task(root: Path, sleep_s: float) -> Path:
    """A Harbor task whose solution sleeps `sleep_s` then leaves a file the verifier checks."""
    t = root / TASK_ID
    for sub in ("environment", "tests", "solution"):
        (t / sub).mkdir(parents=True, exist_ok=True)
    (t / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60\n')
    (t / "instruction.md").write_text(f"Wait {sleep_s:g} seconds, then create /app/done.\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "solution" / "solve.sh").write_text(f"#!/bin/bash\nsleep {sleep_s:g}\ntouch /app/done\n")
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    return root


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())}


class Driver:
    """Dispatches episodes over the fleet's servers through the balancer, records each one."""

    def __init__(self, fleet: Any, balancer: Any, runner: Any, refresh_s: float) -> None:
        self.fleet = fleet
        self.balancer = balancer
        self.runner = runner
        self.refresh_s = refresh_s
        self.records: list[dict[str, Any]] = []
        self.node_of: dict[str, str] = {}  # url -> node id
        self.left_out: dict[str, float] = {}  # url -> when the balancer stopped offering it
        self._refreshed_at = 0.0
        self.sync_servers()

    def sync_servers(self) -> None:
        """The fleet's servers into the balancer (those lost removed), then every capacity."""
        started, lost = self.fleet.refresh()
        for info in lost:
            self.balancer.remove(info.url)
        for info in self.fleet.servers.values():
            self.node_of[info.url] = info.node_id
            self.balancer.add(info.url, placed=True)
        self.balancer.poll()
        self._note_left_out()

    def _note_left_out(self) -> None:
        offered = set(self.balancer.healthy_urls())
        for url in self.node_of:
            if url not in offered and url not in self.left_out:
                self.left_out[url] = time.time()

    async def _one(self, phase: str, index: int, url: str, at: float) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "phase": phase,
            "index": index,
            "server_url": url,
            "node_id": self.node_of.get(url, ""),
            "dispatched_at": at,  # when the balancer chose its server
        }
        ep = await self.runner.run_episode(TASK_ID, index, url=url)
        rec.update(
            ended_at=time.time(),
            termination=ep.termination,
            masked=ep.is_infra_failure,
            reward=ep.reward,
            error=(ep.error or "")[:300] or None,
        )
        rec["duration_s"] = round(rec["ended_at"] - rec["dispatched_at"], 3)
        return rec

    async def run(
        self, phase: str, n: int, on_tick: Any = None, measured_from: int = 0
    ) -> list[dict[str, Any]]:
        """`n` episodes, as many at once as the servers have room for; `on_tick(done)` after
        each round of dispatching (`done`: this phase's records so far). Records of index <
        measured_from are marked unmeasured (the warm-up wave)."""
        pending: dict[asyncio.Task[dict[str, Any]], str] = {}
        out: list[dict[str, Any]] = []
        dispatched = 0
        while dispatched < n or pending:
            if time.monotonic() - self._refreshed_at >= self.refresh_s:
                self._refreshed_at = time.monotonic()
                await asyncio.to_thread(self.sync_servers)
            while dispatched < n:
                url = self.balancer.choose(1)
                if url is None:
                    break
                self.balancer.acquire(url)
                one = self._one(phase, dispatched, url, time.time())
                pending[asyncio.create_task(one)] = url
                dispatched += 1
            if on_tick is not None:
                on_tick(out)
            if not pending:
                await asyncio.sleep(min(0.2, self.refresh_s))
                continue
            done, _ = await asyncio.wait(
                pending, timeout=self.refresh_s, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                url = pending.pop(task)
                self.balancer.release(url)
                rec = task.result()
                rec["measured"] = rec["index"] >= measured_from
                if rec["termination"] == "connection":  # gone? then nothing new goes there
                    await asyncio.to_thread(self.balancer.poll, [url])
                    self._note_left_out()
                out.append(rec)
                self.records.append(rec)
        return out


def refusals(recs: list[dict[str, Any]]) -> int:
    """Episodes the server refused at reset with `capacity` (after the runner's retries)."""
    return sum("capacity" in (r["error"] or "") for r in recs)


def throughput(recs: list[dict[str, Any]], servers: int) -> dict[str, Any]:
    measured = [r for r in recs if r["measured"]]
    ok = [r for r in measured if r["termination"] == "submitted" and r["reward"] >= 1.0]
    start = min(r["dispatched_at"] for r in measured)
    end = max(r["ended_at"] for r in measured)
    durations = sorted(r["duration_s"] for r in ok)
    return {
        "servers": servers,
        "episodes": len(measured),
        "solved": len(ok),
        "failed": len(measured) - len(ok),
        "capacity_refusals": refusals(measured),
        "wall_s": round(end - start, 3),
        "episodes_per_min": round(len(ok) / (end - start) * 60, 2) if end > start else None,
        "episode_s_median": durations[len(durations) // 2] if durations else None,
        "episode_s_max": durations[-1] if durations else None,
    }


def node_loss(
    recs: list[dict[str, Any]], killed_at: float, victim: str, left_out_at: float | None
) -> dict[str, Any]:
    def since(t: float | None) -> float | None:
        return None if t is None else round(t - killed_at, 3)

    on_victim = [r for r in recs if r["node_id"] == victim]
    at_kill = [r for r in on_victim if r["dispatched_at"] <= killed_at < r["ended_at"]]
    after = [r for r in on_victim if r["dispatched_at"] > killed_at]
    to_survivor = sorted(
        (r for r in recs if r["node_id"] != victim and left_out_at is not None
         and r["dispatched_at"] >= left_out_at),
        key=lambda r: r["dispatched_at"],
    )  # fmt: skip
    flowing = sorted(
        r["ended_at"]
        for r in recs
        if r["node_id"] != victim and r["dispatched_at"] > killed_at
        and r["termination"] == "submitted"
    )  # fmt: skip
    return {
        "episodes": len(recs),
        "submitted": sum(r["termination"] == "submitted" for r in recs),
        "masked": sum(bool(r["masked"]) for r in recs),
        "capacity_refusals": refusals(recs),
        "left_out_s": since(left_out_at),
        "first_survivor_dispatch_s": since(
            to_survivor[0]["dispatched_at"] if to_survivor else None
        ),
        "first_survivor_episode_done_s": since(flowing[0] if flowing else None),
        "in_flight_at_kill": len(at_kill),
        "in_flight_at_kill_masked": sum(bool(r["masked"]) for r in at_kill),
        "in_flight_at_kill_submitted": sum(r["termination"] == "submitted" for r in at_kill),
        "dispatched_to_dead_after_kill": len(after),
        "dispatched_to_dead_after_kill_masked": sum(bool(r["masked"]) for r in after),
        "terminations_on_victim_after_kill": sorted(
            {r["termination"] for r in on_victim if r["ended_at"] > killed_at}
        ),
    }


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    tasks_root = write_sleep_task(root / "tasks", args.sleep_s)
    sandbox_root = root / "sandboxes"
    sandbox_root.mkdir()
    os.environ["SANDGYM_LOCAL_ROOT"] = str(sandbox_root)  # every node's servers inherit it
    # Ray's single-machine mode: every node and the driver on 127.0.0.1
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    node_args: dict[str, Any] = {"object_store_memory": 100 * MB}
    settings = {
        "backend": "local",
        "task_dirs": [str(tasks_root)],
        "include_builtin": False,
        "max_sessions": args.max_sessions,
        "pool_size": 1,
    }
    cfg = TrainConfig.model_validate(
        {
            "env": {"server_urls": [], "task_ids": [TASK_ID]},
            "agent": {"kind": "oracle", "solutions_dir": str(tasks_root)},
        }
    )
    runner = EpisodeRunner(cfg, None, OracleAgent(solutions_from_dir(tasks_root, prefix="")))
    result: dict[str, Any] = {}
    t0 = time.monotonic()
    local_ray_env()  # the nodes' workers at nice 0, not Ray's 15 (sandgym/trainer/priority.py)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, **node_args},
    )
    fleet = None
    try:
        workers = [cluster.add_node(num_cpus=1, resources={"sandgym": 1}, **node_args)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="sandgym-bench", log_to_driver=False)
        fleet = EnvServerFleet(settings)
        fleet.start()
        driver = Driver(fleet, ServerBalancer(), runner, args.refresh_s)
        result["cluster_start_s"] = round(time.monotonic() - t0, 1)
        warm = args.max_sessions
        recs = asyncio.run(driver.run("one_node", warm + args.episodes, measured_from=warm))
        result["one_node"] = throughput(recs, len(fleet.servers))

        workers.append(cluster.add_node(num_cpus=1, resources={"sandgym": 1}, **node_args))
        cluster.wait_for_nodes()
        driver.sync_servers()
        warm = 2 * args.max_sessions
        recs = asyncio.run(driver.run("two_nodes", warm + args.episodes, measured_from=warm))
        result["two_nodes"] = throughput(recs, len(fleet.servers))
        one, two = result["one_node"]["episodes_per_min"], result["two_nodes"]["episodes_per_min"]
        result["speedup_two_over_one"] = round(two / one, 3) if one and two else None

        victim = workers[1]
        victim_url = next(i.url for i in fleet.servers.values() if i.node_id == victim.node_id)
        kill: dict[str, float] = {}

        def maybe_kill(done: list[dict[str, Any]]) -> None:
            # once an episode of this phase ended on the victim and its next ones are in flight
            if kill or not any(
                r["node_id"] == victim.node_id and r["termination"] == "submitted" for r in done
            ):
                return
            if driver.balancer.servers[victim_url].in_flight < 1:
                return
            kill["called_at"] = time.time()
            cluster.remove_node(victim, allow_graceful=False)
            kill["killed_at"] = time.time()

        recs = asyncio.run(driver.run("node_loss", args.loss_episodes, on_tick=maybe_kill))
        for r in recs:
            r["measured"] = True
        if not kill:
            raise RuntimeError("node_loss: no episode ended on the victim node: nothing killed")
        result["node_loss"] = {
            "remove_node_s": round(kill["killed_at"] - kill["called_at"], 3),
            **node_loss(recs, kill["killed_at"], victim.node_id, driver.left_out.get(victim_url)),
        }
        result["episodes_raw"] = driver.records
    finally:
        if fleet is not None:
            try:
                fleet.refresh()
            except Exception:
                pass
            fleet.stop()
        ray.shutdown()
        cluster.shutdown()
    # what the dead server left (its sandboxes carry its pid): removed as `sandgym reap` does
    report = asyncio.run(reap(("local",), local_root_dir=sandbox_root))
    result["reaped_after"] = len(report.removed)
    return result


def run(args: argparse.Namespace) -> int:
    if args.episodes < 1 or args.loss_episodes < 1 or args.max_sessions < 1:
        raise SystemExit(
            "sandgym bench cluster: --episodes, --loss-episodes and --max-sessions must be >= 1"
        )
    start = machine()
    root = Path(tempfile.mkdtemp(prefix="sandgym-bench-cluster-"))
    try:
        result = measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    raw = result.pop("episodes_raw")
    doc: dict[str, Any] = {
        "benchmark": "cluster",
        "workload": {
            "task": TASK_ID,
            "agent": "oracle",
            "solution": f"sleep {args.sleep_s:g}; touch /app/done",
            "sleep_s": args.sleep_s,
            "backend": "local",
            "max_sessions_per_server": args.max_sessions,
            "episodes_per_phase": args.episodes,
            "warmup_episodes_per_server": args.max_sessions,
            "loss_episodes": args.loss_episodes,
            "refresh_s": args.refresh_s,
            "nodes": "ray.cluster_utils.Cluster on this machine: a head without the sandgym "
            "resource, worker nodes of num_cpus=1 and sandgym=1, one env server each",
        },
        **result,
        "machine": {
            "cpus": start["cpus"],
            "loadavg_start": start["loadavg"],
            "loadavg_end": list(os.getloadavg()),
        },  # fmt: skip
        "raw": str(args.raw) if args.raw else None,
    }
    if args.raw:
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        args.raw.write_text("".join(json.dumps(r) + "\n" for r in raw), encoding="utf-8")
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    else:
        for phase in ("one_node", "two_nodes"):
            print(f"{phase}: {doc[phase]}")
        print(f"speedup: {doc['speedup_two_over_one']}")
        print(f"node_loss: {doc['node_loss']}")
    return 0
