"""The transformers engine: batched sampling on CPU or GPU with per-token logprobs.

It runs its own KV-cached decoding loop rather than `model.generate`, so that no processor from
the model's `generation_config` (repetition penalty, min length, a default temperature) changes
the distribution behind the learner's back: a token is drawn from exactly
`sampling.processed_logprobs(logits, params.rule)`, and that logprob is recorded.
"""

from __future__ import annotations

from typing import Any

from sandgym.trainer.engines.base import Generation, InferenceEngine, SamplingParams
from sandgym.trainer.engines.sampling import processed_logprobs
from sandgym.trainer.lora import apply_lora, is_adapter_state, load_adapter_state


def _cache_kwarg(out: Any) -> dict[str, Any]:
    """The KV cache of a forward's output, as the keyword the next forward takes (`cache` from
    transformers 5.2x on, `past_key_values` before)."""
    cache = getattr(out, "cache", None)
    if cache is not None:
        return {"cache": cache}
    return {"past_key_values": out.past_key_values}


class HFEngine(InferenceEngine):
    """Wraps a `transformers` causal LM; prompts are left-padded into one batch."""

    def __init__(
        self,
        model: Any,
        eos_token_ids: list[int],
        pad_token_id: int,
        device: str = "cpu",
        max_batch_size: int = 16,
        batch_wait_s: float = 0.02,
        lora: Any = None,
        max_context_tokens: int | None = None,
    ) -> None:
        super().__init__(
            max_batch_size=max_batch_size,
            batch_wait_s=batch_wait_s,
            max_context_tokens=max_context_tokens,
        )
        if lora is not None and getattr(lora, "lora_rank", 0) > 0:
            # the learner trains adapters: wrap identically so its adapter pushes load here

            model = apply_lora(model, lora)
        self.model = model.to(device).eval()
        self.device = device
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.warn_if_budget_exceeds_model()

    def model_context_tokens(self) -> int | None:
        """The model config's `max_position_embeddings` (positions past it are not trained, or
        do not exist), when it has one."""
        config = getattr(self.model, "config", None)
        n = getattr(config, "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if is_adapter_state(state_dict):
            load_adapter_state(self.model, state_dict)
        else:
            self.model.load_state_dict(state_dict)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Left-padded batch, KV-cached decoding. Each step samples from the processed
        distribution (`sandgym/trainer/engines/sampling.py`) and records the logprob of the drawn token
        under that same distribution: the one the learner recomputes."""
        import torch

        n = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        rule = params.rule
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=self.device)
        done = torch.zeros(n, dtype=torch.bool, device=self.device)
        tokens: list[Any] = []
        logprobs: list[Any] = []
        with torch.no_grad():
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
            next_pos = pos[:, -1:] + 1
            for step in range(params.max_new_tokens):
                logits = out.logits[:, -1].float()
                logp = processed_logprobs(logits, rule)
                if rule.greedy:
                    tok = logits.argmax(-1)
                else:
                    tok = torch.multinomial(logp.exp(), 1).squeeze(-1)
                logprobs.append(logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
                tok = torch.where(done, torch.full_like(tok, self.pad_token_id), tok)
                tokens.append(tok)
                done |= torch.isin(tok, eos)
                if bool(done.all()) or step == params.max_new_tokens - 1:
                    break
                attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
                out = self.model(
                    input_ids=tok.unsqueeze(-1),
                    attention_mask=attn,
                    position_ids=next_pos,
                    use_cache=True,
                    **_cache_kwarg(out),
                )
                next_pos = next_pos + 1
        new = torch.stack(tokens, dim=1).cpu()
        chosen = torch.stack(logprobs, dim=1).cpu()
        gens: list[Generation] = []
        eos_set = set(self.eos_token_ids)
        for i in range(n):
            toks = new[i].tolist()
            end = len(toks)
            finish = "length"
            for j, t in enumerate(toks):
                if t in eos_set:
                    end, finish = j + 1, "stop"
                    break
            gens.append(Generation(toks[:end], chosen[i, :end].tolist(), finish))
        return gens
