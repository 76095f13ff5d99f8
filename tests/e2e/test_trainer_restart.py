"""A trainer restart loses no episode in flight (sandgym/trainer/inflight.py).

A process runs an episode the way the trainer's rollout workers do (`run_episode` with the run
directory's `InflightBook`) against a real `sandgym serve --backend local` process, takes one turn
(writes the file the task's verifier checks), and is SIGKILLed mid-episode. The restart hook
(`recover_into_run`, what `sandgym train` runs with `run.resume`) resumes the episode on its
server and scores it: reward 1, its turn kept, recorded with `recovered`. A second in-flight
record whose session the server no longer has is recorded masked as infrastructure, and the
counts are reported."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgym.client.env_client import EnvError
from sandgym.server.runner import ServerProcess
from sandgym.trainer.episode import Episode, EpisodeWriter, Trajectory, read_episodes
from sandgym.trainer.episode_runner import EpisodeSession
from sandgym.trainer.failures import is_masked
from sandgym.trainer.inflight import INFLIGHT_DIR, InflightBook, episode_key, recover_into_run
from tests.e2e.conftest import NULL_TASK
from tests.waiting import wait_until

TRAINER = """
import asyncio, sys
from pathlib import Path
from sandgym.client.env_client import AsyncEnvClient
from sandgym.trainer.episode import Episode
from sandgym.trainer.episode_runner import run_episode
from sandgym.trainer.inflight import InflightBook

async def play(session):
    await session.step({"kind": "command", "command": "echo hello > /app/hello.txt"})
    await asyncio.sleep(3600)  # killed here, mid-episode

asyncio.run(run_episode(
    lambda: AsyncEnvClient(sys.argv[1]), Episode(task_id=sys.argv[3], seed=7, group_id="g7"),
    play, book=InflightBook(Path(sys.argv[2])),
))
"""


def steps_kept(run_dir: Path) -> int:
    files = list((run_dir / INFLIGHT_DIR).glob("*.json"))
    if not files:
        return 0
    episode = json.loads(files[0].read_text())["episode"]
    return sum(len(t["steps"]) for t in episode["trajectories"])


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
async def test_episode_in_flight_survives_a_killed_trainer(task_dir: Path, tmp_path: Path) -> None:
    srv = await asyncio.to_thread(
        ServerProcess,
        "local",
        args=["--tasks", str(task_dir)],
        env={"SANDGYM_INCLUDE_BUILTIN": "false", "SANDGYM_RESUME_GRACE_S": "300"},
    )
    run_dir = tmp_path / "run"
    trainer = None
    try:
        trainer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", TRAINER, srv.url, str(run_dir), NULL_TASK
        )
        await wait_until(lambda: steps_kept(run_dir) >= 1, 120.0, 0.1, "a turn kept in flight")
        trainer.send_signal(signal.SIGKILL)
        await asyncio.wait_for(trainer.wait(), 30)
        # a second one whose session the server does not have (its server restarted, say)
        gone = {
            "session_id": "ses-0000000000000000",
            "resume_token": "nope",
            "server_url": srv.url,
            "episode": Episode(task_id=NULL_TASK, seed=8, group_id="g8").to_dict(),
        }
        (run_dir / INFLIGHT_DIR / "gone.json").write_text(json.dumps(gone))
        # two that ended before the trainer recorded them (its Ray actors outlive it a while):
        # one the trainer had recorded just before dying (skipped), one it had not (recorded)
        book = InflightBook(run_dir)
        for seed in (9, 10):
            done = Episode(task_id=NULL_TASK, seed=seed, group_id=f"g{seed}")
            done.trajectories.append(Trajectory(reward=1.0))
            await book.ended(episode_key(done), done)
            if seed == 9:
                EpisodeWriter(run_dir / "episodes.jsonl").write(done, received_at_version=2)

        result = await asyncio.to_thread(recover_into_run, run_dir, None, 3)
        assert result is not None and (result.resumed, result.lost, result.ended) == (1, 1, 1)
        assert json.loads((run_dir / "inflight_recovery.json").read_text())["lost"] == 1
        assert not list((run_dir / INFLIGHT_DIR).glob("*.json"))  # nothing left to resume
        seeds = [r["seed"] for r in read_episodes(run_dir / "episodes.jsonl")]
        assert sorted(seeds) == [7, 8, 9, 10]  # each once: the recorded one not again
        records = {r["seed"]: r for r in read_episodes(run_dir / "episodes.jsonl")}
        assert records[10]["recovered"] and records[10]["reward"] == 1.0  # as it ended
        kept, lost = records[7], records[8]
        assert kept["termination"] == "submitted" and kept["reward"] == 1.0  # scored as left
        assert kept["recovered"] and kept["received_at_version"] == 3
        assert kept["trajectories"][0]["steps"][0]["action"]["command"].startswith("echo hello")
        assert kept["cost"]["commands"] == 1  # the server's ledger covers the whole episode
        assert lost["termination"] == "connection" and lost["reward"] == 0.0
        assert is_masked(lost["termination"])  # masked as infrastructure, not scored 0
    finally:
        if trainer is not None and trainer.returncode is None:
            trainer.kill()
            await trainer.wait()
        await asyncio.to_thread(srv.stop)


GATED_TASK = "gated-verify"
SUBMITTER = """
import asyncio, sys
from pathlib import Path
from sandgym.client.env_client import AsyncEnvClient
from sandgym.trainer.episode import Episode
from sandgym.trainer.episode_runner import run_episode
from sandgym.trainer.inflight import InflightBook

async def play(session):
    await session.step({"kind": "command", "command": "echo hello > /app/hello.txt"})
    return "submitted"  # run_episode submits: killed while the verifier waits at its gate

asyncio.run(run_episode(
    lambda: AsyncEnvClient(sys.argv[1]), Episode(task_id=sys.argv[3], seed=11, group_id="g11"),
    play, book=InflightBook(Path(sys.argv[2])),
))
"""


def _live_sessions(srv: ServerProcess) -> int:
    reply = httpx.get(f"http://{srv.host}:{srv.port}/v1/sessions", timeout=10)
    return int(reply.json()["count"])


def _gated_task(root: Path) -> Path:
    """A task whose verifier says it started (/app/verifying) and then waits for /app/go."""
    t = root / GATED_TASK
    for sub in ("environment", "tests", "solution"):
        (t / sub).mkdir(parents=True)
    (t / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 300\n')
    (t / "instruction.md").write_text("Write hello to /app/hello.txt\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\ntouch /app/verifying\n"
        "while [ ! -e /app/go ]; do sleep 0.1; done\n"
        'if [ "$(cat /app/hello.txt)" = hello ]; then r=1; else r=0; fi\n'
        "echo $r > /logs/verifier/reward.txt\n"
    )
    (t / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    return root


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
@pytest.mark.parametrize("release", ["before", "during"])
async def test_an_episode_killed_in_its_submit_is_scored_once(
    tmp_path: Path, release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer dies while its submit runs the verifier. `before`: the verifier is released
    before the restart, so the episode has ended when it resumes (the reply the server kept is
    taken); `during`: released while the restart waits on the submit still running there."""
    tasks, sandboxes = _gated_task(tmp_path / "tasks"), tmp_path / "sandboxes"
    srv = await asyncio.to_thread(
        ServerProcess,
        "local",
        args=["--tasks", str(tasks)],
        env={"SANDGYM_INCLUDE_BUILTIN": "false", "SANDGYM_RESUME_GRACE_S": "300",
             "SANDGYM_LOCAL_ROOT": str(sandboxes)},
    )  # fmt: skip
    run_dir = tmp_path / "run"
    trainer = None
    # the restart's submits refused because the dead trainer's submit still runs there
    busy = threading.Event()
    submit = EpisodeSession.submit_to_the_end

    async def watched(self: EpisodeSession) -> Any:
        try:
            return await submit(self)
        except EnvError as exc:
            busy.set()
            assert exc.code == "invalid_message" and exc.retryable, exc
            raise

    monkeypatch.setattr(EpisodeSession, "submit_to_the_end", watched)

    def started() -> list[Path]:
        return list(sandboxes.glob("sg-*/fs/app/verifying"))

    try:
        trainer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SUBMITTER, srv.url, str(run_dir), GATED_TASK
        )
        await wait_until(lambda: bool(started()), 120.0, 0.1, "the verifier at its gate")
        trainer.send_signal(signal.SIGKILL)
        await asyncio.wait_for(trainer.wait(), 30)
        gate = started()[0].parent / "go"
        if release == "before":
            gate.touch()
            await wait_until(  # the submit ended, its reply kept for no one: no live session
                lambda: _live_sessions(srv) == 0, 120, 0.1, "the episode ended unheard"
            )
            result = await asyncio.to_thread(recover_into_run, run_dir, None, 1)
        else:
            recovery = asyncio.create_task(asyncio.to_thread(recover_into_run, run_dir, None, 1))
            assert await asyncio.to_thread(busy.wait, 120), "the restart never met the submit"
            gate.touch()  # the verifier ends; the restart, waiting, takes its reply
            result = await asyncio.wait_for(recovery, 120)
        assert busy.is_set() == (release == "during")
        assert result is not None and (result.resumed, result.lost) == (1, 0), result
        (record,) = read_episodes(run_dir / "episodes.jsonl")
        assert record["termination"] == "submitted" and record["reward"] == 1.0, record
        assert record["recovered"] and record["error"] is None
    finally:
        if trainer is not None and trainer.returncode is None:
            trainer.kill()
            await trainer.wait()
        await asyncio.to_thread(srv.stop)


ORPHAN = """
import asyncio, os, signal, sys
from pathlib import Path
from sandgym.client.env_client import AsyncEnvClient
from sandgym.trainer.episode import Episode
from sandgym.trainer.episode_runner import run_episode
from sandgym.trainer.inflight import InflightBook

class DiesAfterTheReset(InflightBook):
    async def opened(self, episode, client):  # the server replied; its session is never written
        os.kill(os.getpid(), signal.SIGKILL)

async def play(session):
    raise AssertionError("never reached")

asyncio.run(run_episode(
    lambda: AsyncEnvClient(sys.argv[1]), Episode(task_id=sys.argv[3], seed=12, group_id="g12"),
    play, book=DiesAfterTheReset(Path(sys.argv[2])),
))
"""


def _sessions(srv: ServerProcess) -> list[dict[str, Any]]:
    reply = httpx.get(f"{srv.http_url}/v1/sessions", timeout=10)
    return list(reply.json()["sessions"])


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
async def test_an_orphaned_session_is_found_and_counted(task_dir: Path, tmp_path: Path) -> None:
    """A worker killed between the server's reset reply and writing its session (issue 58 item
    6): the restart finds the detached session from the intent the worker wrote before the
    reset, records the episode masked and counts it; the server ends the session at its grace."""
    srv = await asyncio.to_thread(
        ServerProcess,
        "local",
        args=["--tasks", str(task_dir)],
        env={
            "SANDGYM_INCLUDE_BUILTIN": "false",
            "SANDGYM_RESUME_GRACE_S": "15",
            "SANDGYM_SWEEP_INTERVAL_S": "0.2",
        },
    )
    run_dir = tmp_path / "run"
    try:
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ORPHAN, srv.url, str(run_dir), NULL_TASK
        )
        assert await asyncio.wait_for(worker.wait(), 120) == -signal.SIGKILL
        left = [json.loads(p.read_text()) for p in (run_dir / INFLIGHT_DIR).glob("*.json")]
        assert len(left) == 1 and left[0]["intent"] and "session_id" not in left[0], left
        await wait_until(
            lambda: [s["attached"] for s in _sessions(srv)] == [False], 30.0, 0.1, "detached"
        )
        orphan = _sessions(srv)[0]["session_id"]

        result = await asyncio.to_thread(recover_into_run, run_dir, None, 4)
        assert result is not None and (result.orphaned, result.resumed, result.lost) == (1, 0, 0)
        assert result.orphan_sessions == [orphan], result.episodes[0].error
        report = json.loads((run_dir / "inflight_recovery.json").read_text())
        assert report["orphaned"] == 1 and report["orphan_sessions"] == [orphan]
        assert not list((run_dir / INFLIGHT_DIR).glob("*.json"))
        (record,) = read_episodes(run_dir / "episodes.jsonl")
        assert record["seed"] == 12 and record["recovered"]
        assert record["termination"] == "connection" and is_masked(record["termination"])
        assert orphan in record["error"] and "orphaned" in record["error"]
        # the server ends it when its grace runs out: its slot is free again
        await wait_until(lambda: not _sessions(srv), 60.0, 0.2, "the orphan's session ended")
    finally:
        await asyncio.to_thread(srv.stop)
