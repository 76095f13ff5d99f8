"""The websocket protocol end to end, through a real uvicorn server on the null backend.

Every malformed or refused request gets its error code and the connection keeps working;
resume keeps the episode's shell state; limits truncate; auth refuses; capacity refuses.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.wire.protocol import SessionsReply
from tests.e2e.conftest import NULL_TASK
from tests.waiting import wait_until


async def call(ws: ClientConnection, msg: dict[str, Any] | str) -> dict[str, Any]:
    await ws.send(msg if isinstance(msg, str) else json.dumps(msg))
    reply: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return reply


async def reset(ws: ClientConnection, rid: str = "r") -> dict[str, Any]:
    reply = await call(ws, {"type": "reset", "request_id": rid, "task_id": NULL_TASK, "seed": 0})
    assert reply["type"] == "observation", reply
    return reply


def step(rid: str, command: str) -> dict[str, Any]:
    return {"type": "step", "request_id": rid, "action": {"kind": "command", "command": command}}


async def sandbox_destroyed(backend: Any, sandbox_id: str) -> None:
    """The episode's sandbox is gone from the (null) backend."""
    await wait_until(lambda: sandbox_id not in backend.live, 10.0, 0.02, f"{sandbox_id} destroyed")


async def test_full_exchange_and_reset_observation_has_instruction(null_server):
    async with connect(null_server.url) as ws:
        r = await reset(ws, "1")
        assert r["request_id"] == "1"
        assert "Write hello" in r["observation"]["output"]
        assert set(r["observation"]) >= {"output", "exit_code", "screen"}
        assert r["info"]["from_pool"] is False and r["info"]["acquire_s"] >= 0
        s = await call(ws, step("2", "echo hi"))
        assert s["type"] == "step_result" and s["request_id"] == "2"
        assert s["observation"]["output"] == "hi\n" and s["observation"]["exit_code"] == 0
        assert s["terminated"] is False and s["truncated"] is False
        assert s["info"]["step"] == 1 and "action_s" in s["info"]
        c = await call(ws, {"type": "close", "request_id": "3"})
        assert c == {"type": "closed", "request_id": "3", "session_id": r["session_id"]}
    # The episode's sandbox is destroyed, never reused (the pool may create a fresh spare).
    await sandbox_destroyed(null_server.backend, r["info"]["sandbox_id"])


@pytest.mark.parametrize(
    ("frame", "request_id"),
    [
        ("{not json", None),
        (json.dumps({"type": "reset", "request_id": "7", "task_id": NULL_TASK, "bogus": 1}), "7"),
        (json.dumps({"type": "launch", "request_id": "8"}), "8"),
        (json.dumps(step("9", "x") | {"action": {"kind": "command", "cmd": "ls"}}), "9"),
        (json.dumps({"type": "step", "action": {"kind": "submit"}}), None),
    ],
    ids=["bad-json", "unknown-field", "unknown-type", "unknown-action-field", "no-request-id"],
)
async def test_invalid_messages_get_invalid_message_and_connection_survives(
    null_server, frame, request_id
):
    async with connect(null_server.url) as ws:
        err = await call(ws, frame)
        assert err["type"] == "error" and err["code"] == "invalid_message", err
        assert err["request_id"] == request_id
        assert err["retryable"] is False and err["message"]
        await reset(ws)
        ok = await call(ws, step("s", "echo still-alive"))
        assert ok["observation"]["output"] == "still-alive\n"


async def test_unknown_task_and_step_before_reset(null_server):
    async with connect(null_server.url) as ws:
        err = await call(ws, step("1", "ls"))
        assert (err["code"], err["request_id"]) == ("no_episode", "1")
        err = await call(ws, {"type": "reset", "request_id": "2", "task_id": "nope/nothing"})
        assert err["code"] == "unknown_task" and "nope/nothing" in err["message"]
        await reset(ws, "3")


async def test_oversized_message_is_refused_and_connection_survives(make_server):
    srv = make_server("null", max_message_bytes=4096)
    async with connect(srv.url) as ws:
        await reset(ws)
        big = {"type": "step", "request_id": "big",
               "action": {"kind": "write_file", "path": "f", "content": "x" * 10_000}}  # fmt: skip
        err = await call(ws, big)
        assert err["code"] == "invalid_message" and "max_message_bytes" in err["message"]
        assert err["request_id"] == "big"
        ok = await call(ws, step("after", "echo ok"))
        assert ok["observation"]["output"] == "ok\n"


async def test_second_request_in_flight_is_refused_not_queued(null_server):
    async with connect(null_server.url) as ws:
        await reset(ws)
        await ws.send(json.dumps(step("slow", "sleep 0.5")))
        await ws.send(json.dumps(step("eager", "echo hi")))
        first = json.loads(await ws.recv())
        assert first["type"] == "error" and first["request_id"] == "eager"
        assert first["code"] == "invalid_message" and first["retryable"] is True
        second = json.loads(await ws.recv())
        assert second["type"] == "step_result" and second["request_id"] == "slow"


async def test_resume_after_drop_keeps_shell_state(null_server):
    async with connect(null_server.url) as ws:
        r = await reset(ws)
        await call(ws, step("1", "export X=1"))
    async with connect(null_server.url) as ws2:
        resumed = await call(
            ws2,
            {"type": "resume", "request_id": "2", "session_id": r["session_id"],
             "resume_token": r["resume_token"]},
        )  # fmt: skip
        assert resumed["type"] == "observation" and resumed["info"]["resumed"] is True
        assert resumed["info"]["step"] == 1
        out = await call(ws2, step("3", "echo $X"))
        assert out["observation"]["output"] == "1\n"


async def test_resume_with_wrong_token_or_after_grace_is_refused(make_server):
    srv = make_server("null", resume_grace_s=0.3, sweep_interval_s=0.05)
    async with connect(srv.url) as ws:
        r = await reset(ws)
    async with connect(srv.url) as ws2:
        bad = {"type": "resume", "request_id": "x", "session_id": r["session_id"],
               "resume_token": "wrong"}  # fmt: skip
        assert (await call(ws2, bad))["code"] == "no_episode"
        # the grace ran out: the sandbox is destroyed
        await sandbox_destroyed(srv.backend, r["info"]["sandbox_id"])
        good = bad | {"resume_token": r["resume_token"]}
        assert (await call(ws2, good))["code"] == "no_episode"


async def test_resent_step_after_resume_returns_cached_reply(null_server):
    async with connect(null_server.url) as ws:
        r = await reset(ws)
        first = await call(ws, step("42", "echo once"))
    async with connect(null_server.url) as ws2:
        await call(ws2, {"type": "resume", "request_id": "r2", "session_id": r["session_id"],
                         "resume_token": r["resume_token"]})  # fmt: skip
        again = await call(ws2, step("42", "echo once"))
        assert again == first  # the same reply, not a second run (step count unchanged)
        nxt = await call(ws2, step("43", "echo twice"))
        assert nxt["info"]["step"] == 2


async def test_client_reconnects_and_resumes_transparently(null_server):
    async with AsyncEnvClient(null_server.url, reconnect_backoff_s=0.01) as env:
        await env.reset(NULL_TASK)
        await env.step("export X=1")
        await env.drop_connection()
        res = await env.step("echo $X")
        assert res.observation["output"] == "1\n"
        assert env.reconnects == 1


async def test_step_limit_truncates_and_ends_episode(make_server):
    srv = make_server("null", max_steps=3)
    async with AsyncEnvClient(srv.url) as env:
        _, info = await env.reset(NULL_TASK)
        flags = [(await env.step("true")).truncated for _ in range(3)]
        assert flags == [False, False, True]
        with pytest.raises(EnvError) as exc:
            await env.step("true")
        assert exc.value.code == "no_episode"
    await sandbox_destroyed(srv.backend, info["sandbox_id"])


async def test_time_limit_truncates(make_server):
    srv = make_server("null", episode_time_limit_s=0.2)
    async with AsyncEnvClient(srv.url) as env:
        await env.reset(NULL_TASK)
        await asyncio.sleep(0.3)
        res = await env.step("echo late")
        assert res.truncated is True and res.info["truncation"] == "time_limit"


async def test_command_timeout_is_an_observation(null_server):
    async with AsyncEnvClient(null_server.url) as env:
        await env.reset(NULL_TASK)
        res = await env.step({"kind": "command", "command": "sleep 5", "timeout_s": 0.1})
        assert res.observation["exit_code"] is None and res.info["timed_out"] is True
        assert "timed out" in res.observation["output"]


async def test_idle_episode_is_ended(make_server):
    srv = make_server("null", idle_timeout_s=0.2, sweep_interval_s=0.05)
    async with AsyncEnvClient(srv.url) as env:
        _, info = await env.reset(NULL_TASK)
        await sandbox_destroyed(srv.backend, info["sandbox_id"])
        with pytest.raises(EnvError) as exc:
            await env.step("true")
        assert exc.value.code == "no_episode"


async def test_dead_sandbox_is_sandbox_lost(null_server):
    async with AsyncEnvClient(null_server.url) as env:
        _, info = await env.reset(NULL_TASK)
        [sb] = [s.sandbox for s in null_server.service.sessions.values()]
        sb.kill()
        with pytest.raises(EnvError) as exc:
            await env.step("true")
        assert exc.value.code == "sandbox_lost" and exc.value.retryable is True
        await env.reset(NULL_TASK)  # the connection is still usable
        assert (await env.step("echo ok")).observation["output"] == "ok\n"


async def test_capacity(make_server):
    srv = make_server("null", max_sessions=1)
    async with AsyncEnvClient(srv.url) as a, AsyncEnvClient(srv.url) as b:
        await a.reset(NULL_TASK)
        with pytest.raises(EnvError) as exc:
            await b.reset(NULL_TASK)
        assert exc.value.code == "capacity" and exc.value.retryable is True
        await a.close()
        await wait_until(lambda: not srv.service.sessions, 10.0, 0.02, "no session left")
        await b.reset(NULL_TASK)


async def test_file_actions_and_keys(null_server):
    async with AsyncEnvClient(null_server.url) as env:
        await env.reset(NULL_TASK)
        w = await env.step({"kind": "write_file", "path": "/app/notes.txt", "content": "héllo"})
        assert w.observation["exit_code"] == 0
        r = await env.step({"kind": "read_file", "path": "/app/notes.txt"})
        assert r.observation["output"] == "héllo"
        missing = await env.step({"kind": "read_file", "path": "/app/none"})
        assert (
            missing.observation["exit_code"] == 1
            and "no such file" in missing.observation["output"]
        )
        k = await env.step({"kind": "keys", "keys": "abc"})
        assert k.observation["screen"] == "abc"
        with pytest.raises(EnvError) as exc:  # not a desktop task
            await env.step({"kind": "click", "x": 1, "y": 1})
        assert exc.value.code == "invalid_message" and "desktop" in exc.value.message
        assert (await env.step("echo fine")).observation["output"] == "fine\n"


async def test_auth(make_server):
    srv = make_server("null", token="s3cret")
    async with connect(srv.url) as ws:
        with pytest.raises(ConnectionClosed) as exc:
            await call(ws, {"type": "reset", "request_id": "1", "task_id": NULL_TASK})
        assert exc.value.rcvd is not None and exc.value.rcvd.code == 4401
    with pytest.raises(EnvError) as err:
        async with AsyncEnvClient(srv.url, token="wrong") as env:
            await env.reset(NULL_TASK)
    assert err.value.code == "unauthorized"
    async with AsyncEnvClient(srv.url, token="s3cret") as env:
        await env.reset(NULL_TASK)
    async with connect(srv.url + "?token=s3cret") as ws:
        await reset(ws)
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        assert (await http.get("/healthz")).status_code == 200
        for path in ("/metrics", "/v1/tasks", "/v1/pool", "/v1/sessions"):
            assert (await http.get(path)).status_code == 401, path
            ok = await http.get(path, headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200, path


async def test_http_endpoints(null_server):
    async with (
        AsyncEnvClient(null_server.url) as env,
        httpx.AsyncClient(base_url=null_server.http_url) as http,
    ):
        await env.reset(NULL_TASK)
        await env.step("echo hi")
        assert NULL_TASK in (await http.get("/v1/tasks")).json()["tasks"]
        sessions = (await http.get("/v1/sessions")).json()
        assert sessions["count"] == 1 and sessions["sessions"][0]["task_id"] == NULL_TASK
        assert sessions["sessions"][0]["steps"] == 1
        # the typed view keeps the wire keys it always had (a client may read any of them)
        assert set(sessions) == {"count", "resetting", "max_sessions", "sessions"}
        assert set(sessions["sessions"][0]) == {
            "session_id",
            "task_id",
            "seed",
            "steps",
            "age_s",
            "idle_s",
            "attached",
            "busy",
            "sandbox_id",
            "from_pool",
        }
        entry = SessionsReply.model_validate(sessions).sessions[0]
        assert entry.attached and not entry.busy and entry.sandbox_id
        assert (await http.get("/v1/pool")).json()["backend"] == "null"
        metrics = (await http.get("/metrics")).text
        assert "sandgym_steps_total 1.0" in metrics
        assert "sandgym_sessions_active 1.0" in metrics
        assert 'sandgym_action_latency_seconds_count{kind="command"} 1.0' in metrics
        assert "sandgym_pool_totals_leased 1.0" in metrics
        r = await http.post("/v1/pool/prewarm", json={"task_ids": [NULL_TASK], "count": 2})
        assert r.status_code == 200 and r.json()["scheduled"] == 1
        await wait_until(
            lambda: null_server.service.pool.snapshot().totals.ready == 2,
            10.0,
            0.02,
            "two ready sandboxes",
        )
        bad = await http.post("/v1/pool/prewarm", json={"task_ids": ["nope"], "count": 1})
        assert bad.status_code == 404 and bad.json()["code"] == "unknown_task"
        # the pool now hands out a ready sandbox: the next reset is a hit
        _, info = await env.reset(NULL_TASK)
        assert info["from_pool"] is True
