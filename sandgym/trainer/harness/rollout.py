"""Harness episodes as a training rollout kind (`agent.kind: harness`).

`HarnessRollout` is what a `RolloutWorker` plays episodes with when the agent is a harness: a
`ModelGateway` in front of the worker's own engine (so generation shares the engine's batcher
and its weight version, which every recorded call carries), served by a `GatewayServer` on the
worker's loopback, and a `HarnessRunner` that runs the ReAct agent inside the sandbox against it.
The gateway starts on the first episode, on the actor's event loop. Calls are recorded in SQLite
at `store_path` (under the run directory) and removed as each episode is turned into Steps, so
the store does not grow over a run.

Episodes are spread over the env servers in turn. The bridge target is loopback, so each server
must run on the same host as the worker that uses it.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from sandgym.client.env_client import AsyncEnvClient
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.engines.base import InferenceEngine, SamplingParams
from sandgym.trainer.episode import Episode, apply_tamper_policy
from sandgym.trainer.gateway import CallStore, GatewayServer, ModelGateway
from sandgym.trainer.harness.runner import HarnessRunner


class HarnessRollout:
    """`run_episode(task_id, seed, group_id, params)` like `EpisodeRunner`, played by a harness."""

    def __init__(
        self, config: TrainConfig, engine: InferenceEngine, tokenizer: Any, store_path: Path
    ) -> None:
        s = config.sampling
        self.config = config
        self.gateway = ModelGateway(
            [engine],
            tokenizer,
            CallStore(
                store_path, max_sessions_in_memory=max(64, 4 * config.rollout.concurrent_episodes)
            ),
            default_params=SamplingParams(s.temperature, s.top_p, s.max_new_tokens, s.top_k),
            max_new_tokens_cap=s.max_new_tokens,
        )
        self._urls = itertools.cycle(config.env.server_urls)
        self._server: GatewayServer | None = None
        self._runner: HarnessRunner | None = None
        self._lock = asyncio.Lock()

    def _client(self) -> Any:
        return AsyncEnvClient(next(self._urls), token=self.config.env.token)

    async def _ensure_started(self) -> HarnessRunner:
        async with self._lock:
            if self._runner is None:
                server = await GatewayServer(self.gateway).__aenter__()
                a, s = self.config.agent, self.config.sampling
                self._server = server
                self._runner = HarnessRunner(
                    self.gateway,
                    server.root,
                    self._client,
                    max_turns=a.max_turns,
                    max_tokens=s.max_new_tokens,
                    temperature=s.temperature,
                    agent_timeout_s=a.harness_timeout_s,
                    command_timeout_s=a.command_timeout_s,
                )
            return self._runner

    @property
    def gateway_root(self) -> str | None:
        """http://127.0.0.1:PORT once the gateway runs."""
        return self._server.root if self._server is not None else None

    async def run_episode(
        self,
        task_id: str,
        seed: int | None,
        group_id: str = "",
        params: SamplingParams | None = None,
    ) -> Episode:
        runner = await self._ensure_started()
        ep = await runner.run_episode(task_id, seed, group_id, params)
        apply_tamper_policy(ep, self.config.env.tampered)  # score 0 or keep, flagged
        return ep

    async def aclose(self) -> None:
        server, self._server, self._runner = self._server, None, None
        if server is not None:
            await server.__aexit__(None, None, None)
        self.gateway.store.close()
