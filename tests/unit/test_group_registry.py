"""The group registry (sandgym/server/groups.py) and the pool's `forget`, on the null backend: who
prepares, who waits, what a mismatch or a full group gets, a failure (or a vanished member 0)
handed to every member, and removal after the last member or the ttl."""

from __future__ import annotations

import asyncio

import pytest

from sandgym.sandboxes import SandboxSpec, get_backend
from sandgym.sandboxes.pool import PoolSettings, SandboxPool
from sandgym.server.groups import GroupAbandonedError, GroupMismatchError, GroupRegistry, Prepared
from sandgym.wire.protocol import GroupOptions


@pytest.fixture
async def reg():
    backend = get_backend("null")
    pool = SandboxPool(backend, PoolSettings(min_ready=0))
    await pool.start()
    r = GroupRegistry(backend, pool, ttl_s=5.0)
    yield r
    await r.close()
    await pool.close()


async def test_members_in_order_and_mismatches(reg: GroupRegistry) -> None:
    opts = GroupOptions(id="g", size=2)
    g, m0 = reg.join(opts, "t", 1)
    _, m1 = reg.join(opts, "t", 1)
    assert (m0, m1, g.live) == (0, 1, 2)
    with pytest.raises(GroupMismatchError, match="already has its 2 members"):
        reg.join(opts, "t", 1)
    with pytest.raises(GroupMismatchError, match="seed"):
        reg.join(GroupOptions(id="g", size=2), "t", 2)
    with pytest.raises(GroupMismatchError, match="task"):
        reg.join(GroupOptions(id="g", size=2), "other", 1)


async def test_a_failure_reaches_every_member(reg: GroupRegistry) -> None:
    g, _ = reg.join(GroupOptions(id="f", size=3), "t", None)
    waiters = [asyncio.ensure_future(asyncio.shield(g.prepared)) for _ in range(2)]
    reg.fail(g, RuntimeError("boom"))
    for w in waiters:
        with pytest.raises(RuntimeError, match="boom"):
            await w


async def test_a_vanished_member_zero_is_a_named_error(reg: GroupRegistry) -> None:
    g, _ = reg.join(GroupOptions(id="c", size=2), "t", None)
    reg.fail(g, asyncio.CancelledError())
    with pytest.raises(GroupAbandonedError, match="stopped before the group was prepared"):
        await asyncio.shield(g.prepared)


async def test_snapshot_removed_after_the_last_member(reg: GroupRegistry) -> None:
    backend = reg.backend
    sb = await backend.create(SandboxSpec())
    snap = await sb.snapshot()
    fork_spec = SandboxSpec(snapshot=snap)
    g, _ = reg.join(GroupOptions(id="s", size=2), "t", None)
    reg.join(GroupOptions(id="s", size=2), "t", None)
    reg.resolve(g, Prepared(setup=None, fork_spec=fork_spec, snapshot=snap))
    await reg.pool.prewarm({fork_spec: 1})
    await reg.pool.wait_idle()
    reg.left(g)
    assert snap in backend.snapshots and "s" in reg.groups
    reg.left(g)
    await asyncio.gather(*reg._tasks)
    assert snap not in backend.snapshots and "s" not in reg.groups
    assert reg.pool.snapshot().totals.ready == 0  # the pool's ready copy went first
    await sb.close()


async def test_a_group_whose_members_never_came_expires(reg: GroupRegistry) -> None:
    g, _ = reg.join(GroupOptions(id="e", size=4), "t", None)
    reg.resolve(g, Prepared(setup=None))
    reg.left(g)
    assert reg.expire(now=g.created + 1.0) == []  # within its ttl
    assert reg.expire(now=g.created + 6.0) == ["e"]
    await asyncio.gather(*reg._tasks)
    assert "e" not in reg.groups


async def test_forget_destroys_ready_copies_and_makes_no_more() -> None:
    backend = get_backend("null")
    pool = SandboxPool(backend, PoolSettings(min_ready=2))
    await pool.start()
    try:
        spec = SandboxSpec(workdir="/w")
        await pool.prewarm([spec])
        await pool.wait_idle()
        assert pool.snapshot().totals.ready == 2
        await pool.forget(spec)
        await pool.wait_idle()
        assert pool.snapshot().totals.ready == 0 and backend.destroyed == 2
    finally:
        await pool.close()
