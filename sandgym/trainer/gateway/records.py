"""What the gateway records: one `CallRecord` per chat completion, the `CallStore` that keeps a
session's calls (SQLite under the run directory, plus a bounded in-memory LRU), and
`calls_to_steps`, which turns a session's calls into training `Step`s and refuses calls whose
token ids do not line up (the token rule is in `sandgym.trainer.gateway.chat`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandgym.trainer.episode import Step
from sandgym.trainer.gateway.errors import MissingTokensError, TokenAlignmentError


@dataclass
class CallRecord:
    """One chat completion served to a session."""

    session_id: str
    index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    weight_version: int
    latency_s: float
    #: the messages keep the history of the previous call (see the module's token rule)
    extends_previous: bool
    completion_text: str
    finish_reason: str
    replica: int
    created_at: float = field(default_factory=time.time)


def calls_to_steps(calls: list[CallRecord]) -> list[Step]:
    """A session's calls as `Step`s, in order, checked against the token rule.

    Raises `MissingTokensError` when a call has no prompt or completion ids or its logprobs do not
    match its completion, and `TokenAlignmentError` when a call marked `extends_previous` does not
    start with the previous call's prompt + completion ids (an end-of-turn token the model did
    not generate may follow the completion: it is part of the template text between turns).
    """
    steps: list[Step] = []
    prev: CallRecord | None = None
    for c in sorted(calls, key=lambda r: r.index):
        if not c.prompt_ids or not c.completion_ids:
            raise MissingTokensError(
                f"call {c.index} of session {c.session_id} has {len(c.prompt_ids)} prompt ids and "
                f"{len(c.completion_ids)} completion ids; both must be recorded"
            )
        if len(c.logprobs) != len(c.completion_ids):
            raise MissingTokensError(
                f"call {c.index} of session {c.session_id}: {len(c.logprobs)} logprobs for "
                f"{len(c.completion_ids)} completion ids"
            )
        if c.extends_previous:
            if prev is None:
                raise TokenAlignmentError(
                    f"call {c.index} of session {c.session_id} extends a previous call, but it "
                    "is the first call recorded"
                )
            head = prev.prompt_ids + prev.completion_ids
            if c.prompt_ids[: len(head)] != head:
                at = next(
                    (i for i, (x, y) in enumerate(zip(c.prompt_ids, head, strict=False)) if x != y),
                    min(len(c.prompt_ids), len(head)),
                )
                raise TokenAlignmentError(
                    f"call {c.index} of session {c.session_id} keeps the history but its prompt "
                    f"does not extend call {prev.index}'s prompt + completion ({len(head)} ids): "
                    f"first difference at token {at} of {len(c.prompt_ids)}"
                )
        steps.append(
            Step(
                prompt_ids=list(c.prompt_ids),
                response_ids=list(c.completion_ids),
                response_logprobs=list(c.logprobs),
                loss_mask=[1] * len(c.completion_ids),
                response_text=c.completion_text,
                policy_version=c.weight_version,
                generate_s=c.latency_s,
            )
        )
        prev = c
    return steps


class CallStore:
    """Calls per session: SQLite at `path` (durable) plus a bounded in-memory LRU.

    A consumed session is closed: a call that finishes after its episode was consumed (a
    generation still in flight when the episode was cancelled) is dropped, not stored."""

    #: how many consumed session ids are remembered to drop their late calls
    MAX_CLOSED = 100_000

    def __init__(self, path: Path | str, max_sessions_in_memory: int = 256) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_sessions = max_sessions_in_memory
        self._mem: OrderedDict[str, list[CallRecord]] = OrderedDict()
        self._closed: OrderedDict[str, None] = OrderedDict()
        self.late_calls_dropped = 0
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS calls (session_id TEXT, idx INTEGER, record TEXT, "
            "PRIMARY KEY (session_id, idx))"
        )
        self._db.commit()

    def add(self, rec: CallRecord) -> None:
        with self._lock:
            if rec.session_id in self._closed:
                self.late_calls_dropped += 1
                return
            self._db.execute(
                "INSERT OR REPLACE INTO calls VALUES (?, ?, ?)",
                (rec.session_id, rec.index, json.dumps(asdict(rec))),
            )
            self._db.commit()
            self._mem.setdefault(rec.session_id, []).append(rec)
            self._mem.move_to_end(rec.session_id)
            while len(self._mem) > self.max_sessions:
                self._mem.popitem(last=False)  # still in SQLite

    def in_memory(self) -> int:
        return len(self._mem)

    def calls(self, session_id: str) -> list[CallRecord]:
        with self._lock:
            if session_id in self._mem:
                return list(self._mem[session_id])
            rows = self._db.execute(
                "SELECT record FROM calls WHERE session_id = ? ORDER BY idx", (session_id,)
            ).fetchall()
        return [CallRecord(**json.loads(r[0])) for r in rows]

    def consume(self, session_id: str) -> list[CallRecord]:
        """The session's calls, removed from memory and SQLite (its episode is consumed)."""
        calls = self.calls(session_id)
        with self._lock:
            self._mem.pop(session_id, None)
            self._db.execute("DELETE FROM calls WHERE session_id = ?", (session_id,))
            self._db.commit()
            self._closed[session_id] = None
            while len(self._closed) > self.MAX_CLOSED:
                self._closed.popitem(last=False)
        return calls

    def close(self) -> None:
        with self._lock:
            self._db.close()


def drop_abandoned_calls(store_dir: Path) -> int:
    """A finished run's stores (`*.sqlite` under `store_dir`): the calls still kept belong to
    episodes that were in flight when the run ended, which nothing will consume; they are
    deleted (with the rollout workers stopped). Returns how many were."""
    import logging
    import sqlite3

    dropped = 0
    for path in sorted(store_dir.glob("*.sqlite")) if store_dir.is_dir() else []:
        try:
            with sqlite3.connect(path) as db:
                dropped += db.execute("DELETE FROM calls").rowcount
        except sqlite3.Error as exc:  # a store without the table, or unreadable: left as is
            logging.getLogger(__name__).warning("gateway store %s not cleared: %s", path, exc)
    return dropped
