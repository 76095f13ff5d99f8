"""`sandgym bench reliability`: fault, fuzz and abuse figures, and the fuzzer the tests share.

Three parts, each reported in one JSON document (`--json`; `--out` writes it, committed as
`lab/bench/results/reliability.json`). Each section (fuzz; abuse per backend; each faults check)
carries its own `run` (start, duration, load, Docker engine); `--merge` re-measures some parts
and keeps the file's other sections as they were, marked `kept_from` (see `merge_previous`):

- `fuzz`: `--frames` hostile frames (default 50,000) against `sandgym serve --backend null` as a
  child process: verdicts per frame kind, error codes, failures (must be 0), frames/s, and the
  server's RSS after a warm-up, at checkpoints and at the end (flat = no leak).
- `abuse` (per backend in `--backends`, default local,docker): p99 step latency of neighbour
  sessions stepping `echo` while one session runs a fork bomb, a memory hog, a disk fill,
  endless output, a SIGTERM-ignoring loop, network probes (repeated for `--window-s`); against
  the p99 of a quiet window measured just before each. The ratio is reported as measured (the
  target is <= 2x); nothing is asserted.
- `faults` (Docker): SIGKILL of a server with 20 live episodes, then a restart: orphans left,
  and seconds from the restart until none remain; a container killed mid-episode: the
  victim's error code, the neighbours' steps, seconds until the pool refilled; with
  `--dockerd-restart` (disruptive: every container on the engine is affected) dockerd killed
  and restarted under load, and seconds until a new episode works on the same server.

The frame generator: `hostile_frames(rng, n, task_id)` yields `(kind, payload, as_text)`
frames: random bytes as binary frames, random text, invalid UTF-8 in a *text* frame, huge and
non-finite numbers, deep nesting, wrong types in every field, byte-level mutations of valid
messages, lone surrogates in strings, oversized frames, and valid requests (reset/step/close/
resume) mixed in so the stateful paths run too. `fuzz_connection(url, frames)` sends them one at
a time over a sync websocket and classifies what came back. Handled means: a JSON reply of a
known type (an `error` with a code of the contract, or a valid reply), or a close with 1007
(invalid UTF-8 in a text frame) or 1009 (frame over the transport cap), which RFC 6455
prescribes for those two. Anything else (no reply, a non-JSON reply, an unknown code, an
`internal` error, another close code) is a failure, with an example kept for the report.

Why over 500 lines: three benchmark parts and the hostile-frame generator the tests import share
one report format and one `--merge`; each part is a few functions, a candidate for its own
module when one grows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.bench.report import file_commit, percentile_or_none, save_json
from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.wire import protocol
from sandgym.wire.protocol import ERROR_CODES, REPLY_TYPES

#: every kind the protocol has, and one it has not
ACTION_KINDS = (*protocol.ACTION_KINDS, "bogus")
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


# -- the task the reliability runs use ------------------------------------------------------------
REL_TASK = "rel-task"
IMAGE = "sandgym/terminal:latest"


def write_rel_task(root: Path, name: str = REL_TASK) -> Path:
    """A Harbor task on the terminal image: reward 1 iff /app/hello.txt holds `hello`. Small
    limits so abuse hits them fast: 256 MiB memory, 1 CPU, 64 MiB storage (file size cap); no
    network."""
    t = root / name
    (t / "tests").mkdir(parents=True, exist_ok=True)
    (t / "solution").mkdir(exist_ok=True)
    (t / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 30\n[environment]\n'
        f'docker_image = "{IMAGE}"\ncpus = 1\nmemory_mb = 256\nstorage_mb = 64\n'
        'network_mode = "no-network"\n'  # Harbor's default is public; abuse runs offline
    )
    (t / "instruction.md").write_text("Write hello to /app/hello.txt\n")
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'if [ "$(cat /app/hello.txt 2>/dev/null)" = hello ]; then r=1; else r=0; fi\n'
        "echo $r > /logs/verifier/reward.txt\n"
    )
    (t / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    return root


def _pct(samples: list[float], q: float) -> float | None:
    return percentile_or_none(samples, q)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 2)


# -- fuzz ------------------------------------------------------------------------------------------
def bench_fuzz(task_root: Path, frames: int, seed: int) -> dict[str, Any]:
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import ServerProcess

    env = {"SANDGYM_INCLUDE_BUILTIN": "false", "SANDGYM_RESUME_GRACE_S": "1"}
    with ServerProcess("null", args=["--tasks", str(task_root)], env=env) as srv:
        rng = random.Random(seed)
        rss_start = srv.rss_bytes()
        fuzz_connection(srv.url, hostile_frames(rng, 2000, REL_TASK))  # warm-up
        rss_warm = srv.rss_bytes()
        stats = FuzzStats()
        checkpoints = []
        t0 = time.perf_counter()
        chunk = 5000
        for done in range(0, frames, chunk):
            fuzz_connection(
                srv.url, hostile_frames(rng, min(chunk, frames - done), REL_TASK), stats
            )
            checkpoints.append({"frames": stats.sent, "rss_mb": round(srv.rss_bytes() / 2**20, 1)})
        wall = time.perf_counter() - t0
        alive = srv.proc.poll() is None
        rss_end = srv.rss_bytes()
    return {
        **stats.to_json(),
        "frames_per_s": round(stats.sent / wall, 1),
        "server_alive": alive,
        "rss_mb": {
            "start": round(rss_start / 2**20, 1),
            "after_warmup": round(rss_warm / 2**20, 1),
            "end": round(rss_end / 2**20, 1),
            "growth_after_warmup": round((rss_end - rss_warm) / 2**20, 1),
            "checkpoints": checkpoints,
        },
    }


# -- abuse -----------------------------------------------------------------------------------------
ABUSES: dict[str, dict[str, Any]] = {
    "fork_bomb": {"command": "b(){ b|b& }; b; sleep 3", "timeout_s": 8},
    "memory_hog": {"command": "head -c 2000m /dev/zero | tail >/dev/null", "timeout_s": 60},
    "disk_fill": {
        "command": "dd if=/dev/zero of=/app/fill bs=1M count=512 status=none; rm -f /app/fill",
        "timeout_s": 120,
    },
    "endless_output": {"command": "yes sandgym-flood", "timeout_s": 5},
    "sigterm_ignorer": {"command": "trap '' TERM; while :; do sleep 0.2; done", "timeout_s": 3},
    "network_probes": {
        "command": 'for h in 127.0.0.1 172.17.0.1; do timeout 2 bash -c "echo > /dev/tcp/$h/22" '
        "2>/dev/null && echo OPEN-$h; done; ls /var/run/docker.sock 2>&1; true",
        "timeout_s": 20,
    },
}


async def _neighbours(url: str, n: int, stop: asyncio.Event) -> tuple[list[float], int]:
    """`n` episodes stepping `echo hi` until `stop`; returns (latencies, errors)."""

    lat: list[float] = []
    errors = 0

    async def one() -> None:
        nonlocal errors
        async with AsyncEnvClient(url, request_timeout_s=120) as c:
            await c.reset(REL_TASK)
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    res = await c.step("echo hi")
                    ok = res.observation["output"] == "hi\n"
                except EnvError:
                    ok = False
                lat.append(time.perf_counter() - t0)
                errors += 0 if ok else 1
                await asyncio.sleep(0.02)

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    await stop.wait()
    await asyncio.gather(*tasks)
    return lat, errors


async def _window(url: str, neighbours: int, seconds: float) -> tuple[list[float], int]:
    stop = asyncio.Event()
    run = asyncio.create_task(_neighbours(url, neighbours, stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await run


async def _abuse_backend(
    url: str, window_s: float, neighbours: int, rounds: int = 1
) -> dict[str, Any]:
    """Per abuse: a quiet window, then an abuse window of at least `window_s` (the abuse is
    repeated in it, in a fresh episode whenever the last one's sandbox is unusable). Quiet and
    abuse windows alternate so that the machine's other load, which drifts, hits both alike.
    With `rounds` > 1 the whole sequence runs again and each abuse's quiet and abuse samples
    are pooled over its rounds (one window pair's p99 swings by 2x on this shared machine)."""

    out: dict[str, Any] = {
        "neighbours": neighbours,
        "window_s": window_s,
        "rounds": rounds,
        "abuses": {},
    }
    all_quiet: list[float] = []
    acc: dict[str, dict[str, Any]] = {
        name: {
            "quiet": [],
            "quiet_err": 0,
            "lat": [],
            "err": 0,
            "outcomes": [],
            "after": [],
            "abuse_s": 0.0,
            "ratios": [],
        }  # fmt: skip
        for name in ABUSES
    }
    # Warm-up (discarded): the first episodes pay the image check, the pool's first creations.
    await _window(url, neighbours, 3.0)
    for _round in range(rounds):
        for name, action in ABUSES.items():
            a = acc[name]
            quiet, quiet_err = await _window(url, neighbours, window_s)
            all_quiet += quiet
            stop = asyncio.Event()
            run = asyncio.create_task(_neighbours(url, neighbours, stop))
            await asyncio.sleep(0.3)  # neighbours stepping before the abuse starts
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < window_s:
                async with AsyncEnvClient(url, request_timeout_s=300) as abuser:
                    await abuser.reset(REL_TASK)
                    usable = True
                    while usable and time.perf_counter() - t0 < window_s:
                        try:
                            res = await abuser.step({"kind": "command", **action})
                            a["outcomes"].append(f"exit {res.observation.get('exit_code')}")
                        except EnvError as exc:
                            a["outcomes"].append(exc.code)
                        try:
                            res = await abuser.step({"kind": "command", "command": "echo alive",
                                                     "timeout_s": 20})  # fmt: skip
                            usable = res.observation["output"] == "alive\n"
                            a["after"].append("ok" if usable else "wrong output")
                        except EnvError as exc:
                            usable = False
                            a["after"].append(exc.code)
            a["abuse_s"] += time.perf_counter() - t0
            stop.set()
            lat, err = await run
            p99_abuse, p99_quiet = _pct(lat, 99), _pct(quiet, 99)
            if p99_abuse and p99_quiet:
                a["ratios"].append(round(p99_abuse / p99_quiet, 2))
            a["quiet"] += quiet
            a["quiet_err"] += quiet_err
            a["lat"] += lat
            a["err"] += err
    for name, a in acc.items():
        p99, quiet_p99 = _pct(a["lat"], 99), _pct(a["quiet"], 99)
        ratio = None if not (p99 and quiet_p99) else round(p99 / quiet_p99, 2)
        out["abuses"][name] = {
            "runs": len(a["outcomes"]),
            "outcomes": dict(Counter(a["outcomes"])),
            "abuser_sandbox_after": dict(Counter(a["after"])),
            "abuse_window_s": round(a["abuse_s"], 2),
            "quiet": {
                "n": len(a["quiet"]),
                "p50_ms": _ms(_pct(a["quiet"], 50)),
                "p99_ms": _ms(quiet_p99),
                "errors": a["quiet_err"],
            },  # fmt: skip
            "during": {
                "n": len(a["lat"]),
                "p50_ms": _ms(_pct(a["lat"], 50)),
                "p99_ms": _ms(p99),
                "errors": a["err"],
            },  # fmt: skip
            "p99_ratio_to_quiet": ratio,
            "p99_ratio_per_round": a["ratios"],
            "within_2x": None if ratio is None else ratio <= 2.0,
        }
    out["quiet_all"] = {"n": len(all_quiet), "p50_ms": _ms(_pct(all_quiet, 50)),
                        "p99_ms": _ms(_pct(all_quiet, 99))}  # fmt: skip
    return out


def bench_abuse(
    task_root: Path, backend: str, window_s: float, neighbours: int, rounds: int = 1
) -> dict[str, Any]:
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import ServerProcess

    # Neighbours and the repeated abuse take thousands of steps: no max_steps truncation.
    env = {
        "SANDGYM_INCLUDE_BUILTIN": "false",
        "SANDGYM_MAX_OUTPUT_BYTES": "65536",
        "SANDGYM_MAX_STEPS": "1000000",
    }
    with ServerProcess(
        backend, args=["--tasks", str(task_root)], env=env, startup_timeout_s=120
    ) as srv:
        result = asyncio.run(_abuse_backend(srv.url, window_s, neighbours, rounds))
        result["server_alive"] = srv.proc.poll() is None
    return result


# -- faults (Docker) -------------------------------------------------------------------------------
def _containers_of_pid(pid: int) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", "label=sandgym.managed=1",
         "--filter", f"label=sandgym.owner_pid={pid}"],  # fmt: skip
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return out.split()


def _docker_server(task_root: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import ServerProcess

    return ServerProcess(
        "docker",
        args=["--tasks", str(task_root), *args],
        env={"SANDGYM_INCLUDE_BUILTIN": "false", **(env or {})},
        startup_timeout_s=120,
    )


async def _open(url: str, n: int) -> list[tuple[Any, dict[str, Any]]]:
    async def one() -> tuple[Any, dict[str, Any]]:
        c = AsyncEnvClient(url, request_timeout_s=120)
        _, info = await c.reset(REL_TASK)
        return c, info

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def _sigkill_restart(task_root: Path, sessions: int) -> dict[str, Any]:
    srv = await asyncio.to_thread(_docker_server, task_root, "--max-sessions", str(sessions + 8))
    t0 = time.perf_counter()
    clients = await _open(srv.url, sessions)
    open_s = time.perf_counter() - t0
    pid = srv.pid
    live = len(await asyncio.to_thread(_containers_of_pid, pid))
    srv.proc.kill()
    await asyncio.to_thread(srv.proc.wait, 30)
    for c, _ in clients:
        with contextlib.suppress(Exception):
            await c.drop_connection()
    orphans = len(await asyncio.to_thread(_containers_of_pid, pid))
    t_restart = time.perf_counter()
    again = await asyncio.to_thread(_docker_server, task_root)
    healthy_s = time.perf_counter() - t_restart
    try:
        while await asyncio.to_thread(_containers_of_pid, pid):
            if time.perf_counter() - t_restart > 120:
                break
            await asyncio.sleep(0.1)
        zero_s = time.perf_counter() - t_restart
        left = len(await asyncio.to_thread(_containers_of_pid, pid))
    finally:
        await asyncio.to_thread(again.stop)
    return {
        "sessions": sessions,
        "open_sessions_s": round(open_s, 2),
        "containers_live_before_kill": live,
        "orphans_after_sigkill": orphans,
        "restart_to_healthy_s": round(healthy_s, 2),
        "restart_to_zero_orphans_s": round(zero_s, 2),
        "orphans_left": left,
        "within_10s": left == 0 and zero_s <= 10.0,
    }


async def _container_kill(task_root: Path) -> dict[str, Any]:
    import httpx

    srv = await asyncio.to_thread(_docker_server, task_root, "--pool-size", "2")
    try:
        sessions = await _open(srv.url, 4)
        (victim, vinfo), others = sessions[0], [c for c, _ in sessions[1:]]
        running = asyncio.create_task(victim.step({"kind": "command", "command": "sleep 60"}))
        await asyncio.sleep(1.0)
        t_kill = time.perf_counter()
        await asyncio.to_thread(
            subprocess.run, ["docker", "kill", vinfo["sandbox_id"]], check=True, timeout=60
        )
        try:
            await asyncio.wait_for(running, 60)
            code = "no error"
        except EnvError as exc:
            code = exc.code
        error_after_s = time.perf_counter() - t_kill
        ok = 0
        for c in others:
            with contextlib.suppress(EnvError):
                ok += (await c.step("echo ok")).observation["output"] == "ok\n"
        refill_s = None
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            while time.perf_counter() - t_kill < 120:
                if (await http.get("/v1/pool")).json()["totals"]["ready"] >= 2:
                    refill_s = round(time.perf_counter() - t_kill, 2)
                    break
                await asyncio.sleep(0.2)
        for c, _ in sessions:
            with contextlib.suppress(Exception):
                await c.close()
    finally:
        await asyncio.to_thread(srv.stop)
    return {
        "victim_error": code,
        "kill_to_error_s": round(error_after_s, 2),
        "others_ok": f"{ok}/{len(others)}",
        "pool_ready_2_after_kill_s": refill_s,
    }


def _kill_and_restart_dockerd(log_path: Path) -> float:
    """SIGKILL dockerd, start it again by hand; seconds from the kill until `docker info` works."""

    def info_ok() -> bool:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0

    pids = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout
    for p in pids.split():
        os.kill(int(p), signal.SIGKILL)
    t_kill = time.perf_counter()
    while subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode == 0:
        time.sleep(0.1)
    time.sleep(1.0)
    subprocess.run(
        f"nohup dockerd --storage-driver=overlay2 >{log_path} 2>&1 &",
        shell=True, check=True, start_new_session=True,
    )  # fmt: skip
    while not info_ok():
        if time.perf_counter() - t_kill > 120:
            raise RuntimeError(f"dockerd did not come back within 120 s; see {log_path}")
        time.sleep(0.5)
    return time.perf_counter() - t_kill


async def _dockerd_restart(task_root: Path, log_path: Path) -> dict[str, Any]:
    srv = await asyncio.to_thread(_docker_server, task_root)
    try:
        engine_back_s = await asyncio.to_thread(_kill_and_restart_dockerd, log_path)
        t_back = time.perf_counter()
        codes: list[str] = []
        recovered_s = None
        while time.perf_counter() - t_back < 180:
            try:
                async with AsyncEnvClient(srv.url, request_timeout_s=120) as c:
                    await c.reset(REL_TASK)
                    await c.step("echo hello > /app/hello.txt")
                    if (await c.step({"kind": "submit"})).reward == 1.0:
                        recovered_s = round(time.perf_counter() - t_back, 2)
                        break
            except EnvError as exc:
                codes.append(exc.code)
                await asyncio.sleep(1.0)
        alive = srv.proc.poll() is None
    finally:
        await asyncio.to_thread(srv.stop)
    return {
        "engine_back_after_s": round(engine_back_s, 2),
        "engine_back_to_episode_ok_s": recovered_s,
        "server_process_survived": alive,
        "error_codes_meanwhile": sorted(set(codes)),
        "note": "the pool marks the image key failing while the engine is away and fails fast "
        "for its cooldown (failing_cooldown_s, 30 s by default) before creating again",
    }


def bench_faults(task_root: Path, dockerd_restart: bool, log_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sigkill_restart": asyncio.run(_sigkill_restart(task_root, 20)),
        "container_killed_mid_episode": asyncio.run(_container_kill(task_root)),
    }
    if dockerd_restart:
        out["dockerd_restart"] = asyncio.run(_dockerd_restart(task_root, log_dir / "dockerd.log"))
    return out


# -- entry -----------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--parts", default="fuzz,abuse,faults", help="comma-separated: fuzz, abuse, faults"
    )
    parser.add_argument("--frames", type=int, default=50_000, help="hostile frames to send")
    parser.add_argument("--seed", type=int, default=0, help="seed of the frame generator")
    parser.add_argument(
        "--backends", default="local,docker", help="backends of the abuse part (comma-separated)"
    )
    parser.add_argument(
        "--window-s", type=float, default=8.0, help="length of each quiet and each abuse window"
    )
    parser.add_argument("--neighbours", type=int, default=3, help="neighbour sessions stepping")
    parser.add_argument(
        "--abuse-rounds",
        type=int,
        default=3,
        help="rounds of all abuses; each abuse's quiet and abuse samples are pooled over them",
    )
    parser.add_argument(
        "--dockerd-restart",
        action="store_true",
        help="also kill and restart dockerd under load (disrupts every container on the engine)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the sections of the existing --out file that this run does not measure "
        "(each with the provenance of the run that wrote it)",
    )


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _docker_engine() -> dict[str, Any] | None:
    """The engine the Docker parts ran on: version, storage driver, quota label (setup.sh)."""
    # lazy: the docker backend package (29 modules): +0.05 s CPU at every `sandgym` start (measured)
    from sandgym.sandboxes.docker.engine_info import local_engine_info

    try:
        info = local_engine_info()
    except Exception:  # no engine or no SDK: the section names none
        return None
    labels = [x for x in info.labels if x.startswith("sandgym.")]
    return {"server_version": info.server_version, "storage_driver": info.driver,
            "labels": labels}  # fmt: skip


def _measured(
    section: dict[str, Any], started: float, load_at_start: list[float], docker: bool
) -> dict[str, Any]:
    """Stamp one section with `run`: when its part began and how long the part took, the load,
    and the Docker engine it ran on (written here, never by hand)."""
    section["run"] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "loadavg_at_start": load_at_start,
        "loadavg_at_end": _loadavg(),
        "docker_engine": _docker_engine() if docker else None,
    }
    return section


def merge_previous(
    doc: dict[str, Any], previous: dict[str, Any], previous_commit: str | None
) -> None:
    """`--merge`: the sections this run did not measure are taken over from the previous
    document (fuzz; abuse per backend; each faults check), each with its own `run`, and the
    `provenance` of the run that wrote it (`kept_from`: the previous document's provenance, or
    the last commit of the file when it has none). Nothing else of the old file is kept."""
    kept_from = previous.get("provenance") or {"file_commit": previous_commit}

    def keep(section: dict[str, Any]) -> dict[str, Any]:
        return {**section, "kept_from": section.get("kept_from", kept_from)}

    if "fuzz" not in doc and isinstance(previous.get("fuzz"), dict):
        doc["fuzz"] = keep(previous["fuzz"])
    for part in ("abuse", "faults"):
        old = previous.get(part)
        if not isinstance(old, dict):
            continue
        new = doc.setdefault(part, {})
        for name, section in old.items():
            if name not in new and isinstance(section, dict):
                new[name] = keep(section)


def run(args: argparse.Namespace) -> int:
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    previous: dict[str, Any] | None = None
    if args.merge:
        if args.out is None or not args.out.is_file():
            raise SystemExit(
                f"--merge: expected an existing --out file to merge into; found {args.out}"
            )
        previous = json.loads(args.out.read_text())
    doc: dict[str, Any] = {
        "bench": "reliability",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="sandgym-bench-rel-") as tmp:
        task_root = write_rel_task(Path(tmp))
        if "fuzz" in parts:
            print(f"bench reliability: fuzz ({args.frames} frames)", file=sys.stderr)
            t0, m0 = time.time(), _loadavg()
            doc["fuzz"] = _measured(bench_fuzz(task_root, args.frames, args.seed), t0, m0, False)
        if "abuse" in parts:
            doc["abuse"] = {}
            for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
                print(f"bench reliability: abuse on {backend}", file=sys.stderr)
                t0, m0 = time.time(), _loadavg()
                try:
                    doc["abuse"][backend] = _measured(
                        bench_abuse(
                            task_root, backend, args.window_s, args.neighbours, args.abuse_rounds
                        ),
                        t0, m0, backend == "docker",
                    )  # fmt: skip
                except Exception as exc:  # a backend that cannot run here is reported
                    skipped[f"abuse/{backend}"] = f"{type(exc).__name__}: {exc}"
        if "faults" in parts:
            print("bench reliability: faults (docker)", file=sys.stderr)
            t0, m0 = time.time(), _loadavg()
            try:
                faults = bench_faults(task_root, args.dockerd_restart, Path(tmp))
                doc["faults"] = {k: _measured(v, t0, m0, True) for k, v in faults.items()}
            except Exception as exc:
                skipped["faults"] = f"{type(exc).__name__}: {exc}"
    if previous is not None:
        merge_previous(doc, previous, file_commit(args.out))
    doc["skipped"] = skipped
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    else:
        print(text)  # the figures are nested; JSON is the readable form
    fuzz_ok = "fuzz" not in parts or doc["fuzz"]["failures"] == 0
    return 0 if fuzz_ok and not skipped else 1
