"""Harbor's own released runner (`harbor run`, harbor 0.26.0, in its runner container) with
sandgym's provider pointed at a fleet of two `sandgym serve --backend docker` processes
(`SANDGYM_URL=http://A,http://B`): where the trials went, and what a SIGKILLed server does to
the job. Used by tests/e2e/test_harbor_fleet.py and by `python -m lab.bench.harbor_fleet`
(the record: lab/bench/results/harbor_fleet.json and its .raw.jsonl).

- `FleetServer`: one `sandgym serve --backend docker` child process (`ServerProcess`) with its
  own owner label, a short sandbox deadline (`SANDGYM_SANDBOX_GRACE_S`) and a token.
- `SandboxWatch`: a thread that polls every server's `GET /v1/sandboxes` and records which
  server held each Harbor environment (the provider names a sandbox after Harbor's
  `session_id`, `<trial>__env`): the per-server counts, without touching the servers.
- `owner_containers`: the engine's containers labelled with a server's owner (leftovers).
- `prepare_tb2`: a few Terminal-Bench 2.0 tasks beside the catalog's (`--tb2-dir DIR
  --tb2-select N`): chosen by `lab.bench.harbor_provider_tb2`'s rule over the committed
  harbor_compat record (clean, oracle shipped, shortest recorded duration), copied with the compat
  run's substitutions, and each built once into a local image named in the copy's
  `[environment] docker_image` (`lab.bench.harbor_shared_images`: the task.toml otherwise names
  a registry image that cannot be pulled here), so every server runs that one local image.
- `by_task`: a job's trials per task (rewards, exceptions, environments per server).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from lab.bench.harbor_runner import (
    SANDGYM_ENV,
    ensure_runner_image,
    harbor_argv,
    read_trials,
    runner_versions,
)
from lab.bench.harbor_shared_images import SharedImage
from lab.bench.report import save_json, start_run
from sandgym.server.runner import ServerProcess

REPO = Path(__file__).resolve().parents[2]
CATALOG_TASK = REPO / "sandgym" / "tasks" / "catalog" / "hello-file"
RESULTS = Path(__file__).resolve().parent / "results"
#: the retry a user sets so that Harbor retries trials whose server was lost, and only those
#: (Harbor 0.26's default is `max_retries` 0: no retry at all)
RETRY_LOST = ["--max-retries", "2", "--retry-include", "ServerLostError"]
COMPAT_JSONL = RESULTS / "harbor_compat.jsonl"
COMPAT_JSON = RESULTS / "harbor_compat.json"
PHASES = ("single", "fleet", "kill", "kill-default")


class FleetServer:
    """`sandgym serve --backend docker` in a child process, owner label `owner`."""

    def __init__(self, owner: str, token: str, grace_s: float = 5.0) -> None:
        self.owner = owner
        self.token = token
        self.proc = ServerProcess(
            backend="docker",
            env={
                "SANDGYM_BACKEND_OPTIONS": json.dumps({"owner_id": owner}),
                "SANDGYM_SANDBOX_GRACE_S": str(grace_s),
                "SANDGYM_TOKEN": token,
                "SANDGYM_INCLUDE_BUILTIN": "false",
            },
        )

    @property
    def url(self) -> str:
        return self.proc.http_url

    def sandboxes(self) -> list[dict[str, Any]]:
        r = httpx.get(
            self.url + "/v1/sandboxes",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=5,
        )
        r.raise_for_status()
        return list(r.json()["sandboxes"])

    def kill(self) -> None:
        """SIGKILL: no shutdown, no close of its sandboxes (their deadline ends them)."""
        self.proc.proc.send_signal(signal.SIGKILL)
        self.proc.proc.wait(timeout=30)

    def stop(self) -> None:
        self.proc.stop()


class SandboxWatch(threading.Thread):
    """Polls each server's sandbox list every `interval_s`; `seen[name]` = the servers (labels)
    that held a sandbox of that name. A server that stops answering is skipped."""

    def __init__(self, servers: dict[str, FleetServer], interval_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.servers = servers
        self.interval_s = interval_s
        self.seen: dict[str, set[str]] = {}
        self.order: dict[str, list[str]] = {}
        self.first_on: dict[str, threading.Event] = {k: threading.Event() for k in servers}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for label, server in self.servers.items():
                try:
                    listed = server.sandboxes()
                except httpx.HTTPError:
                    continue
                for sb in listed:
                    name = str(sb.get("name"))
                    self.seen.setdefault(name, set()).add(label)
                    order = self.order.setdefault(name, [])
                    if label not in order:
                        order.append(label)
                if listed:
                    self.first_on[label].set()
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def trials_per_server(self) -> dict[str, int]:
        """Harbor environments (`<trial>__env`) seen on each server."""
        return dict(Counter(label for servers in self.seen.values() for label in servers))

    def server_of(self, trial: str) -> list[str]:
        return sorted(self.seen.get(f"{trial}__env", set()))

    def servers_in_order(self, trial: str) -> list[str]:
        """The servers `trial`'s environment was first seen on, earliest first."""
        return list(self.order.get(f"{trial}__env", []))


def owner_containers(owner: str, running_only: bool = False) -> list[str]:
    """Ids of the containers labelled `sandgym.owner=owner`: every one (running or stopped),
    or only the running ones. A sandbox that ended itself at its deadline is a stopped
    container: docker keeps its disk until `sandgym reap` or the next server start on the host
    removes it (docs/operations.md)."""
    argv = ["docker", "ps", "-q", "--filter", f"label=sandgym.owner={owner}"]
    argv += ["--filter", "status=running"] if running_only else ["-a"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    return proc.stdout.split()


def remove_owner_containers(owner: str) -> list[str]:
    """`docker rm -f` the containers of `owner` only (what `sandgym reap` does to a dead
    owner's, without touching any other owner's orphans on a shared host); their ids."""
    ids = owner_containers(owner)
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, text=True, check=True)
    return ids


def slow_task(dest: Path, sleep_s: int = 10) -> Path:
    """A copy of the catalog's hello-file whose oracle waits `sleep_s` first, so a server can
    be killed while trials are in flight on it."""
    import shutil

    shutil.copytree(CATALOG_TASK, dest)
    solve = dest / "solution" / "solve.sh"
    text = solve.read_text().replace("set -euo pipefail\n", f"set -euo pipefail\nsleep {sleep_s}\n")
    solve.write_text(text)
    return dest


def run_job(
    *,
    tasks: Path,
    jobs: Path,
    name: str,
    url: str,
    token: str,
    attempts: int,
    concurrency: int,
    extra: list[str] | None = None,
    on_start: Any = None,
    timeout_s: float = 600,
) -> subprocess.CompletedProcess[str]:
    """One `harbor run` of the oracle over `tasks` against `url`; `on_start()` runs while the
    job runs (after the container started)."""
    argv = harbor_argv(
        tasks_path=tasks,
        jobs_dir=jobs,
        job_name=name,
        env=SANDGYM_ENV,
        agent="oracle",
        attempts=attempts,
        concurrency=concurrency,
        server_url=url,
        token=token,
        extra=extra,
    )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if on_start is not None:
        try:
            on_start()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    out, err = proc.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def job_stats(job_dir: Path) -> dict[str, Any]:
    """Harbor's own job result.json `stats` (n_retries, n_errored_trials, evals...)."""
    data = json.loads((job_dir / "result.json").read_text())
    return dict(data.get("stats") or {})


def prepare_tb2(
    tb2_dir: Path, n: int, dest: Path, cache_dir: Path, run_id: str
) -> tuple[dict[str, Any], list[SharedImage]]:
    """Select `n` Terminal-Bench 2.0 tasks of `tb2_dir` by `harbor_provider_tb2`'s rule over the
    committed harbor_compat record, write their prepared copies to `dest/<task>`, and build each
    one's image once (named in the copy's task.toml); what the record says of them, and the
    images (removed at the end)."""
    from lab.bench import harbor_provider_tb2 as tb2
    from lab.bench.harbor_shared_images import build_shared

    image_map = json.loads(COMPAT_JSON.read_text(encoding="utf-8")).get("image_map") or {}
    chosen = tb2.select_tasks(COMPAT_JSONL, image_map, n, tb2_dir)
    prepared = tb2.prepare(chosen, tb2_dir, dest, cache_dir)
    images = [build_shared(dest / t.task, run_id) for t in prepared]
    info = {
        "dataset": tb2.DATASET,
        "source": tb2.SOURCE,
        "selection": tb2.SELECTION_RULE.replace("the N ", f"the {len(prepared)} "),
        "compat_record": str(COMPAT_JSONL.relative_to(REPO)),
        "tasks": [t.model_dump() for t in prepared],
        "images": [i.model_dump() for i in images],
    }
    return info, images


def by_task(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` (one phase's raw lines) per task, by task name: trials, rewards (sorted, None
    last), exceptions and the environments each server held."""
    out = []
    for task in sorted({str(r["task"]) for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        rewards = sorted(
            (r["reward"] for r in mine), key=lambda x: (x is None, x if x is not None else 0.0)
        )
        out.append(
            {
                "task": task,
                "trials": len(mine),
                "rewards": rewards,
                "exceptions": sorted(str(r["exception"]) for r in mine),
                "environments_per_server": dict(
                    Counter(label for r in mine for label in r["servers"])
                ),
            }
        )
    return out


def main() -> None:  # pragma: no cover - the record writer, run by hand
    import argparse
    import shutil
    import tempfile

    from lab.bench.harbor_shared_images import remove_shared

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--attempts", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument(
        "--tb2-dir",
        type=Path,
        default=None,
        help="a Terminal-Bench 2.0 task folder (lab/bench/harbor_provider_tb2.py's SOURCE, "
        "fetched by hand, never committed): add --tb2-select of its tasks to every phase",
    )
    ap.add_argument("--tb2-select", type=int, default=3)
    ap.add_argument("--phases", nargs="*", choices=PHASES, default=list(PHASES))
    ap.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "hf-cache")
    ap.add_argument("--out", type=Path, default=RESULTS / "harbor_fleet.json")
    args = ap.parse_args()
    command = "python -m lab.bench.harbor_fleet --attempts " + str(args.attempts)
    if args.concurrency != 4:
        command += f" --concurrency {args.concurrency}"
    if args.tb2_dir is not None:
        command += f" --tb2-dir {args.tb2_dir} --tb2-select {args.tb2_select}"
    if list(args.phases) != list(PHASES):
        command += " --phases " + " ".join(args.phases)
    start_run(command)
    ensure_runner_image()
    token = "harbor-fleet-" + os.urandom(4).hex()
    run_id = "hf-" + os.urandom(4).hex()
    raw: list[dict[str, Any]] = []
    record: dict[str, Any] = {
        "runner": runner_versions(),
        "attempts": args.attempts,
        "concurrency": args.concurrency,
        "catalog_tasks": ["hello-file"],
    }
    images: list[SharedImage] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tasks = root / "tasks"
        shutil.copytree(CATALOG_TASK, tasks / "hello-file")
        slow_tasks = root / "slow"
        slow_task(slow_tasks / "hello-file-slow")
        if args.tb2_dir is not None:
            tb2, images = prepare_tb2(args.tb2_dir, args.tb2_select, tasks, args.cache_dir, run_id)
            record["tb2"] = tb2
            # the kill phases run the same Terminal-Bench 2.0 copies beside the slow hello-file
            for t in tb2["tasks"]:
                shutil.copytree(tasks / t["task"], slow_tasks / t["task"])
        jobs = root / "jobs"
        jobs.mkdir()
        try:
            for phase in args.phases:
                record[phase] = run_phase(phase, args, tasks, slow_tasks, jobs, token, raw)
        finally:
            record["shared_images_left"] = remove_shared(images)
    if "single" in record and "fleet" in record:
        record["rewards_identical_single_vs_fleet"] = (
            record["single"]["rewards"] == record["fleet"]["rewards"]
        )
        record["rewards_identical_single_vs_fleet_by_task"] = {
            "same": [t["rewards"] for t in record["single"]["by_task"]]
            == [t["rewards"] for t in record["fleet"]["by_task"]],
            "tasks": [t["task"] for t in record["fleet"]["by_task"]],
        }
    args.out.with_suffix(".raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    print(save_json(record, args.out))


def run_phase(  # pragma: no cover - the record writer, run by hand
    phase: str,
    args: Any,
    tasks: Path,
    slow_tasks: Path,
    jobs: Path,
    token: str,
    raw: list[dict[str, Any]],
) -> dict[str, Any]:
    """One job: `single` (server A only), `fleet` (A and B), `kill` (B SIGKILLed at its first
    sandbox, with `RETRY_LOST`), `kill-default` (the same, Harbor's default of no retry); its
    trials are appended to `raw`, its summary returned."""
    owners = {k: f"hf-{phase}-{k}-" + os.urandom(3).hex() for k in ("A", "B")}
    servers = {k: FleetServer(o, token) for k, o in owners.items()}
    if phase == "single":
        servers["B"].stop()
        del servers["B"]
    watch = SandboxWatch(servers)
    watch.start()
    url = ",".join(s.url for s in servers.values())

    def kill_b() -> None:
        if not watch.first_on["B"].wait(timeout=300):
            raise RuntimeError("server B never held a sandbox")
        servers["B"].kill()

    try:
        t0 = time.monotonic()
        proc = run_job(
            tasks=slow_tasks if phase.startswith("kill") else tasks,
            jobs=jobs,
            name=phase,
            url=url,
            token=token,
            attempts=args.attempts,
            concurrency=args.concurrency,
            extra=RETRY_LOST if phase == "kill" else None,
            on_start=kill_b if phase.startswith("kill") else None,
            timeout_s=3000,
        )
        wall = time.monotonic() - t0
        watch.stop()
        trials = read_trials(jobs / phase)
        rows = []
        for t in trials:
            harbor = json.loads((jobs / phase / t.trial / "result.json").read_text())
            rows.append(
                {
                    "phase": phase,
                    "trial": t.trial,
                    "task": t.task,
                    # the servers its environment was seen on, in attempt order (a trial
                    # lost on B and retried shows B then A; Harbor keeps only the last
                    # attempt's result)
                    "servers": watch.servers_in_order(t.trial),
                    "attempts_seen": len(watch.servers_in_order(t.trial)),
                    "reward": t.reward,
                    "reward_valid": harbor.get("reward_valid"),
                    "exception": t.exception,
                    "trial_s": t.trial_s,
                }
            )
        raw.extend(rows)
        stats = job_stats(jobs / phase)
        # B's sandboxes end by their own deadline (no server refreshes it after the kill)
        left_t0 = time.monotonic()
        while any(owner_containers(o, running_only=True) for o in owners.values()):
            if time.monotonic() - left_t0 > 120:
                break
            time.sleep(1)
        running_after_s = round(time.monotonic() - left_t0, 1)
        running_left = sum(len(owner_containers(o, True)) for o in owners.values())
        stopped = {k: len(owner_containers(o)) for k, o in owners.items()}
        for o in owners.values():
            remove_owner_containers(o)
    finally:
        watch.stop()
        for s in servers.values():
            if s.proc.proc.poll() is None:
                s.stop()
    return {
        "harbor_exit": proc.returncode,
        "wall_s": round(wall, 1),
        "trials": len(trials),
        "rewards": dict(Counter(str(t.reward) for t in trials)),
        "exceptions": dict(Counter(str(t.exception) for t in trials)),
        "environments_per_server": watch.trials_per_server(),
        "by_task": by_task(rows),
        "harbor_n_retries": stats.get("n_retries"),
        "harbor_n_errored_trials": stats.get("n_errored_trials"),
        # after the job: containers still running once the deadlines passed (0 = the
        # dead server's sandboxes ended themselves), how long until none ran, and the
        # stopped ones per server left for the reaper (removed by owner label after)
        "running_containers_after_deadline": running_left,
        "no_container_running_after_s": running_after_s,
        "stopped_containers_left_for_reap": stopped,
    }


if __name__ == "__main__":
    main()
