"""Harbor's own released runner (`harbor run`, harbor 0.26.0, in its runner container) with
sandgym's provider pointed at a fleet of two `sandgym serve --backend docker` processes, one
address `SANDGYM_URL=http://A,http://B`:

- spread: 4 oracle trials of the catalog's hello-file, 4 at once, land on both servers (the
  provider names each sandbox `<trial>__env`; a thread polls both servers' sandbox lists) and
  all score 1.0, as on one server (test_harbor_provider);
- kill: server B is SIGKILLed once it holds a sandbox, while the trials sleep in their oracle
  (a copy of hello-file that waits 10 s). The job, run with the retry a user sets for a lost
  server (`--max-retries 2 --retry-include ServerLostError`; Harbor's default is no retry),
  finishes; every trial scores 1.0 (those lost on B retried on A), Harbor counts the retries;
  none is scored 0. Afterwards no container of A's owner is left (Harbor's stop closed them) and
  none of B's runs: they ended by their own deadline (`SANDGYM_SANDBOX_GRACE_S=5`) without a
  server or reaper; their stopped containers (docker keeps the disk of a sandbox that ended
  itself until `sandgym reap`) are removed by owner label at the end, not by `sandgym reap`,
  which would also remove other owners' orphans on this shared host.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.bench.harbor_fleet import (
    CATALOG_TASK,
    RETRY_LOST,
    FleetServer,
    SandboxWatch,
    job_stats,
    owner_containers,
    remove_owner_containers,
    run_job,
    slow_task,
)
from lab.bench.harbor_runner import ensure_runner_image, read_trials
from tests.e2e.conftest import docker_image_available
from tests.waiting import wait_until_in_thread

TOKEN = "harbor-fleet-e2e"

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
    pytest.mark.timeout(900),
]


@pytest.fixture
def fleet() -> Iterator[dict[str, FleetServer]]:
    ensure_runner_image()
    servers: dict[str, FleetServer] = {}
    try:
        for label in ("A", "B"):
            servers[label] = FleetServer(f"test-hfleet-{label}-{os.urandom(3).hex()}", TOKEN)
        yield servers
    finally:
        for s in servers.values():
            if s.proc.proc.poll() is None:
                s.stop()
            remove_owner_containers(s.owner)  # a killed server's stopped sandboxes (ours only)


def _detail(proc: object, watch: SandboxWatch) -> str:
    out = getattr(proc, "stdout", "") or ""
    err = getattr(proc, "stderr", "") or ""
    return (
        f"exit {getattr(proc, 'returncode', None)} seen {watch.seen}\n{out[-3000:]}\n{err[-3000:]}"
    )


def test_harbor_trials_spread_over_a_fleet_of_two(
    fleet: dict[str, FleetServer], tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(CATALOG_TASK, tasks / "hello-file")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    watch = SandboxWatch(fleet)
    watch.start()
    try:
        proc = run_job(
            tasks=tasks,
            jobs=jobs,
            name="spread",
            url=f"{fleet['A'].url},{fleet['B'].url}",
            token=TOKEN,
            attempts=4,
            concurrency=4,
        )
    finally:
        watch.stop()
    detail = _detail(proc, watch)
    trials = read_trials(jobs / "spread")
    assert len(trials) == 4, detail
    assert [(t.reward, t.exception) for t in trials] == [(1.0, None)] * 4, (trials, detail)
    per_server = watch.trials_per_server()
    assert per_server.get("A", 0) >= 1 and per_server.get("B", 0) >= 1, detail
    assert all(len(watch.server_of(t.trial)) == 1 for t in trials), detail
    assert fleet["A"].sandboxes() == [] and fleet["B"].sandboxes() == []


def test_harbor_job_survives_a_killed_server(fleet: dict[str, FleetServer], tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    slow_task(tasks / "hello-file-slow", sleep_s=10)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    watch = SandboxWatch(fleet)
    watch.start()

    def kill_b() -> None:
        assert watch.first_on["B"].wait(timeout=300), "server B never held a sandbox"
        fleet["B"].kill()

    try:
        proc = run_job(
            tasks=tasks,
            jobs=jobs,
            name="kill",
            url=f"{fleet['A'].url},{fleet['B'].url}",
            token=TOKEN,
            attempts=4,
            concurrency=4,
            extra=RETRY_LOST,
            on_start=kill_b,
        )
    finally:
        watch.stop()
    detail = _detail(proc, watch)
    assert proc.returncode == 0, detail
    trials = read_trials(jobs / "kill")
    assert len(trials) == 4, detail
    # none scored as a task failure: every trial ends 1.0 (Harbor retried the lost ones)
    assert [(t.reward, t.exception) for t in trials] == [(1.0, None)] * 4, (trials, detail)
    lost = [t.trial for t in trials if "B" in watch.server_of(t.trial)]
    assert lost, f"no trial was on B when it was killed: {detail}"
    for name in lost:  # retried on the survivor
        assert watch.server_of(name) == ["A", "B"], detail
    stats = job_stats(jobs / "kill")
    assert stats.get("n_retries", 0) >= len(lost), (stats, detail)
    assert fleet["A"].sandboxes() == []
    # A's containers were removed by Harbor's stop; B's end by their own deadline (grace 5 s
    # after B's last refresh), with no server and no reaper: none runs, only their stopped
    # containers stay for `sandgym reap` (docs/operations.md), removed here by owner label
    assert owner_containers(fleet["A"].owner) == []
    owner_b = fleet["B"].owner
    asyncio.run(
        wait_until_in_thread(
            lambda: not owner_containers(owner_b, running_only=True),
            timeout_s=60.0,
            interval_s=1.0,
            what=f"no running container of the killed server's owner {owner_b}",
        )
    )
