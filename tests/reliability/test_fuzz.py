"""Malformed and hostile input against a real server (`sandgym serve --backend null` as a child
process): hypothesis-generated protocol messages, a raw frame fuzzer (random bytes, huge
numbers, deep nesting, wrong types, binary frames, invalid UTF-8, lone surrogates, oversized
frames), and schemathesis over the HTTP API's OpenAPI schema.

Each frame must be answered with a valid reply or an error of the contract (never `internal`),
or, for invalid UTF-8 in a text frame and frames over the transport cap, with the close code
RFC 6455 prescribes. The server process must survive, and its RSS must stay flat across 10,000
frames after a warm-up. Bigger runs: `sandgym bench reliability`.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from lab.bench.reliability import (
    ACTION_KINDS,
    REPLY_TYPES,
    FuzzStats,
    fuzz_connection,
    hostile_frames,
)
from sandgym.server.runner import ServerProcess
from sandgym.wire.protocol import ERROR_CODES
from tests.reliability.conftest import REL_TASK

#: Frames of the raw fuzzer measured for memory, after WARMUP frames (allocator arenas, caches
#: and the first sessions settle during the warm-up).
RAW_FRAMES = 10_000
WARMUP_FRAMES = 2_000
#: RSS growth over RAW_FRAMES that still counts as flat (measured here: a few MiB either way).
RSS_SLACK_MB = 24
HYPOTHESIS_MESSAGES = 1_000


@pytest.fixture(scope="module")
def fuzz_server(rel_tasks: Path) -> Iterator[ServerProcess]:
    # A short resume grace: each protocol close leaves its episode detached, and a 60 s grace
    # would keep hundreds of them alive during the run (bounded, but not "flat").
    env = {"SANDGYM_INCLUDE_BUILTIN": "false", "SANDGYM_RESUME_GRACE_S": "1"}
    with ServerProcess("null", args=["--tasks", str(rel_tasks)], env=env) as srv:
        yield srv
        assert srv.proc.poll() is None, "the server process died during the fuzzing"


# -- hypothesis over the protocol -------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
actions = st.fixed_dictionaries(
    {"kind": st.sampled_from(ACTION_KINDS) | st.text(max_size=8)},
    optional={
        "command": st.sampled_from(["echo hi", "true", "exit 3"])
        | st.text(max_size=40)
        | json_values,
        "keys": st.text(max_size=10),
        "path": st.sampled_from(["/app/x", "../../etc/passwd", "/", "", "/proc/self/mem"])
        | st.text(max_size=30),
        "content": st.text(max_size=100) | json_values,
        "timeout_s": st.floats() | st.integers() | json_values,
        "mode": st.integers(),
        "max_bytes": st.integers(),
        "x": st.integers(),
        "y": st.integers(),
        "button": st.text(max_size=6),
        "extra": json_values,
    },
)
client_messages = st.fixed_dictionaries(
    {"type": st.sampled_from(["reset", "step", "close", "resume"]) | st.text(max_size=8)},
    optional={
        "request_id": st.text(max_size=30) | json_values,
        "task_id": st.sampled_from([REL_TASK, "builtin/nope", "../etc"]) | st.text(max_size=20),
        "seed": st.integers() | json_values,
        "options": json_values,
        "action": actions | json_values,
        "session_id": st.text(max_size=20),
        "resume_token": st.text(max_size=20),
        "unknown": json_values,
    },
)

#: Well-formed requests (a third of the examples), so real episodes run between the hostile ones
#: and the stateful paths (reset over an episode, step, cached resend, close) get exercised.
request_ids = st.text(min_size=1, max_size=12)
valid_messages = st.one_of(
    st.builds(
        lambda rid, seed: {"type": "reset", "request_id": rid, "task_id": REL_TASK, "seed": seed},
        request_ids,
        st.none() | st.integers(0, 2**31),
    ),
    st.builds(
        lambda rid, cmd: {"type": "step", "request_id": rid, "action": {"kind": "command", "command": cmd}},
        request_ids,
        st.sampled_from(["echo hi", "true", "exit 3", "sleep 0"]) | st.text(max_size=30),
    ),
    st.builds(
        lambda rid, path, text: {
            "type": "step", "request_id": rid,
            "action": {"kind": "write_file", "path": path, "content": text},
        },
        request_ids,
        st.sampled_from(["/app/a.txt", "rel.txt", "/tmp/x/y"]),
        st.text(max_size=50),
    ),
    st.builds(lambda rid: {"type": "close", "request_id": rid}, request_ids),
)  # fmt: skip


class _Wire:
    """One websocket kept across hypothesis examples (reopened after a protocol close)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws: ClientConnection | None = None
        self.stack = contextlib.ExitStack()

    def call(self, frame: str | bytes) -> dict[str, Any]:
        if self.ws is None:
            self.ws = self.stack.enter_context(connect(self.url, max_size=None, compression=None))
        try:
            self.ws.send(frame)
            reply: dict[str, Any] = json.loads(self.ws.recv(timeout=30))
            return reply
        except ConnectionClosed:
            self.ws = None
            raise

    def close(self) -> None:
        self.stack.close()


def check_reply(reply: dict[str, Any], sent: dict[str, Any]) -> None:
    assert reply.get("type") in REPLY_TYPES, reply
    if reply["type"] == "error":
        assert reply["code"] in ERROR_CODES, reply
        action = sent.get("action")
        # The null backend's fake shell has no `rm`/`bash`, so a well-formed `submit` cannot run
        # its verifier there (tests/e2e/conftest.py); everything else must never be `internal`.
        if not (isinstance(action, dict) and action.get("kind") == "submit"):
            assert reply["code"] != "internal", reply
        assert isinstance(reply["message"], str) and isinstance(reply["retryable"], bool)
    rid = sent.get("request_id")
    if isinstance(rid, str) and reply["type"] != "error":
        assert reply["request_id"] == rid, (reply, sent)


def test_hypothesis_protocol_messages(fuzz_server: ServerProcess) -> None:
    wire = _Wire(fuzz_server.url)
    seen: dict[str, int] = {}

    @settings(
        max_examples=HYPOTHESIS_MESSAGES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(msg=st.one_of(valid_messages, client_messages, client_messages), binary=st.booleans())
    def one(msg: dict[str, Any], binary: bool) -> None:
        text = json.dumps(msg)  # NaN/Infinity tokens and \udXXX escapes included on purpose
        reply = wire.call(text.encode() if binary else text)
        check_reply(reply, msg)
        key = reply["type"] if reply["type"] != "error" else reply["code"]
        seen[key] = seen.get(key, 0) + 1

    try:
        one()
    finally:
        wire.close()
    # The generator reached past validation: real episodes ran, not only invalid_message.
    assert seen.get("invalid_message", 0) > 0 and sum(seen.values()) >= HYPOTHESIS_MESSAGES
    assert seen.get("observation", 0) > 0 and seen.get("step_result", 0) > 0, seen
    assert httpx.get(f"{fuzz_server.http_url}/healthz").status_code == 200


# -- the raw frame fuzzer ---------------------------------------------------------------------
def test_raw_frame_fuzzer_server_survives_and_rss_flat(fuzz_server: ServerProcess) -> None:
    rng = random.Random(20261129)
    warm = fuzz_connection(fuzz_server.url, hostile_frames(rng, WARMUP_FRAMES, REL_TASK))
    assert not warm.failures, warm.failures[:3]
    rss_before = fuzz_server.rss_bytes()
    stats = FuzzStats()
    for _ in range(RAW_FRAMES // 2000):
        fuzz_connection(fuzz_server.url, hostile_frames(rng, 2000, REL_TASK), stats)
    rss_after = fuzz_server.rss_bytes()
    assert stats.sent == RAW_FRAMES
    assert not stats.failures, stats.failures[:5]
    # Every kind of hostile frame was exercised, and each family got its expected answer.
    assert len(stats.by_kind) >= 12, stats.by_kind
    assert stats.codes["invalid_message"] > RAW_FRAMES // 3, stats.to_json()
    assert stats.replies["close_1007"] > 0  # invalid UTF-8 in text frames
    assert stats.replies["step_result"] > 0 and stats.replies["observation"] > 0
    growth_mb = (rss_after - rss_before) / 2**20
    assert growth_mb < RSS_SLACK_MB, (
        f"server RSS grew by {growth_mb:.1f} MiB over {RAW_FRAMES} frames "
        f"({rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB)"
    )
    assert httpx.get(f"{fuzz_server.http_url}/healthz").status_code == 200


def test_lone_surrogate_in_request_id_is_answered(fuzz_server: ServerProcess) -> None:
    """Regression: a `\\ud800` escape in request_id made the echoing error reply unencodable
    (UnicodeEncodeError in the serializer), which killed the connection's receive loop."""
    with connect(fuzz_server.url) as ws:
        for frame in (
            '{"type":"close","request_id":"a\\ud800b"}',  # valid: `closed` echoes the id
            '{"type":"bogus","request_id":"\\udfff"}',  # invalid: the error echoes it
        ):
            ws.send(frame)
            reply = json.loads(ws.recv(timeout=10))
            assert reply["request_id"] in ("a\ud800b", "\udfff"), reply
        ws.send('{"type":"close","request_id":"after"}')
        assert json.loads(ws.recv(timeout=10))["request_id"] == "after"
