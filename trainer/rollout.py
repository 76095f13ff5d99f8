"""Rollouts: episodes driven through the env server by an agent and an inference engine.

`EpisodeRunner` is plain asyncio: it plays one episode on an `AsyncEnvClient` (reset, then one
model turn per step until submit or the turn limit) and records every turn as a `Step`. Many
episodes run concurrently on one event loop; their generation requests are micro-batched by the
engine. A failure ends the episode with a termination reason named after its wire code; the
infrastructure ones (`sandbox_lost`, a dropped connection, server errors) are masked by the
trainer, while `verifier_error` and `action_timeout`, which the agent can cause (a FIFO where the
tests read makes the verifier time out), score 0 (trainer/episode.py has the table).

`RolloutWorker` is the Ray actor wrapping a runner, an engine and its copy of the weights. It is
an async actor (`max_concurrency` = concurrent episodes): the driver calls `run_episode` once per
episode and collects results with `ray.wait` as each finishes, so episodes stream to the learner
instead of being gathered in lock-step batches. `update_weights` swaps in the learner's weights
between generation batches and records their version on every later step. With
`agent.kind: harness` the worker plays episodes through `trainer.harness.rollout.HarnessRollout`
(the ReAct agent inside the sandbox, its calls served by a gateway in front of this engine and
turned into Steps); they reach the learner like terminal-agent episodes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from envserver.client import http_base as http_base  # re-exported: older imports name it here
from trainer.agents import (
    NO_ACTION_HINT,
    NoopAgent,
    OracleAgent,
    TerminalAgent,
    format_observation,
    parse_action,
)
from trainer.config import TrainConfig
from trainer.engines.base import InferenceEngine, SamplingParams
from trainer.episode import Episode, Step, Trajectory
from trainer.failures import classify_failure

log = logging.getLogger(__name__)

#: the most steps a multi-step task may have before an episode's closing submits give up
MAX_TASK_STEPS = 1000


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
        s = config.sampling
        self.params = SamplingParams(s.temperature, s.top_p, s.max_new_tokens, s.top_k)

    def _default_client(self, url: str) -> Any:
        from envserver.client import AsyncEnvClient

        return AsyncEnvClient(url, token=self.config.env.token)

    def pick_url(self, group_id: str = "", group_size: int = 0) -> str:
        """The server with the fewest of this runner's episodes in flight, chosen once per
        group: a group's other members follow its first (its pool and snapshot are there).

        The trainer normally chooses (`run_episode(url=)`: the least-loaded server with room,
        across all rollout workers, trainer/cluster.py); this is the fallback without it."""
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
        reset_options = {"group": {"id": group_id, "size": group_size}} if fork else {}
        self._in_flight[url] += 1
        episode = Episode(task_id=task_id, seed=seed, group_id=group_id, server_url=url)
        traj = Trajectory(role="agent")
        episode.trajectories.append(traj)
        t0 = time.monotonic()
        try:
            async with self._client_factory(url) as client:
                await self._play(client, episode, traj, params or self.params, reset_options)
        except Exception as exc:  # recorded, never raised: one bad episode must not stop a run
            episode.termination = classify_failure(exc)  # type: ignore[assignment]
            episode.error = f"{type(exc).__name__}: {exc}"[:500]
            # every trajectory: a multi-role workflow must not keep a partial score either
            for t in episode.trajectories:
                t.reward = 0.0
            log.warning(
                "episode %s seed %s ended by %s (%s): %s",
                task_id,
                seed,
                episode.termination,
                "masked" if episode.is_infra_failure else "scored 0",
                exc,
            )
        finally:
            self._in_flight[url] -= 1
        episode.metrics.update(
            {
                "duration_s": time.monotonic() - t0,
                "turns": float(sum(1 for s in traj.steps if s.response_ids)),
                "generated_tokens": float(traj.num_generated_tokens),
                "generate_s": sum(s.generate_s for s in traj.steps),
                "env_s": sum(s.env_s for s in traj.steps),
            }
        )
        return episode

    async def _reset(
        self, client: Any, task_id: str, seed: int | None, options: dict[str, Any] | None = None
    ) -> tuple[Any, Any]:
        # `capacity` is the one retryable refusal worth waiting out at reset
        for attempt in range(self.config.env.connect_retries + 1):
            try:
                if options:
                    return await client.reset(task_id, seed=seed, options=options)
                return await client.reset(task_id, seed=seed)
            except Exception as exc:
                if getattr(exc, "retryable", False) and attempt < self.config.env.connect_retries:
                    await asyncio.sleep(0.5 * 2**attempt)
                    continue
                raise
        raise AssertionError("unreachable")

    async def _submit_to_the_end(self, client: Any, episode: Episode, traj: Trajectory) -> Any:
        """Submit until the episode ends: once, or once per step left of a multi-step task
        (a bounded loop: the server ends the episode after its last step)."""
        for _ in range(MAX_TASK_STEPS):
            t = time.monotonic()
            res = await client.step({"kind": "submit"})
            traj.steps.append(_env_step([], {"kind": "submit"}, res, time.monotonic() - t))
            _record_step_rewards(episode, res)
            if res.terminated or res.truncated:
                return res
        raise RuntimeError(f"the episode did not end after {MAX_TASK_STEPS} submits")

    async def _play(
        self,
        client: Any,
        episode: Episode,
        traj: Trajectory,
        params: SamplingParams,
        reset_options: dict[str, Any] | None = None,
    ) -> None:
        obs, _info = await self._reset(client, episode.task_id, episode.seed, reset_options)
        obs = _as_dict(obs)
        episode.instruction = str(obs.get("output") or "")
        if isinstance(self.agent, OracleAgent):
            for action in self.agent.actions(episode.task_id):
                t = time.monotonic()
                res = await client.step(action)
                traj.steps.append(_env_step([], action, res, time.monotonic() - t))
        if isinstance(self.agent, NoopAgent | OracleAgent) or self.engine is None:
            res = await self._submit_to_the_end(client, episode, traj)
            traj.reward = float(res.reward)
            episode.termination = "submitted"
            return
        settings = self.config.agent
        conv = self.agent.new_conversation(obs.get("output", ""), None)
        submit_next = False
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
            traj.steps.append(step)
            conv.add_response(text, gen.token_ids, finished=gen.finish_reason == "stop")
            parsed = parse_action(text)
            if parsed.action is None and not parsed.submit:
                conv.add_user(NO_ACTION_HINT)
                continue
            action = parsed.action or {"kind": "submit"}
            if action.get("kind") == "command":
                action["timeout_s"] = settings.command_timeout_s
            step.action = action
            t = time.monotonic()
            res = await client.step(action)
            _record_step_rewards(episode, res)
            step.env_s = time.monotonic() - t
            step.observation = _as_dict(res.observation)
            step.reward, step.done = float(res.reward), bool(res.terminated or res.truncated)
            if res.terminated or res.truncated:
                traj.reward = float(res.reward)
                episode.termination = "submitted" if res.terminated else "env_truncated"
                return
            if parsed.submit and parsed.action is not None:
                submit_next = True
                break
            conv.add_user(format_observation(step.observation, settings.max_observation_chars))
        # the turn limit (or a command-then-submit reply): submit so the verifier scores it
        # (every step left of a multi-step task is scored as the agent left it)
        res = await self._submit_to_the_end(client, episode, traj)
        traj.reward = float(res.reward)
        episode.termination = (
            ("submitted" if submit_next else "turn_limit") if res.terminated else "env_truncated"
        )


def _record_step_rewards(episode: Episode, res: Any) -> None:
    step = (getattr(res, "info", None) or {}).get("step")
    if isinstance(step, dict) and isinstance(step.get("rewards"), list):
        episode.step_rewards = [float(r) for r in step["rewards"]]


def _as_dict(obs: Any) -> dict[str, Any]:
    if obs is None:
        return {}
    if isinstance(obs, dict):
        return obs
    if hasattr(obs, "model_dump"):
        return dict(obs.model_dump())
    return {"output": str(obs)}


def _env_step(prompt: list[int], action: dict[str, Any], res: Any, env_s: float) -> Step:
    """A step the agent took without the model (an automatic submit): no tokens, no loss."""
    return Step(
        prompt_ids=prompt,
        response_ids=[],
        response_logprobs=[],
        loss_mask=[],
        action=action,
        observation=_as_dict(res.observation),
        reward=float(res.reward),
        done=bool(res.terminated or res.truncated),
        env_s=env_s,
    )


class RolloutWorker:
    """Ray actor: its own engine + weights, many concurrent episodes (see module docstring)."""

    def __init__(
        self, config_dict: dict[str, Any], worker_index: int = 0, run_dir: str | None = None
    ) -> None:
        from trainer.builders import build_agent, build_engine, uses_model
        from trainer.models import load_tokenizer

        logging.basicConfig(level=logging.INFO)
        self.config = TrainConfig.model_validate(config_dict)
        self.index = worker_index
        cfg = self.config
        self.tokenizer = load_tokenizer(cfg.model)
        engine: InferenceEngine | None = None
        if uses_model(cfg):
            engine = build_engine(cfg, self.tokenizer, seed=cfg.run.seed + 1000 + worker_index)
        self.engine = engine
        agent = build_agent(cfg, self.tokenizer)
        self.runner = EpisodeRunner(cfg, engine, agent)
        # spread the first picks of different workers over different servers
        urls = self.runner.urls
        if urls:  # (none when the trainer finds its servers through Ray and names each one)
            k = worker_index % len(urls)
            self.runner.urls = urls[k:] + urls[:k]
        self.workflow: Any = self.runner
        if cfg.agent.workflow == "solver_judge":
            from trainer.roles import SolverJudgeWorkflow

            if engine is None:
                raise ValueError("agent.workflow solver_judge needs a model (agent.kind terminal)")
            self.workflow = SolverJudgeWorkflow(self.runner, engine, self.tokenizer)
        if cfg.agent.kind == "harness":
            import tempfile
            from pathlib import Path

            from trainer.harness.rollout import HarnessRollout

            if engine is None:
                raise ValueError("agent.kind harness needs an inference engine")
            base = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="sandgym-gw-"))
            store = base / "gateway" / f"rollout-{worker_index}.sqlite"
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

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> int:
        if self.engine is not None:
            await asyncio.to_thread(self.engine.update_weights, state_dict, version)
        return version

    def stats(self) -> dict[str, Any]:
        return {
            "version": self.engine.version if self.engine else 0,
            "generated_tokens": self.engine.generated_tokens if self.engine else 0,
        }
