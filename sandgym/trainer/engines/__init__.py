"""Inference engines behind one interface (`InferenceEngine`): token ids in, token ids and
their logprobs out. `create_engine` picks one by name and imports its vendor library lazily."""

from __future__ import annotations

from typing import Any

from sandgym.trainer.engines.base import EngineError, Generation, InferenceEngine
from sandgym.trainer.engines.hf import HFEngine
from sandgym.trainer.engines.openai import OpenAIEngine
from sandgym.trainer.engines.openai_text import TextCompletionEngine
from sandgym.trainer.engines.vllm import VLLMEngine


def create_engine(kind: str, **kwargs: Any) -> InferenceEngine:
    """`hf` (transformers), `vllm` (in-process, GPU), `openai` (any compatible HTTP server that
    takes and returns token ids) or `openai_text` (one that takes text: llama-cpp-python's)."""
    if kind == "hf":
        return HFEngine(**kwargs)
    if kind == "vllm":
        return VLLMEngine(**kwargs)
    if kind == "openai":
        return OpenAIEngine(**kwargs)
    if kind == "openai_text":
        return TextCompletionEngine(**kwargs)
    raise EngineError(f"unknown engine kind {kind!r}; expected hf, vllm, openai or openai_text")


__all__ = ["EngineError", "Generation", "InferenceEngine", "create_engine"]
