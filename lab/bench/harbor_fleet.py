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
from lab.bench.report import save_json, start_run
from sandgym.server.runner import ServerProcess

REPO = Path(__file__).resolve().parents[2]
CATALOG_TASK = REPO / "sandgym" / "tasks" / "catalog" / "hello-file"
RESULTS = Path(__file__).resolve().parent / "results"
#: the retry a user sets so that Harbor retries trials whose server was lost, and only those
#: (Harbor 0.26's default is `max_retries` 0: no retry at all)
RETRY_LOST = ["--max-retries", "2", "--retry-include", "ServerLostError"]


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


def main() -> None:  # pragma: no cover - the record writer, run by hand
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--attempts", type=int, default=8)
    ap.add_argument("--out", type=Path, default=RESULTS / "harbor_fleet.json")
    args = ap.parse_args()
    start_run("python -m lab.bench.harbor_fleet --attempts " + str(args.attempts))
    ensure_runner_image()
    token = "harbor-fleet-" + os.urandom(4).hex()
    raw: list[dict[str, Any]] = []
    record: dict[str, Any] = {"runner": runner_versions(), "attempts": args.attempts}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tasks = root / "tasks"
        import shutil

        shutil.copytree(CATALOG_TASK, tasks / "hello-file")
        slow_tasks = root / "slow"
        slow_task(slow_tasks / "hello-file-slow")
        jobs = root / "jobs"
        jobs.mkdir()
        # kill: the retry a user sets for a lost server; kill-default: Harbor's default (none)
        for phase in ("single", "fleet", "kill", "kill-default"):
            owners = {k: f"hf-{phase}-{k}-" + os.urandom(3).hex() for k in ("A", "B")}
            servers = {k: FleetServer(o, token) for k, o in owners.items()}
            if phase == "single":
                servers["B"].stop()
                del servers["B"]
            watch = SandboxWatch(servers)
            watch.start()
            url = ",".join(s.url for s in servers.values())

            def kill_b(watch: SandboxWatch = watch, servers: dict = servers) -> None:
                if not watch.first_on["B"].wait(timeout=300):
                    raise RuntimeError("server B never held a sandbox")
                servers["B"].kill()

            t0 = time.monotonic()
            proc = run_job(
                tasks=slow_tasks if phase.startswith("kill") else tasks,
                jobs=jobs,
                name=phase,
                url=url,
                token=token,
                attempts=args.attempts,
                concurrency=4,
                extra=RETRY_LOST if phase == "kill" else None,
                on_start=kill_b if phase.startswith("kill") else None,
            )
            wall = time.monotonic() - t0
            watch.stop()
            trials = read_trials(jobs / phase)
            for t in trials:
                harbor = json.loads((jobs / phase / t.trial / "result.json").read_text())
                raw.append(
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
                    }
                )
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
            record[phase] = {
                "harbor_exit": proc.returncode,
                "wall_s": round(wall, 1),
                "trials": len(trials),
                "rewards": dict(Counter(str(t.reward) for t in trials)),
                "exceptions": dict(Counter(str(t.exception) for t in trials)),
                "environments_per_server": watch.trials_per_server(),
                "harbor_n_retries": stats.get("n_retries"),
                "harbor_n_errored_trials": stats.get("n_errored_trials"),
                # after the job: containers still running once the deadlines passed (0 = the
                # dead server's sandboxes ended themselves), how long until none ran, and the
                # stopped ones per server left for the reaper (removed by owner label after)
                "running_containers_after_deadline": running_left,
                "no_container_running_after_s": running_after_s,
                "stopped_containers_left_for_reap": stopped,
            }
            for s in servers.values():
                if s.proc.proc.poll() is None:
                    s.stop()
    record["rewards_identical_single_vs_fleet"] = (
        record["single"]["rewards"] == record["fleet"]["rewards"]
    )
    args.out.with_suffix(".raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    print(save_json(record, args.out))


if __name__ == "__main__":
    main()
