"""verl's door (sandgym/integrations/verl.py) with the released verl 0.9.1, as far as a CPU goes:
the agent loop is built through verl's own registry (`hydra.utils.instantiate` of
`_agent_loop_registry["sandgym_agent"]`, as verl's AgentLoopWorker does) and its `run` plays a
real sandgym episode (builtin/hello-file, local backend) against a real small model
(SmolLM2-135M-Instruct) behind a server manager with verl's `generate` signature, returning a
correct `AgentLoopOutput`.

vLLM/SGLang servers (verl's own managers) need a GPU; `TransformersServerManager` here samples
with transformers instead and returns verl's `TokenOutput`. It steers the 135M model with a
`sequence_bias` into a ```bash reply that solves the task and then `<submit/>`, and the steered
command is tokenized the way a tokenizer never would (`'H' + 'ello'`): a re-tokenized reply would
change the ids, so the fidelity assertion fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import BackgroundServer
from tests.e2e.conftest import REAL_BACKENDS

pytest.importorskip("verl.experimental.agent_loop.agent_loop")

TASK = "builtin/hello-file"
COMMAND = "printf 'Hello, world!\\n' > /app/hello.txt"


class TransformersServerManager:
    """verl's server-manager interface (`generate(request_id, *, prompt_ids, sampling_params)
    -> TokenOutput`) over a transformers model on CPU, steering turn k towards `replies[k]`."""

    def __init__(self, model: Any, tok: Any, replies: list[list[int]]) -> None:
        self.model, self.tok, self.replies = model, tok, replies
        self.calls: list[dict[str, Any]] = []

    def _sample(self, prompt_ids: list[int], steer: list[int], max_new_tokens: int) -> Any:
        import torch

        torch.manual_seed(len(self.calls))
        bias = [[steer[: k + 1], 40.0 + 5.0 * k] for k in range(len(steer))]
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                do_sample=True,
                temperature=1.0,
                max_new_tokens=max_new_tokens,
                sequence_bias=bias,
                eos_token_id=self.tok.convert_tokens_to_ids("<|im_end|>"),
                pad_token_id=self.tok.pad_token_id,
                return_dict_in_generate=True,
                output_scores=True,
            )
        ids = out.sequences[0, len(prompt_ids) :].tolist()
        logprobs = [
            torch.log_softmax(score[0].float(), dim=-1)[t].item()
            for score, t in zip(out.scores, ids, strict=True)
        ]
        return ids, logprobs

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        steer = self.replies[min(len(self.calls), len(self.replies) - 1)]
        ids, logprobs = await asyncio.to_thread(
            self._sample, list(prompt_ids), steer, int(sampling_params.get("max_new_tokens", 64))
        )
        self.calls.append({"prompt_ids": list(prompt_ids), "ids": ids, "logprobs": logprobs})
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")


def _sandgym_reward(url: str) -> float:
    async def play() -> float:
        async with AsyncEnvClient(url) as env:
            await env.reset(TASK, seed=0)
            await env.step(COMMAND)
            return (await env.step({"kind": "submit"})).reward

    return asyncio.run(play())


# a real model on CPU: ~3 min on a busy 2-core machine; past the suite's 300 s only when overloaded
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", REAL_BACKENDS[:1])
def test_verl_agent_loop_plays_a_sandgym_episode_with_exact_tokens(
    backend: str, make_server: Callable[..., BackgroundServer]
) -> None:
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopOutput,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.utils.dataset.rl_dataset import RLHFDataset

    import sandgym.integrations.verl as door
    from sandgym.trainer.config import ModelSettings
    from sandgym.trainer.models import load_model, load_tokenizer

    srv = make_server(backend)
    tok = load_tokenizer(ModelSettings())
    model = load_model(ModelSettings())
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    command = (
        tok.encode("```bash\nprintf 'H", add_special_tokens=False)
        + tok.encode("ello, world!\\n' > /app/hello.txt\n```", add_special_tokens=False)
        + [im_end]
    )
    assert tok.encode(tok.decode(command), add_special_tokens=False) != command
    submit = tok.encode("<submit/>", add_special_tokens=False) + [im_end]
    manager = TransformersServerManager(model, tok, [command, submit])

    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 1024, "response_length": 512}},
            "data": {},
            "sandgym": {"server_url": srv.url, "max_turns": 4},
        }
    )
    assert _agent_loop_registry[door.AGENT_NAME] == {
        "_target_": "sandgym.integrations.verl.SandgymAgentLoop"
    }

    async def run() -> AgentLoopOutput:
        loop = hydra.utils.instantiate(
            config=_agent_loop_registry[door.AGENT_NAME],
            trainer_config=DictConfigWrap(config=cfg),
            server_manager=manager,
            tokenizer=tok,
            processor=None,
            hf_model_type="llama",
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap([]),
        )
        assert isinstance(loop, door.SandgymAgentLoop)
        return await loop.run(
            {"temperature": 1.0, "max_new_tokens": 64},
            raw_prompt=[{"role": "user", "content": "Solve the task."}],
            extra_info={"task_id": TASK, "seed": 0},
        )

    out = asyncio.run(run())
    assert isinstance(out, AgentLoopOutput)
    assert out.reward_score == 1.0 == _sandgym_reward(srv.url)
    assert [c["ids"] for c in manager.calls] == [command, submit]  # two turns, as steered

    # Token fidelity: the model's tokens in the response are exactly the ids sampled, in order;
    # the environment's turn between them is masked 0 and carries logprob 0.0.
    ids, mask, lps = out.response_ids, out.response_mask, out.response_logprobs
    assert lps is not None and len(ids) == len(mask) == len(lps)
    assert [t for t, m in zip(ids, mask, strict=True) if m == 1] == command + submit
    assert ids[: len(command)] == command and mask[: len(command)] == [1] * len(command)
    assert ids[-len(submit) :] == submit and mask[-len(submit) :] == [1] * len(submit)
    env_part = mask[len(command) : -len(submit)]
    assert env_part and set(env_part) == {0}
    assert "[exit code 0]" in tok.decode(ids[len(command) : -len(submit)])
    sampled_lps = manager.calls[0]["logprobs"] + manager.calls[1]["logprobs"]
    assert [lp for lp, m in zip(lps, mask, strict=True) if m == 1] == sampled_lps
    assert {lp for lp, m in zip(lps, mask, strict=True) if m == 0} == {0.0}
    # the second turn was generated on exactly prompt + first reply + environment turn
    assert manager.calls[1]["prompt_ids"] == out.prompt_ids + ids[: -len(submit)]
    assert "/app/hello.txt" in tok.decode(out.prompt_ids)
    batch = out.as_dict()  # what verl's worker pads into the batch
    assert batch["responses"].tolist() == ids and batch["rm_scores"][-1].item() == 1.0


def test_verl_gpu_script_overrides_compose_with_verls_own_config() -> None:
    """The prepared GPU run (scripts/verl_gpu_check.py) names only keys verl's released trainer
    config has: Hydra composes `ppo_trainer` with every override (a typo fails here, not on the
    GPU machine), and the agent-loop file it writes names this door's class."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(repo / "scripts/verl_gpu_check.py"), "--model", "/m", "--dry-run"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    cmd = json.loads(out)["command"]
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=cmd[3:])
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    loops = OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    assert [(c.name, c._target_) for c in loops] == [
        ("sandgym_agent", "sandgym.integrations.verl.SandgymAgentLoop")
    ]
    assert cfg.sandgym.server_url.startswith("ws://")


class FixedServerManager:
    """verl's server-manager interface answering turn k with `replies[k]` (no model)."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies = replies
        self.calls = 0

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        ids = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


@pytest.mark.parametrize("mode", ["scored", "action_timeout", "killed", "internal"])
def test_verl_door_ends_on_the_one_episode_loop(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The door plays on sandgym.client.episode_loop: what the server scores is the reward, an
    `action_timeout` (the agent's) is 0.0, a killed server or a server fault raises
    `InfrastructureError` (never a 0 the policy is trained on). Against tests/fakes/env_ws.py."""
    import functools

    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import (
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.utils.dataset.rl_dataset import RLHFDataset

    import sandgym.integrations.verl as door
    from sandgym.integrations.episode import InfrastructureError
    from sandgym.trainer.config import ModelSettings
    from sandgym.trainer.models import load_tokenizer
    from tests.fakes.env_ws import FakeEnvServer

    # a client that gives up on a dead server at once (the default retries for seconds)
    monkeypatch.setattr(
        door,
        "AsyncEnvClient",
        functools.partial(AsyncEnvClient, max_reconnects=1, reconnect_backoff_s=0.01),
    )
    tok = load_tokenizer(ModelSettings())
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    command = tok.encode("```bash\necho hi\n```", add_special_tokens=False) + [im_end]
    submit = tok.encode("<submit/>", add_special_tokens=False) + [im_end]

    async def run() -> Any:
        async with FakeEnvServer(mode) as fake:  # type: ignore[arg-type]
            cfg = OmegaConf.create(
                {
                    "actor_rollout_ref": {
                        "rollout": {"prompt_length": 512, "response_length": 256}
                    },
                    "data": {},
                    "sandgym": {"server_url": fake.url, "max_turns": 4},
                }
            )
            loop = hydra.utils.instantiate(
                config=_agent_loop_registry[door.AGENT_NAME],
                trainer_config=DictConfigWrap(config=cfg),
                server_manager=FixedServerManager([command, submit]),
                tokenizer=tok,
                processor=None,
                hf_model_type="llama",
                dataset_cls=RLHFDataset,
                data_config=DictConfigWrap(cfg.data),
                tools=ToolListWrap([]),
            )
            try:
                return await loop.run(
                    {"temperature": 1.0, "max_new_tokens": 16},
                    raw_prompt=[{"role": "user", "content": "Solve the task."}],
                    extra_info={"task_id": "t", "seed": 0},
                )
            except InfrastructureError as exc:
                return exc

    out = asyncio.run(run())
    if mode == "scored":
        assert out.reward_score == 1.0, out
    elif mode == "action_timeout":
        assert out.reward_score == 0.0, out
    else:
        assert isinstance(out, InfrastructureError), f"expected a masked ending, got {out!r}"
