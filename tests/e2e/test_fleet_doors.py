"""The doors on a fleet of two real `sandgym serve --backend local` processes, one address.

- NeMo-Gym's provider (`server_url="http://A,http://B"`, driven through the released nemo-gym
  0.7.0's own `providers/base.py`, as tests/e2e/test_integration_nemo_gym.py loads it): sandboxes
  spread over both servers; after SIGKILL of one, a command in its sandbox comes back as
  NeMo-Gym's infrastructure result (return code 125, `error_type` "sandbox"), never as the
  command's exit, and new sandboxes are made on the survivor.
- TRL's door (`SandgymEnvironment`, on the one episode loop): rollouts spread over both
  servers, all scored 1.0 by the task's verifier; a rollout whose server is SIGKILLed under it is
  dropped (`get_reward()` is None), never scored 0; the next rollouts go to the survivor.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from sandgym.client.fleet import shared_fleet
from sandgym.integrations.trl import SandgymEnvironment
from tests.e2e.test_fleet import MAX, Server, fleet2
from tests.e2e.test_integration_nemo_gym import nemo_gym

__all__ = ["fleet2", "nemo_gym"]  # fixtures used here

TASK = "builtin/hello-file"
SOLVE = "printf 'Hello, world!\\n' > /app/hello.txt"


def test_nemo_gym_provider_on_a_fleet(fleet2: list[Server], nemo_gym: Any) -> None:
    from sandgym.integrations.nemo_gym import SandgymProvider

    base = nemo_gym.base
    a, b = fleet2
    address = f"{a.url},{b.url}"

    async def drive() -> None:
        provider = SandgymProvider(server_url=address, timeout_s=30)
        provider._client.fleet.poll_interval_s = 0.0
        spec = base.SandboxSpec(image="sandgym/terminal")
        handles = [await provider.create(spec) for _ in range(2 * MAX)]
        where = Counter(provider._client.placement[h.sandbox_id] for h in handles)
        assert where == {a.url: MAX, b.url: MAX}
        for h in handles:
            res = await provider.exec(h, "echo ok; exit 4")
            assert (res.stdout, res.return_code) == ("ok\n", 4)

        a.kill()
        for h in handles:
            res = await provider.exec(h, "true")
            if provider._client.placement[h.sandbox_id] == a.url:
                assert (res.return_code, res.error_type) == (125, "sandbox")
            else:
                assert (res.return_code, res.error_type) == (0, None)
                await provider.close(h)
        fresh = [await provider.create(spec) for _ in range(MAX)]
        assert {provider._client.placement[h.sandbox_id] for h in fresh} == {b.url}
        for h in fresh:
            assert (await provider.exec(h, "true")).return_code == 0
            await provider.close(h)
        await provider.aclose()

    asyncio.run(drive())


def test_trl_door_on_a_fleet(fleet2: list[Server]) -> None:
    a, b = fleet2
    address = f"ws://127.0.0.1:{a.port}/v1/env,ws://127.0.0.1:{b.port}/v1/env"
    shared_fleet(address).poll_interval_s = 0.0

    def rollout(env: SandgymEnvironment) -> str:
        env.reset(task_id=TASK, seed=0)
        return env._episode._client.url  # type: ignore[attr-defined]

    envs = [SandgymEnvironment(address) for _ in range(4)]
    urls = []
    for env in envs:
        urls.append(rollout(env))
        env.run(SOLVE)
        assert env.get_reward() == 1.0
        env._close()
    assert Counter(urls) == {a.url.replace("http", "ws") + "/v1/env": 2,
                             b.url.replace("http", "ws") + "/v1/env": 2}  # fmt: skip

    # a rollout on A loses its server mid-episode: dropped, not scored
    doomed = SandgymEnvironment(address)
    while rollout(doomed) != a.url.replace("http", "ws") + "/v1/env":
        doomed._close()
        doomed = SandgymEnvironment(address)
    doomed.run("echo working")
    a.kill()
    assert doomed.get_reward() is None
    assert doomed.rewards == [None]
    doomed._close()

    # the next rollouts go to the survivor and are scored
    for _ in range(2):
        env = SandgymEnvironment(address)
        assert rollout(env) == b.url.replace("http", "ws") + "/v1/env"
        env.run(SOLVE)
        assert env.get_reward() == 1.0
        env._close()
