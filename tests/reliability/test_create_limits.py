"""Creation limits shared across processes (`sandgym.sandboxes.createlimit`).

- the cap: three `sandgym serve --backend local` processes, each asked for four episodes at
  once, share `max_starting=2`. Each sandbox's healthcheck (run inside it, as part of its
  creation) writes when it began and ended; from those, the sandboxes' own clocks, no more than
  two were ever being started at once, and the servers' /metrics show creations that waited.
- the rate: three processes take tokens from one bucket (rate 5/s, burst 1); the grants of all
  three together never exceed burst + rate x time.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import ServerProcess
from tests.reliability.conftest import needs_local

TASK = "limit-task"
SERVERS = 3
EPISODES = 4  # per server, all at once
MAX_STARTING = 2


def write_task(root: Path) -> Path:
    t = root / TASK
    (t / "tests").mkdir(parents=True)
    (t / "task.toml").write_text(
        'version = "1.0"\n[environment]\nnetwork_mode = "no-network"\n'
        'docker_image = "sandgym/terminal:latest"\n'
        "[environment.healthcheck]\n"
        'command = "date +%s.%N > /tmp/began; sleep 0.4; date +%s.%N > /tmp/ended"\n'
    )
    (t / "instruction.md").write_text("Do nothing.\n")
    (t / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(b, 1) for b, _ in intervals] + [(e, -1) for _, e in intervals])
    most = now = 0
    for _, step in events:  # an end at the same instant as a begin comes first (-1 < 1)
        now += step
        most = max(most, now)
    return most


@needs_local
async def test_servers_on_one_host_share_the_cap_on_sandboxes_being_started(
    tmp_path: Path,
) -> None:
    tasks = write_task(tmp_path / "tasks")
    root = tmp_path / "local"  # one root for all: the sandboxes' trees are read from it
    limits = {"local": {"max_starting": MAX_STARTING, "directory": str(tmp_path / "limits")}}
    env = {
        "SANDGYM_INCLUDE_BUILTIN": "false",
        "SANDGYM_REAP_ON_START": "false",
        "SANDGYM_BACKEND_OPTIONS": json.dumps({"root": str(root)}),
        "SANDGYM_CREATE_LIMITS": json.dumps(limits),
    }
    servers = await asyncio.gather(
        *(
            asyncio.to_thread(ServerProcess, "local", args=["--tasks", str(tasks)], env=env)
            for _ in range(SERVERS)
        )
    )
    clients: list[AsyncEnvClient] = []
    try:
        for srv in servers:
            clients += [AsyncEnvClient(srv.url, request_timeout_s=180) for _ in range(EPISODES)]
        await asyncio.gather(*(c.reset(TASK) for c in clients))
        intervals = []
        for tree in sorted(root.glob("sg-*")):
            began = (tree / "fs" / "tmp" / "began").read_text()
            ended = (tree / "fs" / "tmp" / "ended").read_text()
            intervals.append((float(began), float(ended)))
        assert len(intervals) == SERVERS * EPISODES
        assert most_at_once(intervals) <= MAX_STARTING, sorted(intervals)
        waits = 0.0
        async with httpx.AsyncClient() as http:
            for srv in servers:
                text = (await http.get(f"{srv.http_url}/metrics")).text
                for line in text.splitlines():
                    if line.startswith("sandgym_pool_create_limits_waits "):
                        waits += float(line.split()[1])
        assert waits >= 1  # the waiting is visible in the servers' metrics
    finally:
        for c in clients:
            await c.close()
        await asyncio.gather(*(asyncio.to_thread(s.stop) for s in servers))


WORKER = """
import asyncio, json, sys
from sandgym.sandboxes.createlimit import CreateLimitSettings, HostCreateLimiter

async def main():
    lim = HostCreateLimiter("e2b", CreateLimitSettings(rate_per_s=5, burst=1, directory=sys.argv[1]))
    grants = []
    for _ in range(4):
        async with lim.starting():
            grants.append(lim.last_grant)
    print(json.dumps(grants))

asyncio.run(main())
"""


def test_processes_share_one_creation_rate(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    grants = sorted(g for p in procs for g in json.loads(p.communicate(timeout=120)[0]))
    assert len(grants) == 12
    for i in range(len(grants)):
        for j in range(i + 1, len(grants)):
            # j - i + 1 tokens within [grants[i], grants[j]]: at most burst + rate x time
            assert j - i + 1 <= 1 + 5 * (grants[j] - grants[i]) + 1e-6, (i, j, grants)
