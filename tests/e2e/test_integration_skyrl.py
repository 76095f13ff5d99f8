"""SkyRL's door (sandgym/integrations/skyrl.py) with the released skyrl-gym (the `skyrl` extra):
`skyrl_gym.make("sandgym", ...)` gives a `BaseTextEnv` whose trajectories are sandgym episodes,
with the same rewards as sandgym's own client for the same task and seed (local backend)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import BackgroundServer
from tests.e2e.conftest import REAL_BACKENDS

skyrl_gym = pytest.importorskip("skyrl_gym")

TASK = "builtin/hello-file"
COMMAND = "printf 'Hello, world!\\n' > /app/hello.txt"
PROMPT = [{"role": "user", "content": "Solve the task."}]


def _sandgym_reward(url: str, actions: list) -> float:
    async def play() -> float:
        async with AsyncEnvClient(url) as env:
            await env.reset(TASK, seed=0)
            for a in actions:
                res = await env.step(a)
            return res.reward

    return asyncio.run(play())


@pytest.mark.parametrize("backend", REAL_BACKENDS[:1])
def test_skyrl_make_gives_sandgym_episodes(
    backend: str, make_server: Callable[..., BackgroundServer]
) -> None:
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    import sandgym.integrations.skyrl  # noqa: F401  (registers "sandgym")

    srv = make_server(backend)
    cfg = {"server_url": srv.url, "max_turns": 3}
    env = skyrl_gym.make("sandgym", env_config=cfg, extras={"task_id": TASK, "seed": 0})
    assert isinstance(env, BaseTextEnv)
    prompt, meta = env.init(PROMPT)
    assert "/app/hello.txt" in prompt[-1]["content"] and meta["task_id"] == TASK
    assert len(srv.service.sessions_view()) == 1

    out = env.step(f"I will write it.\n<bash>{COMMAND}</bash>")
    assert out["done"] is False and out["reward"] == 0.0
    assert "[exit code 0]" in out["observations"][0]["content"]
    out = env.step("<bash>cat /app/hello.txt</bash>")
    assert "Hello, world!" in out["observations"][0]["content"]
    out = env.step("Done. <submit/>")
    assert out["done"] is True
    solved = out["reward"]
    env.close()

    # a policy that never acts: hinted, then submitted at max_turns
    env = skyrl_gym.make("sandgym", env_config=cfg, extras={"task_id": TASK, "seed": 0})
    env.init(PROMPT)
    out = env.step("hmm")
    assert out["done"] is False and out["observations"][0]["content"].startswith("No action")
    env.step("still thinking")
    out = env.step("...")
    assert out["done"] is True and out["metadata"]["turns"] == 3
    noop = out["reward"]
    env.close()

    assert (solved, noop) == (1.0, 0.0)
    assert solved == _sandgym_reward(srv.url, [COMMAND, {"kind": "submit"}])
    assert noop == _sandgym_reward(srv.url, [{"kind": "submit"}])
