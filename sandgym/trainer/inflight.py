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

Orphans. A worker killed between the server's reset reply and writing the session into the
episode's file would leave a session no file names: it kept a server slot until `resume_grace_s`
ended, and the episode was neither resumed nor counted. So the worker first writes an *intent*
(`InflightBook.intent`: server, task, seed, group, the time, before the reset is sent), which
`opened` then overwrites with the session. On restart an intent still there is an orphan: the
restart looks for its session in the server's `GET /v1/sessions` (a detached session of the same
task and seed, started after the intent was written; each session matched once), records the
episode masked as infrastructure (`connection`, its error naming the session found or saying none
was) and counts it (`orphaned`, `orphan_sessions` in inflight_recovery.json). It cannot resume
or close it (the resume token never reached the file): the server ends the detached session
when its `resume_grace_s` runs out, as it ends any episode nobody came back for.

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
from urllib.parse import urlsplit, urlunsplit

import httpx

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.trainer.episode import Episode, EpisodeWriter, Trajectory, read_episodes
from sandgym.trainer.episode_runner import EpisodeSession

log = logging.getLogger(__name__)

INFLIGHT_DIR = "inflight"
#: how long a recovery waits for a request the dead trainer left running on the server (its
#: submit in the verifier: a verifier's own limit is rarely longer), and how often it looks
BUSY_WAIT_S = 1800.0
BUSY_POLL_S = 0.5
#: how many times a restart asks a server for its sessions (the orphan search)
LIST_ATTEMPTS = 3
#: clock slack when an orphan's session is matched by age (its server's clock, ours)
AGE_SLACK_S = 2.0


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

    async def intent(self, episode: Episode, server_url: str) -> str:
        """Before the reset is sent: the episode is about to open a session on `server_url`
        (an orphan if the worker dies before `opened`: module docstring). Returns its key."""
        key = episode_key(episode)
        data = {
            "intent": True,
            "server_url": server_url,
            "task_id": episode.task_id,
            "seed": episode.seed,
            "intent_at": time.time(),
            "episode": episode.to_dict(with_tokens=True),
        }
        await asyncio.to_thread(self._write, key, data)
        return key

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
    orphaned: int = 0  # a reset sent, no session written: masked as infrastructure
    orphan_sessions: list[str] = field(default_factory=list)  # their sessions found detached

    def to_json(self) -> dict[str, Any]:
        return {
            "resumed": self.resumed,
            "lost": self.lost,
            "ended": self.ended,
            "orphaned": self.orphaned,
            "orphan_sessions": self.orphan_sessions,
            "episodes": len(self.episodes),
        }


def sessions_url(server_url: str) -> str:
    """`GET /v1/sessions` of the server whose episode endpoint is `server_url` (ws:// or wss://)."""
    parts = urlsplit(server_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "/v1/sessions", "", ""))


async def _detached_sessions(server_url: str, token: str | None) -> list[dict[str, Any]] | str:
    """The server's detached sessions, or why they could not be listed."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    why = ""
    for attempt in range(LIST_ATTEMPTS):  # a busy server may miss one request
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                reply = await http.get(sessions_url(server_url), headers=headers)
                reply.raise_for_status()
                listed = reply.json().get("sessions", [])
            return [s for s in listed if isinstance(s, dict) and not s.get("attached", True)]
        except (httpx.HTTPError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            log.warning("inflight: listing %s failed (try %d): %s", server_url, attempt + 1, why)
            await asyncio.sleep(0.5 * (attempt + 1))
    return why


async def find_orphans(
    intents: list[dict[str, Any]], token: str | None, now: float | None = None
) -> list[tuple[str | None, str]]:
    """For each intent (in order): (the session id found for it or None, what was found). A
    session matches an intent when it is detached, of the same task and seed, and no older than
    the intent; each session is matched once, the youngest intent first served its oldest match."""
    now = time.time() if now is None else now
    listings: dict[str, list[dict[str, Any]] | str] = {}
    for url in sorted({str(d.get("server_url", "")) for d in intents}):
        listings[url] = await _detached_sessions(url, token)
    taken: set[str] = set()
    out: list[tuple[str | None, str]] = []
    for d in intents:
        listed = listings[str(d.get("server_url", ""))]
        if isinstance(listed, str):
            out.append((None, f"the server's sessions could not be listed ({listed})"))
            continue
        since = now - float(d.get("intent_at", 0.0))
        match = [
            s
            for s in listed
            if s.get("task_id") == d.get("task_id")
            and s.get("seed") == d.get("seed")
            and float(s.get("age_s", 0.0)) <= since + AGE_SLACK_S
            and s.get("session_id") not in taken
        ]
        if not match:
            out.append(
                (
                    None,
                    "no detached session of its task and seed on its server (the reset "
                    "never arrived, or the server already ended it)",
                )
            )
            continue
        sid = str(max(match, key=lambda s: float(s.get("age_s", 0.0)))["session_id"])
        taken.add(sid)
        out.append(
            (
                sid,
                f"its session {sid} found detached on its server, which ends it when "
                "its resume_grace_s runs out",
            )
        )
    return out


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
    intents = [(p, d) for p, d in loaded if not d.get("ended") and d.get("intent")]
    live = [(p, d) for p, d in loaded if not d.get("ended") and not d.get("intent")]
    found = await find_orphans([d for _, d in intents], token) if intents else []
    for (path, data), (sid, what) in zip(intents, found, strict=True):
        ep = Episode.from_dict(data["episode"])
        ep.metrics["recovered"] = 1.0
        ep.termination = "connection"
        ep.error = (
            "orphaned: its rollout worker died between the reset and writing its session; " + what
        )
        for t in ep.trajectories:
            t.reward = 0.0
        out.episodes.append(ep)
        out.orphaned += 1
        if sid is not None:
            out.orphan_sessions.append(sid)
        path.unlink(missing_ok=True)
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
        "unrecorded (recorded as they ended), %d orphaned (reset sent, session never written; "
        "masked; %d of their sessions found detached: %s)",
        len(result.episodes),
        result.resumed,
        result.lost,
        result.ended,
        result.orphaned,
        len(result.orphan_sessions),
        ", ".join(result.orphan_sessions) or "-",
    )
    return result
