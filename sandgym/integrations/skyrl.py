"""SkyRL's door: `SandgymTextEnv`, a `skyrl_gym` `BaseTextEnv` whose episodes are sandgym
episodes, registered as `sandgym` (checked with skyrl-gym 0.4.0:
tests/e2e/test_integration_skyrl.py).

    import skyrl_gym
    import sandgym.integrations.skyrl  # registers "sandgym"

    env = skyrl_gym.make("sandgym", env_config={"server_url": "ws://127.0.0.1:8765/v1/env"},
                         extras={"task_id": "builtin/hello-file", "seed": 0})
    prompt, meta = env.init([{"role": "user", "content": "Solve the task."}])
    out = env.step("<bash>ls /app</bash>")        # out["observations"], out["done"], ...
    out = env.step("<submit/>")                    # out["reward"]: the task's verifier's

SkyRL hands the model's reply text to `step`; the action conventions follow SkyRL's own
environments (tags, like `<search>` and `<sql>`): `<bash>COMMAND</bash>` runs a command in the
task's sandbox, `<submit/>` submits (after the command when a reply has both). A reply with
neither gets a hint and no environment step. At `max_turns` the episode is submitted, so every
episode is scored by the task's verifier; the reward comes only from the server (scoring policy:
sandgym/integrations/episode.py; an infrastructure failure raises `InfrastructureError`, for the trainer
to drop the trajectory, never a 0). `env_config` keys: `server_url`, `token`, `max_turns`
(default 10), `max_output_chars`; `extras` (the dataset row's env extras): `task_id`, `seed`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from sandgym.integrations.episode import SyncEpisode

ENV_ID = "sandgym"
ENTRY_POINT = "sandgym.integrations.skyrl:SandgymTextEnv"
DEFAULT_SERVER_URL = "ws://127.0.0.1:8765/v1/env"

_BASH = re.compile(r"<bash>(.*?)</bash>", re.DOTALL)
_SUBMIT = re.compile(r"<submit\s*/?>", re.IGNORECASE)
NO_ACTION_HINT = (
    "No action found in your reply. Run a command as <bash>COMMAND</bash>, or reply <submit/> "
    "when the task is done."
)


class SandgymTextEnv(BaseTextEnv):
    """One sandgym episode per SkyRL trajectory (`init` starts it, `close` ends it)."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        cfg: Mapping[str, Any] = env_config if env_config is not None else {}
        extras = extras or {}
        if not extras.get("task_id"):
            raise ValueError(
                f"expected extras['task_id'] naming a sandgym task, got keys {sorted(extras)}"
            )
        self.task_id = str(extras["task_id"])
        seed = extras.get("seed")
        self.seed = None if seed is None else int(seed)
        self.max_turns = int(cfg.get("max_turns", 10))
        self.episode = SyncEpisode(
            str(cfg.get("server_url", DEFAULT_SERVER_URL)),
            cfg.get("token"),
            max_output_chars=int(cfg.get("max_output_chars", 4000)),
        )

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        instruction = self.episode.reset(self.task_id, seed=self.seed)
        prompt = [dict(m) for m in prompt]
        if prompt and prompt[-1].get("role") == "user":
            prompt[-1]["content"] = f"{prompt[-1]['content']}\n\n{instruction}"
        else:
            prompt.append({"role": "user", "content": instruction})
        return prompt, {"task_id": self.task_id, "seed": self.seed}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        command = _BASH.search(action)
        submit = bool(_SUBMIT.search(action)) or self.turns >= self.max_turns
        texts = []
        if command is not None:
            res = self.episode.act({"kind": "command", "command": command.group(1).strip()})
            texts.append(self.episode.text(res))
        elif not submit:
            texts.append(NO_ACTION_HINT)
        if submit and self.episode.running:
            self.episode.finish()
        done = not self.episode.running
        reward = self.episode.reward if done and self.episode.reward is not None else 0.0
        if done and self.episode.last is not None:
            texts.append(self.episode.text(self.episode.last))
        info = self.episode.last.info if self.episode.last is not None else {}
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": "user", "content": "\n".join(texts)}],
            reward=float(reward),
            done=done,
            metadata={"task_id": self.task_id, "turns": self.turns, "info": info},
            postprocessed_action=None,
        )

    def close(self) -> None:
        self.episode.close()


def register() -> None:
    """Register `sandgym` with skyrl_gym (idempotent; importing this module does it)."""
    import skyrl_gym

    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=ENTRY_POINT)


register()
