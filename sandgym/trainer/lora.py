"""LoRA: train low-rank adapters instead of the full weights, and ship only the adapters.

With `learner.lora_rank > 0` the learner wraps the policy with peft (`apply_lora`): the base
weights are frozen, only the adapters' A/B matrices get gradients and optimizer state, and the
weights pushed to rollout engines are the adapter tensors alone (`adapter_state_dict`, a few MB
instead of the whole model). The hf engine, built with the same settings, wraps its copy of the
model identically at start (peft initialises B = 0, so an untrained adapter changes nothing) and
`load_adapter_state` swaps in each new adapter.
"""

from __future__ import annotations

from typing import Any

#: the key prefix peft gives adapter tensors in a state dict; engines recognise adapter pushes by it
LORA_MARKER = "lora_"


class LoraError(RuntimeError):
    """An adapter push does not fit the model (or peft is missing)."""


def lora_config(rank: int, alpha: float, dropout: float, target_modules: list[str]) -> Any:
    try:
        from peft import LoraConfig
    except ImportError as exc:  # an optional dependency: the `train` extra carries it
        raise LoraError(
            "LoRA needs peft: pip install 'sandgym[train]' (or pip install peft)"
        ) from exc
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates int; it only divides it by r
        lora_dropout=dropout,
        target_modules=list(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: Any, settings: Any) -> Any:
    """The model wrapped with adapters per `settings` (a `LearnerSettings`); base weights frozen."""
    from peft import get_peft_model

    cfg = lora_config(
        settings.lora_rank, settings.lora_alpha, settings.lora_dropout, settings.lora_target_modules
    )
    return get_peft_model(model, cfg)


def is_adapter_state(state_dict: dict[str, Any]) -> bool:
    return bool(state_dict) and all(LORA_MARKER in k for k in state_dict)


def adapter_state_dict(model: Any) -> dict[str, Any]:
    """The adapter tensors only (CPU copies), as peft names them."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().to("cpu").clone() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter_state(model: Any, state_dict: dict[str, Any]) -> None:
    """Load adapter tensors into a peft-wrapped model; every tensor must land."""
    from peft import PeftModel, set_peft_model_state_dict

    if not isinstance(model, PeftModel):
        raise LoraError(
            "received LoRA adapter weights but this engine's model has no adapters; build the "
            "engine with the learner's lora settings"
        )
    result = set_peft_model_state_dict(model, state_dict)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise LoraError(f"adapter tensors do not fit the model: unexpected {unexpected[:5]}")
