"""`EnvService` without a socket: reset/step/close/resume on fake connections, and the sweep's
rules (grace, idle) driven by an explicit clock."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandgym.sandboxes.null import NullBackend
from sandgym.server.errors import BusyError, CapacityError, NoEpisodeError
from sandgym.server.sessions import EnvService
from sandgym.server.settings import ServerSettings
from sandgym.wire.protocol import CloseMsg, ResetMsg, ResumeMsg, StepMsg, parse_action
from tests.waiting import wait_until


class FakeConn:
    def __init__(self) -> None:
        self.session = None
        self.open = True


@pytest.fixture
def task_root(tmp_path: Path) -> Path:
    t = tmp_path / "t1"
    (t / "environment").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "task.toml").write_text('version = "1.0"\n')
    (t / "instruction.md").write_text("do the thing\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "tests" / "test.sh").write_text("#!/bin/bash\n")
    return tmp_path


@pytest.fixture
async def service(task_root: Path):
    settings = ServerSettings(
        backend="null", task_dirs=[task_root], include_builtin=False, max_sessions=2,
        resume_grace_s=10, idle_timeout_s=100, sweep_interval_s=3600,
    )  # fmt: skip
    backend = NullBackend()
    svc = EnvService(settings, backend)
    await svc.start()
    svc.null = backend  # type: ignore[attr-defined]
    yield svc
    await svc.stop()


def step(rid: str, cmd: str) -> StepMsg:
    return StepMsg(request_id=rid, action=parse_action(cmd))


async def test_reset_step_close(service):
    conn = FakeConn()
    r = await service.reset(conn, ResetMsg(request_id="1", task_id="t1", seed=5))
    assert r.observation.output == "do the thing\n" and r.info["seed"] == 5
    s = await service.step(conn, step("2", "echo hi"))
    assert s.observation.output == "hi\n" and s.info["step"] == 1
    c = await service.close(conn, CloseMsg(request_id="3"))
    assert c.session_id == r.session_id and not service.sessions
    with pytest.raises(NoEpisodeError):
        await service.step(conn, step("4", "true"))


async def test_capacity_counts_live_episodes(service):
    conns = [FakeConn() for _ in range(3)]
    for c in conns[:2]:
        await service.reset(c, ResetMsg(request_id="r", task_id="t1"))
    with pytest.raises(CapacityError):
        await service.reset(conns[2], ResetMsg(request_id="r", task_id="t1"))
    # a reset on a connection that already has an episode replaces it, within capacity
    await service.reset(conns[0], ResetMsg(request_id="r2", task_id="t1"))
    assert len(service.sessions) == 2


async def test_grace_then_abandoned(service):
    conn = FakeConn()
    r = await service.reset(conn, ResetMsg(request_id="1", task_id="t1"))
    service.detach(conn)
    now = time.monotonic()
    assert service.sweep(now + 5) == []  # within the grace: kept
    assert service.sweep(now + 11) == [r.session_id]
    conn2 = FakeConn()
    with pytest.raises(NoEpisodeError):
        await service.resume(
            conn2, ResumeMsg(request_id="2", session_id=r.session_id, resume_token=r.resume_token)
        )


async def test_idle_episode_is_swept_even_when_attached(service):
    conn = FakeConn()
    r = await service.reset(conn, ResetMsg(request_id="1", task_id="t1"))
    assert service.sweep(time.monotonic() + 50) == []
    assert service.sweep(time.monotonic() + 101) == [r.session_id]


async def test_resume_takes_over_from_a_half_open_socket(service):
    old, new = FakeConn(), FakeConn()
    r = await service.reset(old, ResetMsg(request_id="1", task_id="t1"))
    await service.step(old, step("2", "export X=7"))
    await service.resume(
        new, ResumeMsg(request_id="3", session_id=r.session_id, resume_token=r.resume_token)
    )
    assert old.session is None and new.session is not None
    out = await service.step(new, step("4", "echo $X"))
    assert out.observation.output == "7\n"


async def test_second_step_while_one_is_in_flight_is_busy(service):
    import asyncio

    conn = FakeConn()
    await service.reset(conn, ResetMsg(request_id="1", task_id="t1"))
    slow = asyncio.create_task(service.step(conn, step("2", "sleep 0.2")))

    def in_flight() -> bool:  # the slow step is the session's one in flight
        assert not slow.done(), "step 2 ended before it was seen in flight"
        return conn.session.inflight_id == "2"

    await wait_until(in_flight, 10.0, 0.005, "step 2 in flight")
    with pytest.raises(BusyError):
        await service.step(conn, step("3", "true"))
    same = await service.step(conn, step("2", "sleep 0.2"))  # a resend waits for the original
    assert same is await slow
