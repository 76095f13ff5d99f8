"""A fleet's poll and the placements made while it is on its way (`sandgym/client/fleet.py`):
creations sent at once each start a poll (no lock: the fleet is shared across event loops), and
a poll that answers after some of them were placed must not forget them, or the next creation
goes to the server that already has them (seen in CI: four creations at once split 3/1)."""

from __future__ import annotations

import asyncio

import httpx

from sandgym.client.fleet import Fleet
from tests.waiting import wait_until

A, B = "http://a:1", "http://b:1"


def _servers(gate: asyncio.Event, asked: list[str]) -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        await gate.wait()  # every server answers only once the gate opens
        path = request.url.path
        if path == "/v1/sessions":  # A: 8 free slots; B: 7 (it holds one episode)
            held = 1 if request.url.host == "b" else 0
            return httpx.Response(200, json={"count": held, "resetting": 0, "max_sessions": 8})
        if path == "/v1/sandboxes":
            return httpx.Response(200, json={"count": 0, "sandboxes": []})
        return httpx.Response(200, json={"keys": {}})

    return httpx.MockTransport(handler)


async def test_placements_made_while_a_poll_is_on_its_way_still_count() -> None:
    gate, asked = asyncio.Event(), []
    fleet = Fleet([A, B], poll_interval_s=3600.0, transport=_servers(gate, asked))
    # a first poll has answered
    gate.set()
    await fleet.refresh(force=True)
    gate.clear()
    asked.clear()
    # a second poll is asked for (another creation's), and while it is on its way two
    # creations are placed on A; the servers' replies do not show them yet
    poll = asyncio.ensure_future(fleet.refresh(force=True))
    await wait_until(lambda: len(asked) == 6, 10.0, 0.001, "the poll's six requests sent")
    fleet.placed(A)
    fleet.placed(A)
    gate.set()
    await poll
    # A has 8 - 2 = 6 free, B 7: the next creation goes to B (no new poll: it is recent)
    assert (await fleet.candidates())[0] == B
