"""Rollouts: episodes driven through the env server by an agent and an inference engine.

`EpisodeRunner` is plain asyncio: it chooses a server, then plays one episode through the one
episode loop (`sandgym.trainer.episode_runner.run_episode`: reset, the agent's turns, submit to the end,
failures classified by sandgym/trainer/failures.py) with the terminal agent (one model turn per step until
it submits or reaches its turn limit), or the no-op or oracle agent. Every turn is recorded as a
`Step`. Many episodes run concurrently on one event loop; their generation requests are
micro-batched by the engine.

`RolloutWorker` is the Ray actor wrapping a runner, an engine and its copy of the weights. It is
an async actor (`max_concurrency` = concurrent episodes): the driver calls `run_episode` once per
episode and collects results with `ray.wait` as each finishes, so episodes stream to the learner
instead of being gathered in lock-step batches. `update_weights` swaps in the learner's weights
between generation batches and records their version on every later step. With
`agent.kind: harness` the worker plays episodes through `sandgym.trainer.harness.rollout.HarnessRollout`
(the ReAct agent inside the sandbox, its calls served by a gateway in front of this engine and
turned into Steps); they reach the learner like terminal-agent episodes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from sandgym.client.env_client import AsyncEnvClient
from sandgym.trainer.agents import (
    NO_ACTION_HINT,
    NoopAgent,
    OracleAgent,
    TerminalAgent,
    format_observation,
    parse_action,
)
from sandgym.trainer.builders import build_agent, build_engine, uses_model
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.engines.base import InferenceEngine, SamplingParams
from sandgym.trainer.engines.weight_files import load_weights
from sandgym.trainer.episode import Episode, Step, Trajectory, apply_tamper_policy
from sandgym.trainer.episode_runner import Ending, EpisodeSession, run_episode
from sandgym.trainer.inflight import InflightBook
from sandgym.trainer.models import load_tokenizer
from sandgym.trainer.priority import normal_priority
from sandgym.trainer.roles import SolverJudgeWorkflow

log = logging.getLogger(__name__)


class Workflow(Protocol):
    """What a rollout worker plays an episode with: `EpisodeRunner` (one agent), the solver-judge
    workflow (sandgym/trainer/roles.py) and the harness rollout (sandgym/trainer/harness/rollout.py). Each plays
    one episode of `task_id` at `seed` as a member of `group_id` and returns it filled in, never
    raising for the episode's own failures (they are classified on the episode)."""

    async def run_episode(
        self,
        task_id: str,
        seed: int | None,
        group_id: str = "",
        params: SamplingParams | None = None,
    ) -> Episode: ...


class EpisodeRunner:
    """Plays episodes; `client_factory(url)` returns an async-context-manager env client."""

    def __init__(
        self,
        config: TrainConfig,
        engine: InferenceEngine | None,
        agent: TerminalAgent | NoopAgent | OracleAgent,
        client_factory: Callable[[str], Any] | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.agent = agent
        self.urls = list(config.env.server_urls)
        self._in_flight: Counter[str] = Counter(dict.fromkeys(self.urls, 0))
        self._group_urls: dict[str, tuple[str, int]] = {}  # group id -> (server, members left)
        self._client_factory = client_factory or self._default_client
        self.book: Any = None  # sandgym/trainer/inflight.py's InflightBook, when there is a run dir
        s = config.sampling
        self.params = SamplingParams(s.temperature, s.top_p, s.max_new_tokens, s.top_k)

    def _default_client(self, url: str) -> Any:
        return AsyncEnvClient(url, token=self.config.env.token)

    def pick_url(self, group_id: str = "", group_size: int = 0) -> str:
        """The server with the fewest of this runner's episodes in flight, chosen once per
        group: a group's other members follow its first (its pool and snapshot are there).

        The trainer normally chooses (`run_episode(url=)`: the least-loaded server with room,
        across all rollout workers, sandgym/trainer/cluster.py); this is the fallback without it."""
        if group_id and group_id in self._group_urls:
            url, left = self._group_urls[group_id]
            if left <= 1:
                del self._group_urls[group_id]
            else:
                self._group_urls[group_id] = (url, left - 1)
            return url
        if not self.urls:
            raise ValueError("no env server to pick: env.server_urls is empty and none was named")
        url = min(self.urls, key=lambda u: self._in_flight[u])
        if group_id and group_size > 1:
            self._group_urls[group_id] = (url, group_size - 1)
        return url

    async def run_episode(
        self,
        task_id: str,
        seed: int | None,
        group_id: str = "",
        params: SamplingParams | None = None,
        group_size: int = 0,
        url: str = "",
    ) -> Episode:
        """One episode. With `group_size` > 1 (and `env.fork_groups`) it is one of the group
        `group_id`: its sandbox starts from the group's one prepared state on the server.
        `url` is the server the trainer chose for the group (default: `pick_url`)."""
        fork = bool(group_id) and group_size > 1 and self.config.env.fork_groups
        url = url or self.pick_url(group_id if fork else "", group_size)
        reset_options: dict[str, Any] = (
            {"group": {"id": group_id, "size": group_size}} if fork else {}
        )
        if self.config.env.verify is not None:
            reset_options["verify"] = self.config.env.verify
        episode = Episode(task_id=task_id, seed=seed, group_id=group_id, server_url=url)
        episode.trajectories.append(Trajectory(role="agent"))
        self._in_flight[url] += 1
        try:
            ep = await run_episode(
                lambda: self._client_factory(url),
                episode,
                self._policy(params or self.params),
                reset_options=reset_options,
                reset_retries=self.config.env.connect_retries,  # waits out `capacity`
                book=self.book,  # for a trainer restart (sandgym/trainer/inflight.py)
            )
            apply_tamper_policy(ep, self.config.env.tampered)  # score 0 or keep, flagged
            return ep
        finally:
            self._in_flight[url] -= 1

    def _policy(self, params: SamplingParams) -> Callable[[EpisodeSession], Awaitable[Ending]]:
        if isinstance(self.agent, NoopAgent | OracleAgent) or self.engine is None:
            return self._play_scripted

        async def play(session: EpisodeSession) -> Ending:
            return await self._play_model(session, params)

        return play

    async def _play_scripted(self, session: EpisodeSession) -> Ending:
        """No-op: nothing (the runner submits). Oracle: the task's solution, then submit."""
        if isinstance(self.agent, OracleAgent):
            for action in self.agent.actions(session.episode.task_id):
                await session.step(action)
                if session.ended:
                    break
        return "submitted"

    async def _play_model(self, session: EpisodeSession, params: SamplingParams) -> Ending:
        """The terminal agent: one model turn per step until it submits or runs out of turns
        (a command-then-submit reply runs the command, then submits)."""
        assert self.engine is not None and isinstance(self.agent, TerminalAgent)
        settings = self.config.agent
        conv = self.agent.new_conversation(session.observation.get("output", ""), None)
        for _turn in range(settings.max_turns):
            t = time.monotonic()
            prompt = list(conv.token_ids)
            gen = await self.engine.agenerate(prompt, params)
            gen_s = time.monotonic() - t
            text = self.agent.decode(gen.token_ids)
            step = Step(
                prompt_ids=prompt,
                response_ids=list(gen.token_ids),
                response_logprobs=list(gen.logprobs),
                loss_mask=[1] * len(gen.token_ids),
                response_text=text,
                policy_version=gen.version,
                generate_s=gen_s,
            )
            session.trajectory.steps.append(step)
            conv.add_response(text, gen.token_ids, finished=gen.finish_reason == "stop")
            parsed = parse_action(text)
            if parsed.action is None and not parsed.submit:
                conv.add_user(NO_ACTION_HINT)
                continue
            action = parsed.action or {"kind": "submit"}
            if action.get("kind") == "command":
                action["timeout_s"] = settings.command_timeout_s
            step.action = action
            await session.step(action, turn=step)
            if session.ended or (parsed.submit and parsed.action is not None):
                return "submitted"
            conv.add_user(format_observation(step.observation, settings.max_observation_chars))
        # the turn limit: the runner submits so the verifier scores what the agent left
        return "turn_limit"


class RolloutWorker:
    """Ray actor: its own engine + weights, many concurrent episodes (see module docstring)."""

    def __init__(
        self,
        config_dict: dict[str, Any],
        worker_index: int = 0,
        run_dir: str | None = None,
        engine_seed: int | None = None,
    ) -> None:
        logging.basicConfig(level=logging.INFO)
        normal_priority()  # not Ray's nice 15 (sandgym/trainer/priority.py)
        self.config = TrainConfig.model_validate(config_dict)
        self.index = worker_index
        cfg = self.config
        self.tokenizer = load_tokenizer(cfg.model)
        engine: InferenceEngine | None = None
        if uses_model(cfg):
            base = cfg.engine.weight_dir or (f"{run_dir}/weights" if run_dir else None)
            weight_dir = f"{base}/rollout-{worker_index}" if base else None
            engine = build_engine(
                cfg,
                self.tokenizer,
                # the trainer's seed differs per restart and replacement (sandgym/trainer/schedule.py)
                seed=cfg.run.seed + 1000 + worker_index if engine_seed is None else engine_seed,
                weight_dir=weight_dir,
            )
        self.engine = engine
        agent = build_agent(cfg, self.tokenizer)
        self.runner = EpisodeRunner(cfg, engine, agent)
        if run_dir:  # episodes in flight kept for a restart (sandgym/trainer/inflight.py)
            self.runner.book = InflightBook(run_dir)
        # spread the first picks of different workers over different servers
        urls = self.runner.urls
        if urls:  # (none when the trainer finds its servers through Ray and names each one)
            k = worker_index % len(urls)
            self.runner.urls = urls[k:] + urls[:k]
        self.workflow: Workflow = self.runner
        if cfg.agent.workflow == "solver_judge":
            if engine is None:
                raise ValueError("agent.workflow solver_judge needs a model (agent.kind terminal)")
            self.workflow = SolverJudgeWorkflow(self.runner, engine, self.tokenizer)
        if cfg.agent.kind == "harness":
            import tempfile
            from pathlib import Path

            # lazy: harness mode only; loads fastapi (+0.14 s CPU, measured) into every `sandgym`
            # command's start (cli/run.py imports this module)
            from sandgym.trainer.harness.rollout import HarnessRollout

            if engine is None:
                raise ValueError("agent.kind harness needs an inference engine")
            gw_root = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="sandgym-gw-"))
            store = gw_root / "gateway" / f"rollout-{worker_index}.sqlite"
            self.workflow = HarnessRollout(cfg, engine, self.tokenizer, store)

    async def run_episode(
        self,
        task_id: str,
        seed: int | None,
        group_id: str,
        greedy: bool = False,
        group_size: int = 0,
        server_url: str = "",
    ) -> dict[str, Any]:
        params = None
        if greedy:
            params = SamplingParams(0.0, 1.0, self.config.sampling.max_new_tokens)
        if self.workflow is self.runner:  # (multi-role and harness workflows prepare per member)
            ep = await self.runner.run_episode(
                task_id, seed, group_id, params, group_size, url=server_url
            )
        else:
            ep = await self.workflow.run_episode(task_id, seed, group_id, params)
        return ep.to_dict(with_tokens=True)

    async def update_weights(self, state_dict: dict[str, Any] | str, version: int) -> int:
        """Hand the learner's weights of `version` to the engine; returns the version the engine
        now serves (its own, when it cannot take weights; without an engine nothing generates
        and the learner's version is returned). A failed load raises (the trainer counts it)."""
        if self.engine is None:
            return version
        if isinstance(state_dict, str):  # a weights directory (the fsdp learner's push)
            state_dict = await asyncio.to_thread(load_weights, state_dict)
        return int(await asyncio.to_thread(self.engine.update_weights, state_dict, version))

    def stats(self) -> dict[str, Any]:
        return {
            "version": self.engine.version if self.engine else 0,
            "generated_tokens": self.engine.generated_tokens if self.engine else 0,
        }
