"""The trainer and a tampered episode (docs/verification.md): the submit's `info.tamper` is kept on
the episode; `env.tampered = zero` scores it 0, `keep` keeps its reward; either way it is flagged
and stays a scored episode of its group, never an infrastructure failure. `env.verify` goes out
as the reset's `options.verify`."""

from __future__ import annotations

from typing import Any

import pytest

from sandgym.trainer.agents import NoopAgent
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.rollout import EpisodeRunner
from tests.unit.test_episode_runner import ScriptedClient, _res

TAMPERED = {
    "checked": True,
    "tampered": True,
    "paths": [{"path": "/usr/local/bin/pytest", "change": "created", "category": "executables"}],
    "count": 1,
}


class _Recording(ScriptedClient):
    def __init__(self, replies: list[Any]) -> None:
        super().__init__(replies)
        self.options: Any = None

    async def reset(self, task_id: str, seed: int | None = None, options: Any = None) -> Any:
        self.options = options
        return await super().reset(task_id, seed, options)


def _runner(client: ScriptedClient, **env: Any) -> EpisodeRunner:
    cfg = TrainConfig.model_validate(
        {
            "env": {"task_ids": ["t"], "server_urls": ["ws://x/v1/env"], **env},
            "model": {"source": "tiny"},
        }
    )
    return EpisodeRunner(cfg, None, NoopAgent(), client_factory=lambda url: client)


@pytest.mark.parametrize(("policy", "reward"), [("zero", 0.0), ("keep", 1.0)])
async def test_a_tampered_episode_is_scored_per_policy_never_masked(
    policy: str, reward: float
) -> None:
    client = _Recording([_res(1.0, terminated=True, info={"tamper": TAMPERED})])
    ep = await _runner(client, tampered=policy, verify="refuse-tampered").run_episode("t", 0)
    assert ep.reward == reward
    assert ep.tamper == TAMPERED and ep.metrics["tampered"] == 1.0
    assert ep.termination == "submitted" and not ep.is_infra_failure
    assert client.options == {"verify": "refuse-tampered"}
    assert ep.to_dict(with_tokens=False)["tamper"] == TAMPERED  # in the episode record


async def test_a_clean_report_changes_nothing() -> None:
    clean = {"checked": True, "tampered": False, "paths": [], "count": 0}
    client = _Recording([_res(1.0, terminated=True, info={"tamper": clean})])
    ep = await _runner(client).run_episode("t", 0)
    assert ep.reward == 1.0 and "tampered" not in ep.metrics and ep.tamper == clean
    # the trainer's default mode (docs/verification.md, 'The default of sandgym train')
    assert client.options == {"verify": "refuse-tampered"}
    client = _Recording([_res(1.0, terminated=True, info={"tamper": clean})])
    await _runner(client, verify=None).run_episode("t", 0)
    assert not client.options  # none asked: the server's or the task's choice
