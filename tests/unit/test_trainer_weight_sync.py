"""Weights that reach the engine (issue 31, item 1).

- an engine reports the version of the weights it really serves: an OpenAI-compatible engine
  without a weight push keeps version 0 whatever the learner sends, and stamps its generations
  so (the staleness bound then sees the truth);
- an engine that cannot take weights makes an on-policy config a named error at load; the
  explicit off-policy setting needs a staleness bound that its frozen version can meet;
- `engine.weight_sync: vllm_http` pushes the learner's weights into `vllm serve` through the
  endpoints vLLM 0.34 offers in dev mode (`POST /collective_rpc` calling the worker's own
  `reload_weights(weights_path=...)`, then `POST /reset_prefix_cache`): tested here against an
  HTTP server in the test that answers those routes as vLLM's routers do (vLLM itself needs a
  GPU), checking the request shapes and that the pushed directory holds the learner's tensors;
- evaluation refuses to run while an engine serves other weights than the learner's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sandgym.trainer.config import ConfigError, load_config
from sandgym.trainer.engines import EngineError, create_engine
from sandgym.trainer.engines.base import SamplingParams
from tests.fakes.json_http import JsonHandler, serving

CONFIGS = Path(__file__).resolve().parents[2] / "sandgym" / "trainer" / "configs"


class _VLLMDevServer(JsonHandler):
    """Answers like `vllm serve` with VLLM_SERVER_DEV_MODE=1 (vLLM 0.34's routers): completions,
    `/collective_rpc` ({"method", "args", "kwargs", "timeout"} -> {"results": [...]}) and
    `/reset_prefix_cache` (-> {"success": bool})."""

    requests: list[tuple[str, dict[str, Any]]] = []
    rpc_status = 200
    #: the weights the "server" would serve after a reload: the pushed directory's tensors
    loaded: dict[str, torch.Tensor] = {}

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        type(self).requests.append((self.path, body))
        if self.path == "/collective_rpc":
            if type(self).rpc_status != 200:
                return self._reply(type(self).rpc_status, {"error": "worker failed"})
            if body.get("method") == "reload_weights":
                from safetensors.torch import load_file

                path = Path(body["kwargs"]["weights_path"])
                index = json.loads((path / "model.safetensors.index.json").read_text())
                loaded: dict[str, torch.Tensor] = {}
                for shard in sorted(set(index["weight_map"].values())):
                    loaded.update(load_file(str(path / shard)))
                type(self).loaded = loaded
            return self._reply(200, {"results": [None]})
        if self.path.startswith("/reset_prefix_cache"):
            return self._reply(200, {"success": True})
        if self.path == "/v1/completions" and len(body["prompt"]) > 8:
            # vLLM 0.34's reply to a prompt longer than the context (VLLMValidationError)
            error = {"message": "This model's maximum context length is 8 tokens.",
                     "type": "BadRequestError", "param": "input_tokens", "code": 400}  # fmt: skip
            return self._reply(400, {"error": error})
        if self.path == "/v1/completions":
            choice = {
                "token_ids": [4],
                "logprobs": {"token_logprobs": [-0.5]},
                "finish_reason": "length",
            }
            return self._reply(200, {"choices": [choice]})
        return self._reply(404, {"detail": "Not Found"})


@pytest.fixture
def vllm_dev() -> Iterator[str]:
    _VLLMDevServer.requests = []
    _VLLMDevServer.rpc_status = 200
    _VLLMDevServer.loaded = {}
    with serving(_VLLMDevServer) as url:
        yield url


async def test_an_engine_without_a_push_reports_the_version_it_serves(vllm_dev: str) -> None:
    engine = create_engine("openai", base_url=vllm_dev, model_name="m")
    assert not engine.supports_weight_sync
    engine.update_weights({"w": torch.ones(2)}, 3)
    assert engine.version == 0  # the server still serves the weights it started with
    g = await engine.agenerate([1, 2], SamplingParams(max_new_tokens=1))
    assert g.version == 0
    assert not any(p == "/collective_rpc" for p, _ in _VLLMDevServer.requests)
    await engine.aclose()


async def test_vllm_http_push_reloads_the_learners_weights(vllm_dev: str, tmp_path: Path) -> None:
    engine = create_engine(
        "openai", base_url=vllm_dev, model_name="m", weight_sync="vllm_http",
        weight_dir=str(tmp_path / "weights"),
    )  # fmt: skip
    assert engine.supports_weight_sync
    state = {"model.layer.weight": torch.arange(6.0).reshape(2, 3), "lm_head.weight": torch.ones(4)}
    engine.update_weights(state, 1)
    paths = [p for p, _ in _VLLMDevServer.requests]
    # the reload, then the prefix cache (KV computed under the old weights) is dropped
    assert paths[:2] == ["/collective_rpc", "/reset_prefix_cache"], paths
    body = _VLLMDevServer.requests[0][1]
    assert body["method"] == "reload_weights" and body["args"] == []
    assert set(body["kwargs"]) == {"weights_path"}
    assert all(isinstance(v, str) for v in body["kwargs"].values())  # vLLM takes strings only
    assert set(_VLLMDevServer.loaded) == set(state)
    for k, v in state.items():
        assert torch.equal(_VLLMDevServer.loaded[k], v)
    assert engine.version == 1
    g = await engine.agenerate([1], SamplingParams(max_new_tokens=1))
    assert g.version == 1
    await engine.aclose()


def test_a_failed_push_is_an_error_and_the_version_stays(vllm_dev: str, tmp_path: Path) -> None:
    engine = create_engine(
        "openai", base_url=vllm_dev, model_name="m", weight_sync="vllm_http",
        weight_dir=str(tmp_path / "weights"),
    )  # fmt: skip
    _VLLMDevServer.rpc_status = 404  # a server started without VLLM_SERVER_DEV_MODE=1
    with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE"):
        engine.update_weights({"w": torch.ones(2)}, 1)
    assert engine.version == 0


def test_a_reload_the_server_refuses_is_an_error_and_the_version_stays(
    vllm_dev: str, tmp_path: Path
) -> None:
    """vLLM answers 500 when its workers cannot load the directory (one it cannot read, tensors
    of another shape); its engine does not survive it (lab/bench/results/vllm_cpu_push.json)."""
    engine = create_engine(
        "openai", base_url=vllm_dev, model_name="m", weight_sync="vllm_http",
        weight_dir=str(tmp_path / "weights"),
    )  # fmt: skip
    _VLLMDevServer.rpc_status = 500
    with pytest.raises(EngineError, match="could not load the weights.*does not survive"):
        engine.update_weights({"w": torch.ones(2)}, 1)
    assert engine.version == 0
    # the prefix cache is not reset after a failed reload
    assert [p for p, _ in _VLLMDevServer.requests] == ["/collective_rpc"]


def test_a_weight_dir_that_cannot_be_written_is_a_named_error(
    vllm_dev: str, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    engine = create_engine(
        "openai", base_url=vllm_dev, model_name="m", weight_sync="vllm_http",
        weight_dir=str(blocker),
    )  # fmt: skip
    with pytest.raises(EngineError, match="could not write the weights to .*a-file"):
        engine.update_weights({"w": torch.ones(2)}, 1)
    assert engine.version == 0
    assert _VLLMDevServer.requests == []  # nothing was asked of the server


def test_an_engine_that_cannot_take_weights_is_a_config_error() -> None:
    base = ["engine.kind=openai", "engine.base_url=http://h:8000/v1"]
    with pytest.raises(ConfigError, match="cannot take the learner's weights"):
        load_config(CONFIGS / "smoke.yaml", base)
    with pytest.raises(ConfigError, match="cannot take the learner's weights"):
        load_config(CONFIGS / "smoke.yaml", ["engine.kind=openai_text", *base[1:]])
    # explicit off-policy: the staleness bound is on the served version (0), so it must cover
    # the run
    with pytest.raises(ConfigError, match="max_staleness"):
        load_config(
            CONFIGS / "smoke.yaml", [*base, "algorithm.off_policy=true", "run.num_updates=5"]
        )
    cfg = load_config(
        CONFIGS / "smoke.yaml",
        [*base, "algorithm.off_policy=true", "algorithm.max_staleness=100", "run.num_updates=3"],
    )
    assert cfg.algorithm.off_policy and not cfg.engine_takes_weights
    # ...and evaluation would score the frozen served model, not the learner's weights
    with pytest.raises(ConfigError, match="evaluat"):
        load_config(
            CONFIGS / "smoke.yaml",
            [*base, "algorithm.off_policy=true", "algorithm.max_staleness=100", "run.eval_every=1"],
        )
    with pytest.raises(ConfigError, match="evaluat"):
        load_config(
            CONFIGS / "smoke.yaml",
            [
                *base,
                "algorithm.off_policy=true",
                "algorithm.max_staleness=100",
                "run.eval_before=true",
            ],
        )
    cfg = load_config(CONFIGS / "smoke.yaml", [*base, "engine.weight_sync=vllm_http"])
    assert cfg.engine_takes_weights
    # adapters alone cannot go through a full-weight reload
    with pytest.raises(ConfigError, match="LoRA adapters"):
        load_config(
            CONFIGS / "smoke.yaml", [*base, "engine.weight_sync=vllm_http", "learner.lora_rank=8"]
        )


def test_evaluation_refuses_an_engine_serving_other_weights() -> None:
    from sandgym.trainer.train import TrainError, check_served_versions

    check_served_versions([4, 4], 4, "evaluation")
    with pytest.raises(TrainError, match="serves weights of version 0.*learner holds version 4"):
        check_served_versions([4, 0], 4, "evaluation")


async def test_a_prompt_longer_than_the_context_is_the_policys_failure(vllm_dev: str) -> None:
    from sandgym.trainer.engines.base import PolicyOutputError
    from sandgym.trainer.failures import classify_failure

    engine = create_engine("openai", base_url=vllm_dev, model_name="m")
    with pytest.raises(PolicyOutputError, match="too long") as info:
        await engine.agenerate(list(range(20)), SamplingParams(max_new_tokens=1))
    assert classify_failure(info.value) == "policy_output"
    await engine.aclose()


def test_weight_files_hold_at_most_one_shard_or_tensor(tmp_path: Path) -> None:
    """The writer under the fsdp push: a full shard is written before the next tensor is asked
    for, so what it holds is bounded by the shard size (or one larger tensor), not the model."""
    from sandgym.trainer.engines.weight_files import load_weights, write_weights

    asked: list[str] = []

    def items() -> Iterator[tuple[str, torch.Tensor]]:
        for i in range(40):
            asked.append(f"w{i}")
            yield f"w{i}", torch.full((256,), float(i))  # 1 KiB each
        yield "big", torch.zeros(4096)  # 16 KiB: a file of its own

    info = write_weights(items(), tmp_path / "w", max_shard_bytes=4096)
    # a tensor of a shard's size is on disk before the next one is gathered (the fsdp push
    # gathers while the writer waits: two large tensors never live together)
    written: list[int] = []

    def two_big() -> Iterator[tuple[str, torch.Tensor]]:
        yield "a", torch.zeros(2048)  # 8 KiB
        written.append(len(list((tmp_path / "v.writing").glob("*.safetensors"))))
        yield "b", torch.zeros(2048)

    write_weights(two_big(), tmp_path / "v", max_shard_bytes=4096)
    assert written == [1]
    assert info["bytes"] == 40 * 1024 + 16384 and info["shards"] == 11
    assert info["peak_buffered_bytes"] == 16384  # the big tensor; shards of small ones: 4 KiB
    back = load_weights(tmp_path / "w")
    assert set(back) == set(asked) | {"big"} and torch.equal(back["w7"], torch.full((256,), 7.0))


def test_push_outcomes_are_handled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`Trainer._await_push` on each outcome Ray can give a weight push: the served version is
    recorded; a dead actor is replaced; an engine that refuses the weights keeps its old version
    and three refusals in a row stop the run; a lost object stops it at once."""
    ray = pytest.importorskip("ray")
    from sandgym.trainer.train import Trainer, TrainError

    trainer = Trainer(load_config(CONFIGS / "smoke.yaml"), tmp_path / "run")
    trainer.rollouts = ["actor-0"]
    trainer.served_versions = [2]
    trainer.version = 3
    replaced: list[int] = []
    monkeypatch.setattr(trainer, "_replace_rollout", lambda i, dead, exc: replaced.append(i))
    outcome: list[Any] = []

    def fake_get(call: Any) -> Any:
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    monkeypatch.setattr(ray, "get", fake_get)
    outcome[:] = [3]
    trainer._await_push(0, "call")
    assert trainer.served_versions == [3]
    outcome[:] = [ray.exceptions.ActorDiedError()]
    trainer._await_push(0, "call")
    assert replaced == [0]
    refused = ray.exceptions.RayTaskError("update_weights", "EngineError: 404", RuntimeError("x"))
    outcome[:] = [refused]
    trainer.version = 4
    trainer._await_push(0, "call")
    trainer._await_push(0, "call")
    assert trainer.served_versions == [3]  # still the weights it had
    with pytest.raises(TrainError, match="refused 3 weight pushes in a row"):
        trainer._await_push(0, "call")
    outcome[:] = [ray.exceptions.ObjectLostError("ab" * 14, None, "")]
    with pytest.raises(TrainError, match="weight push of version 4 to rollout engine 0 failed"):
        trainer._await_push(0, "call")
