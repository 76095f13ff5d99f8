"""Episodes in flight, kept in the run directory so that a trainer restart loses none of them.

While an episode runs, its rollout worker keeps one file for it in `<run_dir>/inflight/`: the
server it runs on, its session id and resume token, and the episode so far (turns with their
tokens), rewritten after each step. When the episode ends the worker writes the finished episode
into the file (`ended`), and the trainer removes the file once it has written the episode's
record (`forget`): a trainer that dies in between (its Ray actors may finish their episodes
after it is gone) finds the result there. A trainer killed mid-update leaves the files of the
episodes it had in flight; the servers keep those sessions (a dropped connection's episode waits
`resume_grace_s` for a `resume`, and its sandbox lives on: `sandgym.sandboxes.lifetime`). On restart with
`run.resume`, `recover` records each ended one as it ended (unless episodes.jsonl has it already),
and resumes each other one on its server and submits it: the verifier scores the sandbox as the
agent left it, and the episode is recorded with its turns, its reward and `recovered: true` (an
episode the dead trainer was submitting when it died: a resume finds its submit still running
and waits for it, or finds it ended and takes the reply the server kept for that request, a
resend that never runs the verifier twice). One
whose server or session is gone is recorded masked as infrastructure (`connection`), and the
counts are reported (log, and `<run_dir>/inflight_recovery.json`).

A recovered episode is scored but not trained on: its group's other members were in the killed
trainer's memory, so its advantage group cannot be formed again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.trainer.episode import Episode, EpisodeWriter, Trajectory, read_episodes
from sandgym.trainer.episode_runner import EpisodeSession

log = logging.getLogger(__name__)

INFLIGHT_DIR = "inflight"
#: how long a recovery waits for a request the dead trainer left running on the server (its
#: submit in the verifier: a verifier's own limit is rarely longer), and how often it looks
BUSY_WAIT_S = 1800.0
BUSY_POLL_S = 0.5


def episode_key(episode: Episode | dict[str, Any]) -> str:
    """The file name an episode is kept under: the same from the worker's `Episode` and from
    the trainer's copy or record of it (task, seed, group, start time)."""
    get: Callable[[str], Any] = (
        episode.get if isinstance(episode, dict) else lambda k: getattr(episode, k)
    )
    ident = f"{get('task_id')}|{get('seed')}|{get('group_id')}|{float(get('started_at'))!r}"
    return hashlib.sha1(ident.encode()).hexdigest()[:24]


def forget(run_dir: Path | str, episode: Episode | dict[str, Any]) -> None:
    """The trainer recorded `episode`: its file is not needed any more."""
    (Path(run_dir) / INFLIGHT_DIR / f"{episode_key(episode)}.json").unlink(missing_ok=True)


def abandon(run_dir: Path | str) -> None:
    """The run finished: the episodes still in flight (their workers killed) are past its end,
    and a later `--resume` (more updates) must not record them."""
    for path in (Path(run_dir) / INFLIGHT_DIR).glob("*.json"):
        path.unlink(missing_ok=True)


class InflightBook:
    """The files of one process's episodes in flight (one file per episode)."""

    def __init__(self, run_dir: Path | str) -> None:
        self.dir = Path(run_dir) / INFLIGHT_DIR
        self.dir.mkdir(parents=True, exist_ok=True)

    def _write(self, key: str, data: dict[str, Any]) -> None:
        tmp = self.dir / f".{key}.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.dir / f"{key}.json")

    async def opened(self, episode: Episode, client: Any) -> str | None:
        """After the reset: the episode's session, so a new trainer can resume it. None when
        the client has no session to resume (nothing is kept then)."""
        session_id = getattr(client, "session_id", None)
        token = getattr(client, "resume_token", None)
        if not session_id or not token:
            return None
        key = episode_key(episode)
        data = {
            "session_id": session_id,
            "resume_token": token,
            "server_url": episode.server_url or str(getattr(client, "url", "")),
            "opened_at": time.time(),
            "episode": episode.to_dict(with_tokens=True),
        }
        await asyncio.to_thread(self._write, key, data)
        return key

    async def stepped(self, key: str | None, episode: Episode, client: Any) -> None:
        """After a step: the episode so far (its session stays the same)."""
        if key is None:
            return
        path = self.dir / f"{key}.json"

        def update() -> None:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                return
            data["episode"] = episode.to_dict(with_tokens=True)
            self._write(key, data)

        await asyncio.to_thread(update)

    async def ended(self, key: str | None, episode: Episode) -> None:
        """The episode ended (scored, or failed): nothing to resume; its result is kept until
        the trainer has recorded it (`forget`)."""
        if key is None:
            return

        def write() -> None:
            self._write(key, {"ended": True, "episode": episode.to_dict(with_tokens=True)})

        await asyncio.to_thread(write)


@dataclass
class Recovery:
    """What `recover` did: the episodes it recorded, and how many of each kind."""

    episodes: list[Episode] = field(default_factory=list)
    resumed: int = 0  # resumed on their server and scored
    lost: int = 0  # server or session gone: masked as infrastructure
    ended: int = 0  # ended before the restart, never recorded: recorded as they ended

    def to_json(self) -> dict[str, Any]:
        return {
            "resumed": self.resumed,
            "lost": self.lost,
            "ended": self.ended,
            "episodes": len(self.episodes),
        }


async def _recover_one(data: dict[str, Any], open_client: Callable[[str], Any]) -> Episode:
    rec = data["episode"]
    episode = Episode.from_dict(rec)
    episode.metrics["recovered"] = 1.0
    if not episode.trajectories:
        episode.trajectories.append(Trajectory(role="agent"))
    try:
        async with open_client(data["server_url"]) as client:
            deadline = time.monotonic() + BUSY_WAIT_S
            while True:
                obs, info = await client.resume(data["session_id"], data["resume_token"])
                info = info or {}
                if info.get("ended") and info.get("last_request_id"):
                    # it ended while no one listened (the dead trainer's submit, a limit): the
                    # server kept that last reply; a resend of its request gets it, not a rerun
                    res = await client.replay(str(info["last_request_id"]))
                    break
                session = EpisodeSession(client, episode, episode.trajectories[0], obs, info)
                try:
                    res = await session.submit_to_the_end()
                    break
                except EnvError as exc:
                    # a request of the dead trainer's still runs there (its submit in the
                    # verifier): once it ends, resume again (ended, or ready for a submit)
                    busy = exc.code == "invalid_message" and exc.retryable
                    if not busy or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(BUSY_POLL_S)
            episode.trajectories[0].reward = float(res.reward)
            episode.termination = "submitted" if res.terminated else "env_truncated"
            episode.error = None
    except (EnvError, OSError, TimeoutError) as exc:  # server or session gone
        episode.termination = "connection"
        episode.error = f"not resumed after the trainer's restart: {type(exc).__name__}: {exc}"
        for t in episode.trajectories:
            t.reward = 0.0
    return episode


async def recover(
    run_dir: Path | str,
    open_client: Callable[[str], Any] | None = None,
    token: str | None = None,
    recorded: set[str] | None = None,
) -> Recovery:
    """Resume and score every episode a killed trainer left in flight, and take those that
    ended unrecorded as they are (module docstring); removes their files. `recorded`: keys of
    episodes already in the run's records (skipped). `open_client(url)`: an async context
    manager giving an env client."""

    def default(url: str) -> Any:
        return AsyncEnvClient(url, token=token, request_timeout_s=600, max_reconnects=0)

    opener = open_client or default
    book = Path(run_dir) / INFLIGHT_DIR
    out = Recovery()
    files = sorted(book.glob("*.json")) if book.is_dir() else []
    loaded = []
    for path in files:
        try:
            loaded.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as exc:
            log.warning("inflight: unreadable %s left alone: %s", path, exc)
    done = [(p, d) for p, d in loaded if d.get("ended")]
    live = [(p, d) for p, d in loaded if not d.get("ended")]
    for path, data in done:
        if path.stem not in (recorded or set()):
            ep = Episode.from_dict(data["episode"])
            ep.metrics["recovered"] = 1.0
            out.episodes.append(ep)
            out.ended += 1
        path.unlink(missing_ok=True)
    episodes = await asyncio.gather(*(_recover_one(d, opener) for _, d in live))
    for (path, _), ep in zip(live, episodes, strict=True):
        out.episodes.append(ep)
        if ep.termination == "connection":
            out.lost += 1
        else:
            out.resumed += 1
        path.unlink(missing_ok=True)
    return out


def recover_into_run(run_dir: Path, token: str | None, version: int) -> Recovery | None:
    """The trainer's restart hook: recover, append the episodes to episodes.jsonl (marked
    `recovered`), write inflight_recovery.json and log the counts. None when nothing was in
    flight."""

    book = run_dir / INFLIGHT_DIR
    if not book.is_dir() or not any(book.glob("*.json")):
        return None
    records = run_dir / "episodes.jsonl"
    recorded = {episode_key(r) for r in read_episodes(records)} if records.exists() else set()
    result = asyncio.run(recover(run_dir, token=token, recorded=recorded))
    writer = EpisodeWriter(run_dir / "episodes.jsonl")
    try:
        for ep in result.episodes:
            writer.write(ep, received_at_version=version, recovered=True)
    finally:
        writer.close()
    (run_dir / "inflight_recovery.json").write_text(json.dumps(result.to_json()))
    log.info(
        "restart: %d episodes in flight before it: %d resumed on their servers and scored, "
        "%d lost with their server or session (masked as infrastructure), %d had ended "
        "unrecorded (recorded as they ended)",
        len(result.episodes),
        result.resumed,
        result.lost,
        result.ended,
    )
    return result
