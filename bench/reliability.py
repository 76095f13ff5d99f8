"""A hostile-frame generator and a fuzz driver for the websocket protocol (no hypothesis needed).

`hostile_frames(rng, n, task_id)` yields `(kind, payload, as_text)` frames: random bytes as
binary frames, random text, invalid UTF-8 in a *text* frame, huge and non-finite numbers, deep
nesting, wrong types in every field, byte-level mutations of valid messages, lone surrogates in
strings, oversized frames, and valid requests (reset/step/close/resume) mixed in so the stateful
paths run too.

`fuzz_connection(url, frames)` sends them one at a time over a sync websocket and classifies
what came back. The verdicts that count as handled: a JSON reply of a known type (an `error`
with a code of the contract, or a valid reply), or a close with 1007 (invalid UTF-8 in a text
frame) or 1009 (frame over the transport cap), which RFC 6455 prescribes for those two. Anything
else (no reply, a non-JSON reply, an unknown code, an `internal` error, another close code) is a
failure, with an example kept for the report. Shared by `tests/reliability` (CI-sized) and
`bench/reliability.py` (bigger runs).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from envserver.protocol import ERROR_CODES

REPLY_TYPES = frozenset({"observation", "step_result", "closed", "error"})
ACTION_KINDS = (
    "command", "keys", "write_file", "read_file", "submit", "click", "double_click", "move",
    "drag", "scroll", "type", "key", "screenshot", "bogus",
)  # fmt: skip
HUGE_NUMBERS = (
    "1e308", "-1e308", "1e999", "-0", "0.0000000000000000000001", "9" * 400, "-" + "9" * 400,
    "NaN", "Infinity", "-Infinity", "18446744073709551616", "4294967296", "1.5",
)  # fmt: skip


def _junk_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.5:
        return rng.choice(
            [None, True, False, 0, -1, 2**63, 1.5, "", "x" * rng.randint(0, 300),
             "\u0000\u202e\ufeff", "../../etc/passwd", "/dev/zero", "💥" * 10]
        )  # fmt: skip
    if r < 0.75:
        return [_junk_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{i}": _junk_value(rng, depth + 1) for i in range(rng.randint(0, 4))}


def valid_messages(rng: random.Random, task_id: str, rid: str) -> dict[str, Any]:
    """A well-formed request (the reply may still be an error, e.g. no_episode)."""
    kind = rng.choice(["reset", "step", "step", "step", "close", "resume"])
    if kind == "reset":
        return {"type": "reset", "request_id": rid, "task_id": task_id, "seed": rng.randint(0, 9)}
    if kind == "close":
        return {"type": "close", "request_id": rid}
    if kind == "resume":
        return {"type": "resume", "request_id": rid, "session_id": "ses-x", "resume_token": "t"}
    action = rng.choice(
        [
            {"kind": "command", "command": "echo hi"},
            {"kind": "write_file", "path": "/app/f.txt", "content": "data"},
            {"kind": "read_file", "path": "/app/f.txt"},
            {"kind": "keys", "keys": "ls\n"},
        ]
    )
    return {"type": "step", "request_id": rid, "action": action}


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        pos = rng.randint(0, max(0, len(b) - 1))
        if op < 0.33 and b:
            b[pos] = rng.randint(0, 255)
        elif op < 0.66:
            b.insert(pos, rng.choice(b'{}[]":,\\\x00\xff'))
        elif b:
            del b[pos]
    return bytes(b)


def hostile_frames(
    rng: random.Random, n: int, task_id: str, max_message_bytes: int = 4 * 1024 * 1024
) -> Iterator[tuple[str, bytes | str, bool]]:
    """`n` frames: (kind, payload, send_as_text). Oversized frames are rare (they cost MBs)."""
    kinds = [
        ("valid", 14), ("random_bytes", 10), ("random_text", 8), ("invalid_utf8_text", 2),
        ("huge_numbers", 10), ("deep_nesting", 6), ("wrong_types", 14), ("mutated", 14),
        ("lone_surrogate", 4), ("unknown_fields", 6), ("binary_valid", 6), ("big_field", 5),
        ("oversized", 1),
    ]  # fmt: skip
    names = [k for k, _ in kinds]
    weights = [w for _, w in kinds]
    for i in range(n):
        kind = rng.choices(names, weights)[0]
        rid = f"f{i}"
        if kind == "valid":
            yield kind, json.dumps(valid_messages(rng, task_id, rid)), True
        elif kind == "binary_valid":
            yield kind, json.dumps(valid_messages(rng, task_id, rid)).encode(), False
        elif kind == "random_bytes":
            yield kind, rng.randbytes(rng.randint(0, 2048)), False
        elif kind == "random_text":
            alphabet = '{}[]":,0123456789abcdefnulltrue \\\n\t\u00e9\u4e2d'
            yield kind, "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400))), True
        elif kind == "invalid_utf8_text":
            yield kind, b'{"type":"close","request_id":"' + b"\xff\xfe\xc0" + b'"}', True
        elif kind == "huge_numbers":
            num = rng.choice(HUGE_NUMBERS)
            field_ = rng.choice(["seed", "timeout_s", "mode", "max_bytes", "x", "count"])
            if field_ == "seed":
                text = f'{{"type":"reset","request_id":"{rid}","task_id":"{task_id}","seed":{num}}}'
            elif field_ == "timeout_s":
                text = (
                    f'{{"type":"step","request_id":"{rid}","action":'
                    f'{{"kind":"command","command":"echo hi","timeout_s":{num}}}}}'
                )
            elif field_ == "mode":
                text = (
                    f'{{"type":"step","request_id":"{rid}","action":{{"kind":"write_file",'
                    f'"path":"/app/n","content":"","mode":{num}}}}}'
                )
            elif field_ == "max_bytes":
                text = (
                    f'{{"type":"step","request_id":"{rid}","action":{{"kind":"read_file",'
                    f'"path":"/app/n","max_bytes":{num}}}}}'
                )
            else:
                text = (
                    f'{{"type":"step","request_id":"{rid}","action":{{"kind":"click",'
                    f'"x":{num},"y":{num}}}}}'
                )
            yield kind, text, True
        elif kind == "deep_nesting":
            depth = rng.choice([50, 500, 5000, 100_000])
            inner = (
                "[" * depth + "]" * depth
                if rng.random() < 0.5
                else '{"a":' * depth + "1" + "}" * depth
            )
            text = (
                f'{{"type":"reset","request_id":"{rid}","task_id":"{task_id}","options":{inner}}}'
            )
            yield kind, text, True
        elif kind == "wrong_types":
            msg: dict[str, Any] = valid_messages(rng, task_id, rid)
            key = rng.choice(list(msg))
            msg[key] = _junk_value(rng)
            if isinstance(msg.get("action"), dict) and msg["action"] and rng.random() < 0.5:
                akey = rng.choice(list(msg["action"]))
                msg["action"][akey] = _junk_value(rng)
            yield kind, json.dumps(msg), True
        elif kind == "mutated":
            raw = json.dumps(valid_messages(rng, task_id, rid)).encode()
            yield kind, _mutate(rng, raw), rng.random() < 0.5
        elif kind == "lone_surrogate":
            where = rng.choice(["request_id", "task_id", "command"])
            if where == "request_id":
                text = '{"type":"close","request_id":"a\\ud800b"}'
            elif where == "task_id":
                text = f'{{"type":"reset","request_id":"{rid}","task_id":"\\udfff"}}'
            else:
                text = (
                    f'{{"type":"step","request_id":"{rid}","action":'
                    f'{{"kind":"command","command":"echo \\ud83d"}}}}'
                )
            yield kind, text, True
        elif kind == "unknown_fields":
            msg = valid_messages(rng, task_id, rid)
            msg[rng.choice(["extra", "__proto__", "type2", ""])] = _junk_value(rng)
            yield kind, json.dumps(msg), True
        elif kind == "big_field":
            size = rng.choice([64 * 1024, 512 * 1024])
            msg = {
                "type": "step",
                "request_id": rid,
                "action": {"kind": "write_file", "path": "/app/big", "content": "A" * size},
            }
            yield kind, json.dumps(msg), True
        else:  # oversized: over the app's limit (answered) but under the transport cap
            yield kind, b" " * (max_message_bytes + 1024), False


@dataclass
class FuzzStats:
    """What a fuzz run saw: verdicts per frame kind, error codes, failures with examples."""

    sent: int = 0
    replies: Counter[str] = field(default_factory=Counter)  # reply type or close code
    codes: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)
    reconnects: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "replies": dict(self.replies),
            "error_codes": dict(self.codes),
            "by_kind": dict(self.by_kind),
            "failures": len(self.failures),
            "failure_examples": self.failures[:5],
            "reconnects": self.reconnects,
        }


def _classify(stats: FuzzStats, kind: str, payload: bytes | str, raw: Any, fail: Any) -> None:
    try:
        reply = json.loads(raw)
    except ValueError:
        fail(kind, payload, f"non-JSON reply {raw[:200]!r}")
        return
    rtype = reply.get("type") if isinstance(reply, dict) else None
    stats.replies[str(rtype)] += 1
    if rtype not in REPLY_TYPES:
        fail(kind, payload, f"unknown reply type {rtype!r}")
    elif rtype == "error":
        code = reply.get("code")
        stats.codes[str(code)] += 1
        if code not in ERROR_CODES or code == "internal":
            fail(kind, payload, f"error {code}: {str(reply.get('message'))[:300]}")


def fuzz_connection(
    url: str,
    frames: Iterator[tuple[str, bytes | str, bool]],
    stats: FuzzStats | None = None,
    reply_timeout_s: float = 30.0,
) -> FuzzStats:
    """Send every frame over one websocket (reconnecting after a protocol close)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    stats = stats or FuzzStats()

    def fail(kind: str, payload: bytes | str, why: str) -> None:
        shown = payload[:200] if isinstance(payload, str) else payload[:200].decode("latin-1")
        stats.failures.append({"kind": kind, "why": why, "frame_head": shown})

    it = iter(frames)
    exhausted = False
    while not exhausted:
        exhausted = True
        with connect(url, max_size=None, compression=None) as ws:
            for kind, payload, as_text in it:
                stats.sent += 1
                stats.by_kind[kind] += 1
                try:
                    if as_text and isinstance(payload, bytes):
                        ws.send(payload, text=True)
                    else:
                        ws.send(payload)
                    raw = ws.recv(timeout=reply_timeout_s)
                except TimeoutError:
                    fail(kind, payload, f"no reply within {reply_timeout_s:g}s")
                    exhausted = False
                    break
                except ConnectionClosed as exc:
                    code = exc.rcvd.code if exc.rcvd is not None else None
                    stats.replies[f"close_{code}"] += 1
                    if code not in (1007, 1009):
                        fail(kind, payload, f"connection closed with {code}")
                    exhausted = False
                    break
                _classify(stats, kind, payload, raw, fail)
        if not exhausted:
            stats.reconnects += 1
    return stats
