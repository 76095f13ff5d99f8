"""Agents and inference engines built from a `TrainConfig`: the one place `sandgym train` (each
`RolloutWorker`) and `sandgym eval` make them.

- `uses_model(cfg)`: whether the agent generates (`noop` and `oracle` need no engine);
- `load_engine(cfg, seed=)`: the tokenizer and the engine `cfg.engine.kind` names, on
  `cfg.model` (hf: the transformers model in this process; vllm: the model's directory;
  openai: an HTTP endpoint);
- `build_agent(cfg, tokenizer)`: the agent `cfg.agent.kind` names (`harness` plays through the
  terminal agent's tokenizer here; its workflow is built where it runs).
"""

from __future__ import annotations

from typing import Any

from sandgym.trainer.agents import NoopAgent, OracleAgent, TerminalAgent, solutions_from_dir
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.engines import create_engine
from sandgym.trainer.engines.base import InferenceEngine
from sandgym.trainer.models import load_model, load_tokenizer, smollm2_vllm_dir

Agent = TerminalAgent | NoopAgent | OracleAgent


def uses_model(cfg: TrainConfig) -> bool:
    """Whether `cfg.agent.kind` generates with a model (every kind but noop and oracle)."""
    return cfg.agent.kind not in ("noop", "oracle")


def build_engine(
    cfg: TrainConfig, tokenizer: Any, seed: int | None = None, weight_dir: str | None = None
) -> InferenceEngine:
    """The engine of `cfg.engine.kind` on `cfg.model`. `seed` seeds torch's sampling first
    (hf only: the other engines sample elsewhere). `weight_dir`: where an engine that reloads
    weights from files gets them written (default `cfg.engine.weight_dir`)."""

    eos = [tokenizer.eos_token_id]
    # the prompt budget the trainer's agent keeps (it drops old turns to fit): a prompt over it
    # is refused as the policy's; a harness keeps its own conversation, bounded by the model's
    budget = cfg.agent.max_context_tokens if cfg.agent.kind != "harness" else None
    if cfg.engine.kind == "hf":
        import torch

        if seed is not None:
            torch.manual_seed(seed)
        return create_engine(
            "hf",
            model=load_model(cfg.model),
            eos_token_ids=eos,
            pad_token_id=tokenizer.pad_token_id,
            device=cfg.engine.device,
            max_batch_size=cfg.engine.max_batch_size,
            batch_wait_s=cfg.engine.batch_wait_s,
            lora=cfg.learner,
            max_context_tokens=budget,
        )
    if cfg.engine.kind == "vllm":
        path = (
            cfg.model.path
            if cfg.model.source == "hf"
            else str(smollm2_vllm_dir(cfg.model.cache_dir))
        )
        return create_engine(
            "vllm",
            model_path=path,
            eos_token_ids=eos,
            gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
            weight_dir=weight_dir or cfg.engine.weight_dir,
            max_context_tokens=budget,
            require_processed_logprobs=not cfg.tis_enabled,
        )
    if cfg.engine.kind == "openai_text":  # llama-cpp-python's server: text in, strings out
        return create_engine(
            "openai_text",
            base_url=cfg.engine.base_url,
            model_name=cfg.engine.model_name or "default",
            tokenizer=tokenizer,
            api_key=cfg.engine.api_key,
            eos_token_ids=eos,
            max_context_tokens=budget,
        )
    sync = "none" if cfg.engine.weight_sync == "auto" else cfg.engine.weight_sync
    return create_engine(
        "openai",
        base_url=cfg.engine.base_url,
        model_name=cfg.engine.model_name or "default",
        api_key=cfg.engine.api_key,
        eos_token_ids=eos,
        weight_sync=sync,
        weight_dir=weight_dir or cfg.engine.weight_dir,
        max_context_tokens=budget,
    )


def load_engine(cfg: TrainConfig, seed: int | None = None) -> tuple[Any, InferenceEngine]:
    """(tokenizer, engine) of `cfg.model` and `cfg.engine` (see `build_engine`)."""

    tokenizer = load_tokenizer(cfg.model)
    return tokenizer, build_engine(cfg, tokenizer, seed)


def build_agent(cfg: TrainConfig, tokenizer: Any = None) -> Agent:
    """The agent of `cfg.agent.kind`; `tokenizer` is needed by the model's agents only."""
    if cfg.agent.kind == "noop":
        return NoopAgent()
    if cfg.agent.kind == "oracle":
        if not cfg.agent.solutions_dir:
            raise ValueError("agent.kind is oracle but agent.solutions_dir is not set")
        return OracleAgent(solutions_from_dir(cfg.agent.solutions_dir))
    if tokenizer is None:
        raise ValueError(f"agent.kind {cfg.agent.kind} needs the model's tokenizer, got None")
    return TerminalAgent(tokenizer, cfg.agent, cfg.sampling.max_new_tokens)
