"""verl's door: `SandgymAgentLoop`, a verl `AgentLoopBase` registered as `sandgym_agent`, whose
`run(sampling_params, **kwargs)` plays one sandgym episode through verl's server manager
(checked with verl 0.9.1 on CPU: tests/e2e/test_integration_verl.py; see docs/integrations.md).

    # agent_loops.yaml, named by actor_rollout_ref.rollout.agent.agent_loop_config_path:
    #   - name: sandgym_agent
    #     _target_: sandgym.integrations.verl.SandgymAgentLoop
    # rows: agent_name "sandgym_agent", extra_info {task_id, seed}; server: +sandgym.server_url
    # (+sandgym.token, +sandgym.max_turns) or SANDGYM_SERVER_URL / SANDGYM_TOKEN.
    # scripts/verl_gpu_check.py writes both and the verl.trainer.main_ppo command.

Token fidelity: the model's tokens are the ids the server manager returned (`TokenOutput.
token_ids`), appended as they are with verl's own continuous-token helpers
(`ct_merge_assistant_token`); only the environment's observations are rendered by the chat
template between turns (`ct_merge_context_msg`). `response_mask` is 1 on model tokens, 0 on
environment tokens; `response_logprobs` are the engine's, 0.0 on environment tokens. Nothing is
ever decoded and re-encoded: a reply is decoded only to read its action.

Scores: the episode runs on the one episode loop (`sandgym.client.episode_loop.play_episode`:
reset, the model's turns, the closing submits, one classification of the ending). The reward is
the task's verifier's (`reward_score`), submitted at `max_turns` if the model did not submit. A
failure the agent can cause (the error-code table's, `sandgym.wire.codes`) ends the episode
scored 0; any other (the server, the sandbox, the connection) raises `InfrastructureError`
instead of returning a score, so it is never a 0 the policy is trained on.
The model's reply is read with sandgym's own agent conventions (sandgym/trainer/agents.py: a ```bash
block or a JSON/<tool_call> command, `<submit/>`), told in its system prompt.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from sandgym.client.env_client import AsyncEnvClient, ConnectionLostError, EnvError, StepResult
from sandgym.client.episode_loop import LoopSession, play_episode
from sandgym.integrations.episode import POLICY_ERROR_CODES, InfrastructureError
from sandgym.trainer.agents import DEFAULT_SYSTEM_PROMPT, NO_ACTION_HINT, parse_action

AGENT_NAME = "sandgym_agent"
DEFAULT_SERVER_URL = "ws://127.0.0.1:8765/v1/env"


def _observation_text(res: StepResult, max_chars: int) -> str:
    out = str(res.observation.get("output", ""))
    if len(out) > max_chars:
        out = "[...]" + out[-max_chars:]
    code = res.observation.get("exit_code")
    return out if code is None else f"{out}\n[exit code {code}]"


@register(AGENT_NAME)
class SandgymAgentLoop(AgentLoopBase):
    """One sandgym episode per trajectory, the model served by verl's server manager."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.config.get("sandgym", None) or {}
        self.server_url = str(
            cfg.get("server_url") or os.environ.get("SANDGYM_SERVER_URL", DEFAULT_SERVER_URL)
        )
        self.token = cfg.get("token") or os.environ.get("SANDGYM_TOKEN") or None
        self.max_turns = int(cfg.get("max_turns", 8))
        self.max_output_chars = int(cfg.get("max_output_chars", 4000))
        self.system_prompt = str(cfg.get("system_prompt", DEFAULT_SYSTEM_PROMPT))
        self.response_length = int(self.rollout_config.response_length)

    async def _step(self, session: LoopSession, action: dict[str, Any]) -> StepResult | str:
        """One environment step; a refused action comes back as text for the model."""
        try:
            return await session.step(action)
        except EnvError as exc:
            if exc.code in POLICY_ERROR_CODES and not isinstance(exc, ConnectionLostError):
                return f"[sandgym: action refused: {exc.message}]"
            raise

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra = dict(kwargs.get("extra_info") or {})
        task_id = kwargs.get("task_id") or extra.get("task_id")
        if not task_id:
            raise ValueError(
                f"expected the row to name a sandgym task (extra_info.task_id), got {sorted(kwargs)}"
            )
        seed = kwargs.get("seed", extra.get("seed"))
        seed = None if seed is None else int(seed)
        metrics: dict[str, float] = {"generate_sequences": 0.0, "tool_calls": 0.0}
        request_id = uuid4().hex
        traj = _Trajectory()
        turns = functools.partial(self._turns, traj, sampling_params, request_id, metrics, kwargs)
        async with AsyncEnvClient(self.server_url, self.token) as env:
            end = await play_episode(env, task_id, turns, seed=seed)
        if end.outcome == "masked":  # the server, the sandbox or the connection: never a score
            error = end.error
            if not isinstance(error, EnvError):
                error = ConnectionLostError("internal", f"{type(error).__name__}: {error}")
            raise InfrastructureError(error) from end.error
        assert end.reward is not None
        return traj.output(end.reward, task_id, seed, self.response_length, metrics)

    async def _turns(
        self,
        traj: _Trajectory,
        sampling_params: dict[str, Any],
        request_id: str,
        metrics: dict[str, float],
        kwargs: dict[str, Any],
        session: LoopSession,
    ) -> str:
        """The model's turns of one episode (the loop's `play`): generate, act through
        `session.step`, render the observation back; returns when the episode ended, the model
        submitted, or its turns or response length ran out (the loop then submits)."""
        messages = [dict(m) for m in kwargs.get("raw_prompt") or []]
        if not messages or messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        instruction = str(session.observation.get("output", ""))
        if messages[-1].get("role") == "user":
            messages[-1]["content"] = f"{messages[-1]['content']}\n\n{instruction}"
        else:
            messages.append({"role": "user", "content": instruction})

        traj.runtime = list(await self.ct_build_initial_tokens(messages))
        while True:
            traj.turns += 1
            t0 = time.perf_counter()
            out = await self.server_manager.generate(
                request_id=request_id, prompt_ids=traj.runtime, sampling_params=sampling_params
            )
            metrics["generate_sequences"] += time.perf_counter() - t0
            traj.sampled.append(list(out.token_ids))
            if traj.logprobs is None and out.log_probs:
                traj.logprobs = []
            merged, traj.mask, new_lp = await self.ct_merge_assistant_token(
                traj.runtime,
                out.token_ids,
                traj.mask,
                traj.logprobs,
                assistant_logprobs=out.log_probs if out.log_probs else None,
            )
            traj.runtime = merged.token_ids
            if new_lp is not None:
                traj.logprobs = new_lp
            # verl annotates the attribute as the AutoTokenizer class; it holds a tokenizer
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)  # type: ignore[attr-defined]
            parsed = parse_action(text)
            last_turn = traj.turns >= self.max_turns or len(traj.mask) >= self.response_length
            t1 = time.perf_counter()
            feedback: list[str] = []
            if parsed.action is not None:
                res = await self._step(session, parsed.action)
                feedback.append(
                    res if isinstance(res, str) else _observation_text(res, self.max_output_chars)
                )
            if not session.ended and (parsed.submit or last_turn):
                while not session.ended:  # a multi-step task scores each remaining step
                    res = await session.step({"kind": "submit"})
                    if not session.ended:
                        feedback.append(_observation_text(res, self.max_output_chars))
                        if not last_turn and not parsed.submit:
                            break
            if not session.ended and parsed.action is None and not parsed.submit:
                feedback.append(NO_ACTION_HINT)
            metrics["tool_calls"] += time.perf_counter() - t1
            if session.ended or last_turn:
                return "ended" if session.ended else "turn_limit"
            previous = messages + [{"role": "assistant", "content": text}]
            messages = previous + [{"role": "user", "content": "\n".join(feedback)}]
            merged, traj.mask, new_lp = await self.ct_merge_context_msg(
                previous, messages, traj.runtime, traj.mask, traj.logprobs
            )
            traj.runtime = merged.token_ids
            if new_lp is not None:
                traj.logprobs = new_lp
            if len(traj.mask) >= self.response_length:
                return "response_length"  # cut: the loop scores what the policy left


class _Trajectory:
    """The token record of one episode as verl wants it: the running ids, the response mask
    (1 on model tokens), the engine's logprobs, the ids sampled per turn."""

    def __init__(self) -> None:
        self.runtime: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] | None = None
        self.turns = 0
        self.sampled: list[list[int]] = []

    def output(
        self,
        reward: float,
        task_id: str,
        seed: int | None,
        response_length: int,
        metrics: dict[str, float],
    ) -> AgentLoopOutput:
        n = len(self.mask)
        response_ids = self.runtime[len(self.runtime) - n :] if n else []
        return AgentLoopOutput(
            prompt_ids=self.runtime[: len(self.runtime) - n],
            response_ids=response_ids[:response_length],
            response_mask=self.mask[:response_length],
            response_logprobs=self.logprobs[:response_length] if self.logprobs else None,
            reward_score=reward,
            num_turns=2 * self.turns,
            metrics=AgentLoopMetrics(**metrics),
            extra_fields={
                "task_id": task_id,
                "seed": seed,
                "sampled_ids": self.sampled,
                "turn_scores": [],
                "tool_rewards": [],
            },
        )
