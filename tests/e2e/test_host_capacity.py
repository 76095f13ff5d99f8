"""Capacity of one real `sandgym serve` (local backend) through the sandbox API (issue 59).

`max_sessions` is ONE limit shared by the sandbox API's sandboxes and the episode API's
episodes: the create past it is refused with `capacity` naming the limit and what it counts,
and a close makes room again. Below the host's memory floor (`min_available_memory_mb`,
MemAvailable) a create is refused with `capacity` naming host memory, before anything is made.
"""

from __future__ import annotations

import pytest

from sandgym.client.sandbox_client import CapacityError, SandboxClient
from sandgym.server.runner import ServerProcess
from sandgym.wire.sandbox_protocol import CreateSandboxRequest, SandboxEnvironment
from tests.e2e.conftest import local_available

pytestmark = pytest.mark.skipif(not local_available(), reason="bubblewrap not installed")

REQ = CreateSandboxRequest(environment=SandboxEnvironment(docker_image="debian:bookworm-slim"))
BASE_ENV = {"SANDGYM_INCLUDE_BUILTIN": "false", "SANDGYM_POOL_SIZE": "0"}


async def test_shared_limit_refuses_past_max_sessions_and_a_close_makes_room() -> None:
    with ServerProcess("local", env={**BASE_ENV, "SANDGYM_MAX_SESSIONS": "2"}) as srv:
        async with SandboxClient(srv.http_url) as client:
            first = await client.create(REQ)
            second = await client.create(REQ)
            with pytest.raises(CapacityError) as refused:
                await client.create(REQ)
            msg = str(refused.value)
            assert "max_sessions=2" in msg, msg
            assert "2 sandboxes and 0 episodes" in msg, msg
            assert refused.value.retryable
            leased = (await client.pool_status())["totals"]  # the pool's own count, as sent
            assert leased["leased"] == 2, leased
            assert await client.close(first.sandbox_id)
            third = await client.create(REQ)
            assert {second.sandbox_id, third.sandbox_id} == {
                x.sandbox_id for x in (await client.list()).sandboxes
            }
            for sb in (second, third):
                await client.close(sb.sandbox_id)


async def test_memory_floor_refuses_by_name_before_creating() -> None:
    env = {**BASE_ENV, "SANDGYM_MIN_AVAILABLE_MEMORY_MB": str(10**9)}  # more than any host
    with ServerProcess("local", env=env) as srv:
        async with SandboxClient(srv.http_url) as client:
            with pytest.raises(CapacityError) as refused:
                await client.create(REQ)
            msg = str(refused.value)
            assert "host memory" in msg and "min_available_memory_mb" in msg, msg
            assert "1000000000 MiB" in msg, msg
            assert refused.value.retryable
            assert (await client.list()).count == 0
            pool = await client.pool_status()
            assert pool["totals"]["total"] == 0, pool["totals"]
