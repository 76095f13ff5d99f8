"""The trainer's balancing over env servers (sandgym/trainer/cluster.py `ServerBalancer`) and the rollout
runner's fallback choice: a group goes to one server, the least-loaded that has room for all of
it; a server's capacity answer is respected; a server that stops answering gets no new group
and is used again once it answers."""

from __future__ import annotations

from typing import Any

import pytest

from sandgym.trainer.cluster import ServerBalancer

A, B, C = "ws://a:1/v1/env", "ws://b:1/v1/env", "ws://c:1/v1/env"


def balancer(free: dict[str, int | None]) -> ServerBalancer:
    b = ServerBalancer(probe=lambda url, token: free[url])
    for url in free:
        b.add(url)
    b.poll()
    return b


def test_least_loaded_with_room_for_the_whole_group() -> None:
    b = balancer({A: 4, B: 8})
    # load = ours there / capacity: both empty -> ties go by URL
    assert b.choose(2) == A
    b.acquire(A, 2)  # 2/4 = 0.5 against 0/8
    assert b.choose(2) == B
    b.acquire(B, 2)  # 2/4 vs 2/8
    assert b.choose(2) == B
    b.acquire(B, 2)  # 2/4 vs 4/8: tie on load, fewer in flight wins... both 0.5
    b.acquire(A, 2)  # A full (4/4)
    assert b.choose(2) == B
    b.acquire(B, 4)  # B full (8/8)
    assert b.choose(1) is None  # no room anywhere: the trainer waits
    b.release(A, 1)
    assert b.choose(2) is None  # one slot is not room for a group of two
    assert b.choose(1) == A


def test_capacity_answer_counts_others_episodes() -> None:
    free: dict[str, int | None] = {A: 3, B: 10}
    b = balancer(free)
    b.acquire(A, 2)
    free[A] = 1  # the server now has 1 free slot, ours 2 among its sessions
    b.poll()
    assert b.servers[A].capacity == 3
    free[A] = 0  # someone else took the last slot
    b.poll()
    assert b.servers[A].capacity == 2
    assert b.choose(1) == B


def test_episodes_still_in_transit_are_not_offered_twice() -> None:
    """A poll answered while our resets are on their way (sent, not yet listed by the server)
    must not count their slots as free and ours at once (`bench cluster` saw `capacity`
    refusals from that)."""
    answer: dict[str, tuple[int, int] | None] = {A: (4, 0)}
    b = ServerBalancer(probe=lambda url, token: answer[url])
    b.add(A)
    b.poll()
    b.acquire(A, 1)  # sent; the server does not list it yet: 4 free, 0 used
    b.poll()
    assert b.servers[A].capacity == 4
    b.acquire(A, 3)
    assert b.choose(1) is None  # 4 of ours on a 4-slot server: no room
    answer[A] = (0, 4)  # all four arrived
    b.poll()
    assert b.servers[A].capacity == 4 and b.choose(1) is None
    b.release(A, 1)
    answer[A] = (1, 3)
    b.poll()
    assert b.choose(1) == A


def test_a_server_that_stops_answering_gets_nothing_until_it_answers() -> None:
    free: dict[str, int | None] = {A: 4, B: 4}
    b = balancer(free)
    free[A] = None
    b.poll([A])
    assert [b.choose(1) for _ in range(1)] == [B]
    b.acquire(B, 4)
    assert b.choose(1) is None
    free[A] = 4
    b.poll()
    assert b.choose(1) == A  # back in use


def test_unknown_server_starts_unhealthy_and_removal_forgets_it() -> None:
    b = ServerBalancer(probe=lambda url, token: None)
    b.add(C)
    assert b.choose(1) is None
    b.add(C, capacity=2)
    assert b.choose(1) == C
    b.acquire(C)
    b.remove(C)
    b.release(C)  # an episode of a forgotten server coming back is fine
    assert b.choose(1) is None


def test_plan_prewarms_where_the_next_groups_go_and_changes_nothing() -> None:
    b = balancer({A: 4, B: 4})
    assert b.plan(3, 2) == [A, B, A]
    assert b.servers[A].in_flight == 0 and b.servers[B].in_flight == 0


def test_probe_capacity_reads_v1_sessions() -> None:
    from sandgym.server.runner import BackgroundServer
    from sandgym.server.settings import ServerSettings
    from sandgym.trainer.cluster import probe_capacity, probe_sessions

    with BackgroundServer(ServerSettings(backend="null", port=0, max_sessions=7)) as srv:
        assert probe_capacity(srv.url) == 7
        # a reset past the capacity check holds a slot before its session is listed
        srv.service.table.reserved += 2
        try:
            assert probe_capacity(srv.url) == 5
            assert probe_sessions(srv.url) == (5, 2)
        finally:
            srv.service.table.reserved -= 2
    assert probe_capacity(srv.url, timeout_s=0.5) is None  # gone


class _Client:
    def __init__(self, url: str, seen: list[str]) -> None:
        self.url, self.seen = url, seen

    async def __aenter__(self) -> Any:
        self.seen.append(self.url)
        raise ConnectionRefusedError(self.url)

    async def __aexit__(self, *exc: object) -> None:
        return None


@pytest.mark.asyncio
async def test_runner_keeps_a_group_on_one_server_and_honours_the_trainers_choice() -> None:
    from sandgym.trainer.agents import NoopAgent
    from sandgym.trainer.config import TrainConfig
    from sandgym.trainer.rollout import EpisodeRunner

    cfg = TrainConfig.model_validate(
        {"env": {"server_urls": [A, B, C], "task_ids": ["t"]}, "agent": {"kind": "noop"}}
    )
    seen: list[str] = []
    runner = EpisodeRunner(cfg, None, NoopAgent(), client_factory=lambda u: _Client(u, seen))
    for gid in ("g1", "g2"):
        for _ in range(3):
            ep = await runner.run_episode("t", 0, gid, group_size=3)
            assert ep.termination == "connection" and ep.is_infra_failure
    assert seen[:3] == [seen[0]] * 3 and seen[3:] == [seen[3]] * 3
    assert runner._group_urls == {}  # forgotten after the last member
    seen.clear()
    await runner.run_episode("t", 0, "g3", group_size=2, url="ws://chosen:9/v1/env")
    assert seen == ["ws://chosen:9/v1/env"]
