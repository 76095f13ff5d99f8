"""TRL's door: an `environment_factory` for `trl.GRPOTrainer`'s multi-turn tool loop, backed
by sandgym episodes (checked with trl 1.16.0: tests/e2e/test_integration_trl.py).

TRL's contract (trl/trainer/grpo_trainer.py): the factory is called with no argument; the
instance's `reset(**row)` gets each dataset row and returns text appended to the prompt; every
public method is a tool the model may call (TRL builds its schema from the type hints and the
Google-style docstring); `get_reward()` scores the finished rollout and becomes a reward source.

    from trl import GRPOConfig, GRPOTrainer
    from sandgym.integrations.trl import sandgym_environment

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Solve the task."}],
                                  "task_id": "builtin/hello-file", "seed": 0}])
    trainer = GRPOTrainer(model=model, args=GRPOConfig(...), train_dataset=dataset,
                          environment_factory=sandgym_environment("ws://127.0.0.1:8765/v1/env"))

Each rollout is one sandgym episode on the server (its pool, the task's network policy, the
task's own verifier). The reward is the verifier's (see sandgym/integrations/episode.py for what is
scored 0 and what is dropped: `get_reward` returns None for an infrastructure failure, which
TRL leaves out of the reward sum). Token ids never pass through here: TRL keeps the model's
sampled ids and appends tool results as ids of their own (masked out of the loss).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from sandgym.integrations.episode import InfrastructureError, SyncEpisode

log = logging.getLogger(__name__)

DEFAULT_SERVER_URL = "ws://127.0.0.1:8765/v1/env"


class SandgymEnvironment:
    """One sandgym episode per rollout, as TRL's tool-calling environment.

    The server comes from the constructor, else `SANDGYM_SERVER_URL` (and `SANDGYM_TOKEN`), else
    `ws://127.0.0.1:8765/v1/env`; `sandgym_environment(url)` binds one for TRL's no-argument call.
    Dataset rows name the episode: `task_id` (required) and `seed` (optional).
    """

    def __init__(
        self,
        server_url: str | None = None,
        token: str | None = None,
        *,
        max_output_chars: int = 4000,
    ) -> None:
        self._episode = SyncEpisode(
            server_url or os.environ.get("SANDGYM_SERVER_URL", DEFAULT_SERVER_URL),
            token if token is not None else os.environ.get("SANDGYM_TOKEN") or None,
            max_output_chars=max_output_chars,
        )
        #: rewards of the rollouts this instance scored, in order (None: dropped)
        self.rewards: list[float | None] = []

    def reset(self, task_id: str | None = None, seed: int | None = None, **row: Any) -> str:
        """TRL's per-rollout reset: starts an episode of the row's task; returns its instruction
        (TRL appends it to the prompt's last user message)."""
        if not task_id:
            raise ValueError(
                f"expected the dataset row to name a sandgym task in 'task_id', got keys {sorted(row)}"
            )
        return self._episode.reset(task_id, seed=seed)

    def run(self, command: str) -> str:
        """Run a shell command in the task's sandbox (a persistent bash shell).

        Args:
            command: The command line to run, e.g. "ls -la /app".

        Returns:
            The command's output (stdout and stderr) and its exit code.
        """
        return self._episode.text(self._episode.act({"kind": "command", "command": command}))

    def write_file(self, path: str, content: str) -> str:
        """Write a text file in the task's sandbox, replacing it if it exists.

        Args:
            path: Absolute path of the file, e.g. "/app/answer.txt".
            content: The file's full new content.

        Returns:
            A confirmation, or the error.
        """
        action = {"kind": "write_file", "path": path, "content": content}
        return self._episode.text(self._episode.act(action))

    def read_file(self, path: str) -> str:
        """Read a text file from the task's sandbox.

        Args:
            path: Absolute path of the file, e.g. "/app/input.csv".

        Returns:
            The file's content.
        """
        return self._episode.text(self._episode.act({"kind": "read_file", "path": path}))

    def submit(self) -> str:
        """Submit the work: the task's tests check the sandbox and give the reward.

        Returns:
            The result; for a task of several steps, the next step's instruction.
        """
        return self._episode.text(self._episode.act({"kind": "submit"}))

    def get_reward(self) -> float | None:
        """The rollout's reward from the task's verifier (submitting first if the model did not);
        None when the server or the sandbox failed, so TRL leaves the rollout unscored."""
        try:
            reward: float | None = self._episode.finish()
        except InfrastructureError as exc:
            log.warning("rollout of %s dropped: %s", self._episode.task_id, exc)
            reward = None
        self.rewards.append(reward)
        return reward

    @property
    def served_by(self) -> str:
        """The server the rollout runs on (with a fleet address, the one placement chose). A
        property: TRL offers only functions to the model as tools."""
        return self._episode.served_by

    def __enter__(self) -> SandgymEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        """Close the connection (the server ends a running episode). Private on purpose: TRL
        offers every public method to the model as a tool."""
        self._episode.close()


def sandgym_environment(
    server_url: str, token: str | None = None, **kwargs: Any
) -> Callable[[], SandgymEnvironment]:
    """A no-argument factory for `GRPOTrainer(environment_factory=...)` bound to one server."""
    return functools.partial(SandgymEnvironment, server_url, token, **kwargs)
