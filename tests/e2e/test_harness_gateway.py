"""A harness agent (sandgym/trainer/harness/react_agent.py) inside a local-backend sandbox, its model
served by the gateway through the unix-socket bridge; the sandbox's network stays off.

The first test drives it with a scripted engine (a test double for the *model* only: it returns
a fixed correct tool call; the sandbox, the bridge, the gateway and the verifier are real). The
second runs the real tiny model and checks the recorded calls become Steps whose token ids are
exactly what the engine generated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.sandboxes import SandboxBackend, SandboxSpec, get_backend
from sandgym.sandboxes.network import PUBLIC
from sandgym.server.runner import BackgroundServer
from sandgym.trainer.config import ModelSettings
from sandgym.trainer.engines.base import Generation, InferenceEngine, SamplingParams
from sandgym.trainer.gateway import CallStore, GatewayServer, ModelGateway
from sandgym.trainer.harness import HarnessRunner
from sandgym.trainer.models import load_tokenizer
from tests.e2e.conftest import local_available
from tests.netprobe import Banner

pytestmark = pytest.mark.skipif(not local_available(), reason="bwrap missing")

SOLVE = (
    '<tool_call>{"name": "bash", "arguments": {"command": '
    "\"printf 'Hello, world!\\\\n' > /app/hello.txt && cat /app/hello.txt\"}}</tool_call>"
)


class ScriptedEngine(InferenceEngine):
    """Test double for the model: replies in order (+ end token), logprob -0.5 per token."""

    def __init__(self, tok: Any, replies: list[str]) -> None:
        super().__init__(batch_wait_s=0.0)
        self.tok, self.replies = tok, list(replies)
        self.prompts: list[list[int]] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            ids = self.tok(self.replies.pop(0), add_special_tokens=False)["input_ids"]
            ids.append(self.tok.eos_token_id)
            out.append(Generation(ids, [-0.5] * len(ids), "stop"))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class RecordingEngine(InferenceEngine):
    """Wraps a real engine and keeps every (prompt, generation) it produced."""

    def __init__(self, inner: InferenceEngine) -> None:
        super().__init__(batch_wait_s=0.0)
        self.inner = inner
        self.seen: list[tuple[list[int], Generation]] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        gens = self.inner.generate(prompts, params)
        self.seen += [(list(p), g) for p, g in zip(prompts, gens, strict=True)]
        return gens

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)


async def assert_public_sandbox_reaches(
    backend: SandboxBackend, banner: Banner, spec: SandboxSpec
) -> None:
    """The control of a no-network probe: the same probe from a public sandbox gets through."""
    sb = await backend.create(spec.model_copy(update={"network": PUBLIC}))
    try:
        res = await sb.exec(banner.probe(), timeout_s=30)
        assert (res.exit_code, res.stdout.strip()) == (0, banner.token), res
    finally:
        await sb.close()
        await backend.aclose()


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(ModelSettings(source="tiny"))


async def test_harness_in_sandbox_solves_hello_file_through_the_gateway(
    make_server: Callable[..., BackgroundServer], tok: Any, tmp_path: Path
) -> None:
    srv = make_server("local")
    # The no-network probe: a listener on this machine's loopback, which a public local sandbox
    # reaches (checked below), so the probe can fail only for want of a network.
    banner = Banner("127.0.0.1")
    check = f"```bash\n{banner.probe()}\n```"
    engine = ScriptedEngine(tok, [SOLVE, check, '<tool_call>{"name": "submit"}</tool_call>'])
    gw = ModelGateway([engine], tok, CallStore(tmp_path / "gateway.sqlite"))
    with banner:
        async with GatewayServer(gw) as gsrv:
            runner = HarnessRunner(gw, gsrv.root, lambda: AsyncEnvClient(srv.url), max_turns=5)
            ep = await runner.run_episode("builtin/hello-file", 0)
        assert banner.accepted == 0
        await assert_public_sandbox_reaches(get_backend("local"), banner, SandboxSpec())
    assert ep.error is None, ep.error
    assert ep.termination == "submitted" and ep.reward == 1.0
    steps = ep.trajectories[0].steps
    assert len(steps) == 3
    # the prompts the engine saw are the recorded ones; each extends the previous turn
    assert [s.prompt_ids for s in steps] == engine.prompts
    for prev, cur in zip(steps, steps[1:], strict=False):
        head = prev.prompt_ids + prev.response_ids
        assert cur.prompt_ids[: len(head)] == head
    # the agent saw its command's output, and the sandbox could not reach the network
    second_obs = tok.decode(steps[1].prompt_ids[len(steps[0].prompt_ids) :])
    assert "Hello, world!" in second_obs
    third_obs = tok.decode(steps[2].prompt_ids[len(steps[1].prompt_ids) :])
    probe_result = third_obs.split("[bash result]")[-1]
    assert "[exit code 0]" not in probe_result and banner.token not in probe_result
    assert gw.store.calls(gw.new_session()) == [] and not gw._sessions  # consumed


async def test_bridge_refuses_a_non_loopback_target(
    make_server: Callable[..., BackgroundServer],
) -> None:
    srv = make_server("local")
    async with AsyncEnvClient(srv.url) as client:
        with pytest.raises(EnvError) as info:
            await client.reset("builtin/hello-file", options={"gateway_url": "http://10.0.0.1:80"})
        assert info.value.code == "invalid_message" and "loopback" in info.value.message
        # the connection stays usable, and a reset without the option has no socket
        _obs, reset_info = await client.reset("builtin/hello-file")
        assert "gateway_socket" not in reset_info


async def test_real_tiny_model_calls_convert_to_matching_steps(
    make_server: Callable[..., BackgroundServer], tok: Any, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from sandgym.trainer.engines import create_engine
    from sandgym.trainer.models import load_model

    settings = ModelSettings(source="tiny")
    inner = create_engine(
        "hf",
        model=load_model(settings),
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
    )
    engine = RecordingEngine(inner)
    srv = make_server("local")
    gw = ModelGateway([engine], tok, CallStore(tmp_path / "g.sqlite"))
    async with GatewayServer(gw) as gsrv:
        runner = HarnessRunner(
            gw,
            gsrv.root,
            lambda: AsyncEnvClient(srv.url),
            max_turns=3,
            max_tokens=12,
            temperature=1.0,
        )
        ep = await runner.run_episode("builtin/hello-file", 0)
    await engine.aclose()
    assert ep.error is None, ep.error
    assert ep.termination == "submitted" and ep.reward == 0.0  # random weights solve nothing
    steps = ep.trajectories[0].steps
    assert 1 <= len(steps) <= 3 and len(steps) == len(engine.seen)
    for step, (prompt, gen) in zip(steps, engine.seen, strict=True):
        assert step.prompt_ids == prompt
        assert step.response_ids == gen.token_ids
        assert step.response_logprobs == gen.logprobs
        assert step.loss_mask == [1] * len(gen.token_ids)


class ShrinkingEngine(ScriptedEngine):
    """The scripted model, whose context shrinks to `after` tokens once it has replied
    `replies_before` times (so the next prompt is over it), or whose generation then raises
    `error` (the engine's own failure)."""

    def __init__(
        self, tok: Any, replies: list[str], after: int | None, error: Exception | None
    ) -> None:
        super().__init__(tok, replies)
        self.after, self.error, self.replied = after, error, 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.replied >= 1 and self.error is not None:
            raise self.error
        out = super().generate(prompts, params)
        self.replied += 1
        self.max_context_tokens = self.after
        return out


@pytest.mark.parametrize(
    ("after", "error", "termination"),
    [(16, None, "policy_output"), (None, RuntimeError("CUDA error: device lost"), "engine")],
    ids=["prompt-over-context", "engine-fault"],
)
async def test_a_failed_model_call_ends_the_episode_by_its_cause_not_by_the_verifier(
    make_server: Callable[..., BackgroundServer],
    tok: Any,
    tmp_path: Path,
    after: int | None,
    error: Exception | None,
    termination: str,
) -> None:
    # the first call solves the task (the verifier would pay 1.0); the second fails: by the
    # policy's over-long prompt (its group dropped) or by the engine (masked), never scored
    srv = make_server("local")
    engine = ShrinkingEngine(
        tok, [SOLVE, '<tool_call>{"name": "submit"}</tool_call>'], after, error
    )
    gw = ModelGateway([engine], tok, CallStore(tmp_path / "gateway.sqlite"))
    async with GatewayServer(gw) as gsrv:
        runner = HarnessRunner(gw, gsrv.root, lambda: AsyncEnvClient(srv.url), max_turns=5)
        ep = await runner.run_episode("builtin/hello-file", 0)
    assert engine.replied == 1 and len(engine.replies) == 1  # the second call never generated
    assert ep.termination == termination, (ep.termination, ep.error)
    assert ep.reward == 0.0
    if termination == "engine":
        assert ep.is_infra_failure and not ep.drops_group
    else:
        assert ep.drops_group and not ep.is_infra_failure
    assert not gw._failures  # forgotten with the session
