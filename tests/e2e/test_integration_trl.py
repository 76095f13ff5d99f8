"""TRL's door (sandgym/integrations/trl.py) with the released trl (the `trl` extra): a real
`GRPOTrainer` run of two steps on CPU with SmolLM2-135M-Instruct, whose rollouts are sandgym
episodes of a catalog task on the local backend.

SmolLM2 speaks ChatML but its own template knows no tools, so its tokenizer gets TRL's copy of
Qwen2.5's ChatML template (which does). A 135M model does not call tools by itself: a
`sequence_bias` in the generation kwargs steers it into one `run` call that solves
builtin/hello-file, so the tool loop really runs a command in the sandbox and the verifier
really scores it. The steered call is tokenized on purpose the way a tokenizer never would
(`'H' + 'ello'`): if anything between sampling and the loss re-tokenized the reply, the ids
trained on would differ from the ids sampled, and the fidelity assertion fails.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import BackgroundServer
from tests.e2e.conftest import REAL_BACKENDS

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

TASK = "builtin/hello-file"
COMMAND = "printf 'Hello, world!\\n' > /app/hello.txt"


def _steered_call_ids(tok) -> list[int]:  # type: ignore[no-untyped-def]
    """The ids of a `run` tool call that solves the task, cut non-canonically at 'H|ello'."""
    head = '<tool_call>\n{"name": "run", "arguments": {"command": "printf \'H'
    tail = "ello, world!\\n' > /app/hello.txt\"}}\n</tool_call>"
    ids = tok.encode(head, add_special_tokens=False) + tok.encode(tail, add_special_tokens=False)
    ids.append(tok.convert_tokens_to_ids("<|im_end|>"))
    assert (
        tok.encode(tok.decode(ids), add_special_tokens=False) != ids
    )  # re-tokenizing changes them
    return ids


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
def test_grpo_trainer_runs_sandgym_episodes_with_exact_tokens(
    backend: str, make_server: Callable[..., BackgroundServer], tmp_path
) -> None:  # type: ignore[no-untyped-def]
    from trl.chat_template_utils import qwen2_5_chat_template

    from sandgym.integrations.trl import SandgymEnvironment, sandgym_environment
    from sandgym.trainer.config import ModelSettings
    from sandgym.trainer.models import load_model, load_tokenizer

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    srv = make_server(backend)
    tok = load_tokenizer(ModelSettings())  # SmolLM2-135M-Instruct, as sandgym's trainer loads it
    tok.chat_template = qwen2_5_chat_template
    model = load_model(ModelSettings())
    # Its weights are dequantised tensors, but the GGUF load leaves the flag set, and the HF Trainer
    # refuses a "quantized" model; transformers' own dequantize() clears it the same way.
    model.is_quantized = False
    call = _steered_call_ids(tok)
    # each token of the call gets a bias once the tokens before it match (growing, so the
    # longest matching prefix wins over a restart)
    bias = [[call[: k + 1], 40.0 + 5.0 * k] for k in range(len(call))]

    system = "You act in a Linux sandbox through tools. Call `run` with a shell command."
    rows = [
        {
            "prompt": [
                {"role": "system", "content": system},
                {"role": "user", "content": "Solve this task:"},
            ],
            "task_id": TASK,
            "seed": 0,
        }
    ] * 2
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=192,
        max_tool_calling_iterations=1,
        learning_rate=1e-6,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        generation_kwargs={"sequence_bias": bias},
        seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tok,
        environment_factory=sandgym_environment(srv.url),
    )

    sampled: list[list[list[int]]] = []  # per generation call: the ids it returned
    trained: list[dict] = []  # per batch: what the loss reads
    generate, score = trainer._generate_single_turn, trainer._generate_and_score_completions

    def record_generate(*a, **kw):  # type: ignore[no-untyped-def]
        ids, logprobs = generate(*a, **kw)
        sampled.append([list(x) for x in ids])
        return ids, logprobs

    def record_score(*a, **kw):  # type: ignore[no-untyped-def]
        out = score(*a, **kw)
        trained.append(
            {k: out[k].tolist() for k in ("completion_ids", "completion_mask", "tool_mask")}
        )
        return out

    trainer._generate_single_turn = record_generate
    trainer._generate_and_score_completions = record_score
    trainer.train()

    envs = trainer._environment_pool[None]
    assert all(isinstance(e, SandgymEnvironment) for e in envs)
    rewards = [r for e in envs for r in e.rewards]
    # 2 steps x 2 rollouts, each one sandgym episode scored by the verifier
    assert len(rewards) == 4
    assert rewards == [_sandgym_reward(srv.url)] * 4 == [1.0] * 4
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert [h["reward"] for h in logged] == [1.0, 1.0]

    # Token fidelity: per rollout, the ids trained on (mask 1) are exactly the ids sampled, in
    # order, the tool result between them masked 0.
    # per step: the first turn's generation, then the post-tool turn's
    assert len(trained) == 2 and len(sampled) == 4
    for step, batch in enumerate(trained):
        first, post = sampled[2 * step], sampled[2 * step + 1]
        assert len(batch["completion_ids"]) == len(first) == len(post) == 2  # 2 rollouts a step
        for i, (ids, cmask, tmask) in enumerate(
            zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"], strict=True)
        ):
            assert first[i] == call  # the steered call, as sampled
            n = sum(cmask)
            ids, tmask = ids[:n], tmask[:n]
            model_ids = [t for t, m in zip(ids, tmask, strict=True) if m == 1]
            assert model_ids == first[i] + post[i]
            assert ids[: len(call)] == call and tmask[: len(call)] == [1] * len(call)
            assert 0 in tmask  # the tool's output came back and is not trained on
