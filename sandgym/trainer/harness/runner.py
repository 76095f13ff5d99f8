"""Episodes played by a harness agent inside the sandbox, its model calls served by the gateway.

One episode (`HarnessRunner.run_episode`):

1. a gateway session id `sid`; reset with option `gateway_url` = the gateway's loopback address,
   so the env server bridges `/run/sandgym/gateway.sock` inside the sandbox to it (local and
   docker backends; see `sandgym.server.gateway_bridge`);
2. write the agent script and the instruction into the sandbox, run the agent with one
   `command` action (`OPENAI_BASE_URL=http://gateway/sessions/<sid>/v1`, the socket in
   `SANDGYM_GATEWAY_SOCKET`); the agent's own tool calls run as its subprocesses in the sandbox;
3. `submit` (to the end: once per step left of a multi-step task): the verifier's reward;
4. the session's recorded calls become the trajectory's `Step`s (`calls_to_steps`, which refuses
   calls whose tokens do not line up), and the gateway forgets the session.

The loop, its submits and its failure classification are the one episode loop's
(`sandgym.trainer.episode_runner`). A harness that made no model call (it crashed at once) gives an episode
with no steps, recorded as termination `error` with the agent's output, so the trainer masks it.
A model call the engine failed on (the gateway answered 400 or 503) ends the episode by that
failure's cause before any submit: `policy_output` for a prompt the policy made too long (its
group dropped), `engine` for the engine's own failure (masked); the verifier is not asked.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from sandgym.trainer.engines.base import SamplingParams
from sandgym.trainer.episode import Episode
from sandgym.trainer.episode_runner import Ending, EpisodeSession, as_dict, run_episode
from sandgym.trainer.gateway import GatewayError, ModelGateway, calls_to_steps

AGENT_SCRIPT = Path(__file__).with_name("react_agent.py")
AGENT_PATH = "/tmp/sandgym_react_agent.py"
TASK_PATH = "/tmp/sandgym_task.md"


class HarnessRunner:
    """Plays episodes with the ReAct harness against env servers, through a gateway."""

    def __init__(
        self,
        gateway: ModelGateway,
        gateway_root: str,
        client_factory: Any,
        *,
        max_turns: int = 6,
        max_tokens: int = 128,
        temperature: float | None = None,
        agent_timeout_s: float = 600.0,
        command_timeout_s: float | None = None,
        python: str = "python3",
    ) -> None:
        self.gateway = gateway
        self.gateway_root = gateway_root
        self.client_factory = client_factory
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.agent_timeout_s = agent_timeout_s
        self.command_timeout_s = command_timeout_s
        self.python = python

    def agent_command(self, sid: str, params: SamplingParams | None = None) -> str:
        """The shell command that runs the agent; `params` (temperature, max_new_tokens)
        override the runner's own (greedy evaluation episodes of a training run)."""
        env = {
            "OPENAI_BASE_URL": f"http://gateway/sessions/{sid}/v1",
            "SANDGYM_GATEWAY_SOCKET": "/run/sandgym/gateway.sock",
        }
        argv = [self.python, AGENT_PATH, "--task", TASK_PATH, "--max-turns", str(self.max_turns)]
        max_tokens = params.max_new_tokens if params is not None else self.max_tokens
        temperature = params.temperature if params is not None else self.temperature
        argv += ["--max-tokens", str(max_tokens)]
        if temperature is not None:
            argv += ["--temperature", str(temperature)]
        if self.command_timeout_s is not None:
            argv += ["--command-timeout-s", str(self.command_timeout_s)]
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"{prefix} {' '.join(shlex.quote(a) for a in argv)}"

    async def run_episode(
        self,
        task_id: str,
        seed: int | None,
        group_id: str = "",
        params: SamplingParams | None = None,
    ) -> Episode:
        """One episode through the one episode loop (`sandgym.trainer.episode_runner`)."""
        sid = self.gateway.new_session()
        episode = Episode(task_id=task_id, seed=seed, group_id=group_id)
        agent_output = ""

        async def play(session: EpisodeSession) -> Ending:
            nonlocal agent_output
            script = AGENT_SCRIPT.read_text(encoding="utf-8")
            # set-up steps are not the trajectory: its steps are the recorded model calls
            await session.step(
                {"kind": "write_file", "path": AGENT_PATH, "content": script}, record=False
            )
            await session.step(
                {"kind": "write_file", "path": TASK_PATH, "content": episode.instruction},
                record=False,
            )
            run = await session.step(
                {
                    "kind": "command",
                    "command": self.agent_command(sid, params),
                    "timeout_s": self.agent_timeout_s,
                },
                record=False,
            )
            run_obs = as_dict(run.observation)
            agent_output = str(run_obs.get("output", ""))
            episode.metrics["agent_exit_code"] = float(run_obs.get("exit_code") or 0)
            failure = self.gateway.failure(sid)
            if failure is not None:
                # a model call failed: the episode ends by that failure's cause (the policy's
                # over-long prompt: its group dropped; the engine's: masked), not by a verifier
                # scoring what the agent left after an error the policy did not choose
                raise failure
            return "submitted"

        async def finish(ep: Episode) -> None:
            traj = ep.trajectories[0]
            calls = self.gateway.consume(sid)
            traj.steps = calls_to_steps(calls) if calls else []
            if not calls:
                raise GatewayError(
                    "the harness made no model call; its output: " + agent_output[-400:]
                )
            if traj.steps:
                traj.steps[-1].reward = traj.reward
                traj.steps[-1].done = True

        try:
            return await run_episode(
                self.client_factory,
                episode,
                play,
                reset_options={"gateway_url": self.gateway_root},
                finish=finish,
                max_error_chars=800,
            )
        finally:
            self.gateway.consume(sid)  # forget what a failed episode left (none after finish)
