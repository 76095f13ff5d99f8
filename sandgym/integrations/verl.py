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

Scores: the reward is the task's verifier's (`reward_score`), submitted at `max_turns` if the
model did not submit. An infrastructure failure (the server, the sandbox, the connection) raises
`InfrastructureError` instead of returning a score, so it is never a 0 the policy is trained
on; `action_timeout` and `verifier_error` end the episode scored 0, as in sandgym/trainer/failures.py.
The model's reply is read with sandgym's own agent conventions (sandgym/trainer/agents.py: a ```bash
block or a JSON/<tool_call> command, `<submit/>`), told in its system prompt.
"""

from __future__ import annotations

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
from sandgym.integrations.episode import POLICY_ERROR_CODES, InfrastructureError
from sandgym.trainer.agents import DEFAULT_SYSTEM_PROMPT, NO_ACTION_HINT, parse_action
from sandgym.wire.codes import AGENT_CAUSABLE_CODES

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

    async def _step(self, env: AsyncEnvClient, action: dict[str, Any]) -> StepResult | str:
        """One environment step; a refused action comes back as text for the model."""
        try:
            return await env.step(action)
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
        async with AsyncEnvClient(self.server_url, self.token) as env:
            try:
                return await self._play(
                    env, task_id, seed, sampling_params, request_id, metrics, kwargs
                )
            except EnvError as exc:  # _play scores what the agent can cause; the rest is infra
                raise InfrastructureError(exc) from exc

    async def _play(
        self,
        env: AsyncEnvClient,
        task_id: str,
        seed: int | None,
        sampling_params: dict[str, Any],
        request_id: str,
        metrics: dict[str, float],
        kwargs: dict[str, Any],
    ) -> AgentLoopOutput:
        obs, _info = await env.reset(task_id, seed=seed)
        messages = [dict(m) for m in kwargs.get("raw_prompt") or []]
        if not messages or messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        instruction = str(obs.get("output", ""))
        if messages[-1].get("role") == "user":
            messages[-1]["content"] = f"{messages[-1]['content']}\n\n{instruction}"
        else:
            messages.append({"role": "user", "content": instruction})

        prompt_ids = await self.ct_build_initial_tokens(messages)
        runtime = list(prompt_ids)
        mask: list[int] = []
        logprobs: list[float] | None = None
        reward: float | None = None
        turns = 0
        sampled: list[list[int]] = []
        while reward is None:
            turns += 1
            t0 = time.perf_counter()
            out = await self.server_manager.generate(
                request_id=request_id, prompt_ids=runtime, sampling_params=sampling_params
            )
            metrics["generate_sequences"] += time.perf_counter() - t0
            sampled.append(list(out.token_ids))
            if logprobs is None and out.log_probs:
                logprobs = []
            merged, mask, new_lp = await self.ct_merge_assistant_token(
                runtime,
                out.token_ids,
                mask,
                logprobs,
                assistant_logprobs=out.log_probs if out.log_probs else None,
            )
            runtime = merged.token_ids
            if new_lp is not None:
                logprobs = new_lp
            # verl annotates the attribute as the AutoTokenizer class; it holds a tokenizer
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)  # type: ignore[attr-defined]
            parsed = parse_action(text)
            last_turn = turns >= self.max_turns or len(mask) >= self.response_length
            t1 = time.perf_counter()
            feedback: list[str] = []
            try:
                if parsed.action is not None:
                    res = await self._step(env, parsed.action)
                    if isinstance(res, str):
                        feedback.append(res)
                    else:
                        feedback.append(_observation_text(res, self.max_output_chars))
                        if res.terminated or res.truncated:
                            reward = float(res.reward)
                if reward is None and (parsed.submit or last_turn):
                    while reward is None:  # a multi-step task scores each remaining step
                        res = await env.step({"kind": "submit"})
                        if res.terminated or res.truncated:
                            reward = float(res.reward)
                        else:
                            feedback.append(_observation_text(res, self.max_output_chars))
                            if not last_turn and not parsed.submit:
                                break
                if reward is None and parsed.action is None and not parsed.submit:
                    feedback.append(NO_ACTION_HINT)
            except EnvError as exc:
                if exc.code in AGENT_CAUSABLE_CODES and not isinstance(exc, ConnectionLostError):
                    reward = 0.0  # the agent can cause it: scored 0 (sandgym/trainer/failures.py)
                else:
                    raise
            metrics["tool_calls"] += time.perf_counter() - t1
            if reward is not None or last_turn:
                break
            previous = messages + [{"role": "assistant", "content": text}]
            messages = previous + [{"role": "user", "content": "\n".join(feedback)}]
            merged, mask, new_lp = await self.ct_merge_context_msg(
                previous, messages, runtime, mask, logprobs
            )
            runtime = merged.token_ids
            if new_lp is not None:
                logprobs = new_lp
            if len(mask) >= self.response_length:
                break
        while reward is None:  # cut by response_length: score what the policy left
            try:
                res = await env.step({"kind": "submit"})
            except EnvError as exc:
                if exc.code in AGENT_CAUSABLE_CODES and not isinstance(exc, ConnectionLostError):
                    reward = 0.0
                    break
                raise
            if res.terminated or res.truncated:
                reward = float(res.reward)

        n = len(mask)
        response_ids = runtime[len(runtime) - n :] if n else []
        return AgentLoopOutput(
            prompt_ids=runtime[: len(runtime) - n],
            response_ids=response_ids[: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            reward_score=reward,
            num_turns=2 * turns,
            metrics=AgentLoopMetrics(**metrics),
            extra_fields={
                "task_id": task_id,
                "seed": seed,
                "sampled_ids": sampled,
                "turn_scores": [],
                "tool_rewards": [],
            },
        )
