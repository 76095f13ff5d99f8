"""Episodes played by a harness agent inside the sandbox, its model calls served by the gateway.

One episode (`HarnessRunner.run_episode`):

1. a gateway session id `sid`; reset with option `gateway_url` = the gateway's loopback address,
   so the env server bridges `/run/sandgym/gateway.sock` inside the sandbox to it (local and
   docker backends; see `envserver.gateway_bridge`);
2. write the agent script and the instruction into the sandbox, run the agent with one
   `command` action (`OPENAI_BASE_URL=http://gateway/sessions/<sid>/v1`, the socket in
   `SANDGYM_GATEWAY_SOCKET`); the agent's own tool calls run as its subprocesses in the sandbox;
3. `submit`: the verifier's reward;
4. the session's recorded calls become the trajectory's `Step`s (`calls_to_steps`, which refuses
   calls whose tokens do not line up), and the gateway forgets the session.

A harness that made no model call (it crashed at once) gives an episode with no steps, recorded as
termination `error` with the agent's output, so the trainer masks it.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from trainer.engines.base import SamplingParams
from trainer.episode import Episode, Trajectory
from trainer.gateway import GatewayError, ModelGateway, calls_to_steps
from trainer.rollout import _as_dict, classify_failure

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
        sid = self.gateway.new_session()
        episode = Episode(task_id=task_id, seed=seed, group_id=group_id)
        traj = Trajectory(role="agent")
        episode.trajectories.append(traj)
        t0 = time.monotonic()
        try:
            async with self.client_factory() as client:
                episode.server_url = str(getattr(client, "url", "") or "")
                obs, _info = await client.reset(
                    task_id, seed=seed, options={"gateway_url": self.gateway_root}
                )
                episode.instruction = str(_as_dict(obs).get("output") or "")
                script = AGENT_SCRIPT.read_text(encoding="utf-8")
                await client.step({"kind": "write_file", "path": AGENT_PATH, "content": script})
                await client.step(
                    {"kind": "write_file", "path": TASK_PATH, "content": episode.instruction}
                )
                run = await client.step(
                    {
                        "kind": "command",
                        "command": self.agent_command(sid, params),
                        "timeout_s": self.agent_timeout_s,
                    }
                )
                run_obs = _as_dict(run.observation)
                episode.metrics["agent_exit_code"] = float(run_obs.get("exit_code") or 0)
                res = await client.step({"kind": "submit"})
                traj.reward = float(res.reward)
                episode.termination = "submitted" if res.terminated else "env_truncated"
            calls = self.gateway.consume(sid)
            if not calls:
                raise GatewayError(
                    "the harness made no model call; its output: "
                    + str(run_obs.get("output", ""))[-400:]
                )
            traj.steps = calls_to_steps(calls)
            if traj.steps:
                traj.steps[-1].reward = traj.reward
                traj.steps[-1].done = True
        except Exception as exc:  # recorded, never raised (as EpisodeRunner does)
            self.gateway.consume(sid)
            episode.termination = classify_failure(exc)  # type: ignore[assignment]
            episode.error = f"{type(exc).__name__}: {exc}"[:800]
            traj.reward = 0.0
        episode.metrics.update(
            {
                "duration_s": time.monotonic() - t0,
                "turns": float(len(traj.steps)),
                "generated_tokens": float(traj.num_generated_tokens),
            }
        )
        return episode
