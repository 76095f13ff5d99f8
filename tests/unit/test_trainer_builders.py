"""sandgym.trainer.builders: the agent and engine a config names, as `sandgym train` and `sandgym eval`
both build them (eval through `eval_config`, from its flags)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sandgym.trainer.agents import NoopAgent, OracleAgent, TerminalAgent
from sandgym.trainer.builders import build_agent, build_engine, load_engine, uses_model
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.engines.hf import HFEngine
from sandgym.trainer.engines.openai import OpenAIEngine
from sandgym.trainer.eval_cli import add_arguments, eval_config

CATALOG = Path(__file__).resolve().parents[2] / "sandgym" / "tasks" / "catalog"


def config(**agent: object) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "env": {"server_urls": ["ws://127.0.0.1:1/v1/env"], "task_ids": ["builtin/hello-file"]},
            "model": {"source": "tiny", "tiny_hidden": 32, "tiny_heads": 2},
            "engine": {"max_batch_size": 3, "batch_wait_s": 0.5},
            "agent": agent,
        }
    )


def test_agents_without_a_model() -> None:
    assert not uses_model(config(kind="noop")) and isinstance(
        build_agent(config(kind="noop")), NoopAgent
    )
    oracle = build_agent(config(kind="oracle", solutions_dir=str(CATALOG)))
    assert not uses_model(config(kind="oracle")) and isinstance(oracle, OracleAgent)
    assert oracle.actions("builtin/hello-file"), "expected the catalog's solution as actions"
    with pytest.raises(ValueError, match="solutions_dir is not set"):
        build_agent(config(kind="oracle"))
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        build_agent(config(kind="terminal"))


def test_hf_engine_and_terminal_agent_follow_the_config() -> None:
    cfg = config(kind="terminal")
    assert uses_model(cfg) and uses_model(config(kind="harness"))
    tok, engine = load_engine(cfg, seed=3)
    assert isinstance(engine, HFEngine)
    assert (engine.max_batch_size, engine.batch_wait_s) == (3, 0.5)
    assert engine.eos_token_ids == [tok.eos_token_id]
    assert isinstance(build_agent(cfg, tok), TerminalAgent)
    remote = cfg.model_copy(
        update={"engine": cfg.engine.model_copy(
            update={"kind": "openai", "base_url": "http://127.0.0.1:1/v1"})}
    )  # fmt: skip
    served = build_engine(remote, tok)
    assert isinstance(served, OpenAIEngine) and served.base_url == "http://127.0.0.1:1/v1"


def test_eval_flags_name_the_same_agents() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for flag, kind in [("noop", "noop"), ("oracle", "oracle"), ("llm", "terminal")]:
        args = parser.parse_args(["--tasks", "builtin/hello-file", "--agent", flag])
        cfg = eval_config(args, ["ws://h:1/v1/env"])
        assert cfg.agent.kind == kind and cfg.env.server_urls == ["ws://h:1/v1/env"]
    args = parser.parse_args(["--tasks", "builtin/hello-file", "--agent", "oracle"])
    assert isinstance(build_agent(eval_config(args, ["ws://h:1/v1/env"])), OracleAgent)
