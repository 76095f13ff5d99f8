"""The transformers engine: batched sampling on CPU or GPU with per-token logprobs."""

from __future__ import annotations

from typing import Any

from trainer.engines.base import Generation, InferenceEngine, SamplingParams


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
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_wait_s=batch_wait_s)
        if lora is not None and getattr(lora, "lora_rank", 0) > 0:
            # the learner trains adapters: wrap identically so its adapter pushes load here
            from trainer.lora import apply_lora

            model = apply_lora(model, lora)
        self.model = model.to(device).eval()
        self.device = device
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from trainer.lora import is_adapter_state, load_adapter_state

        if is_adapter_state(state_dict):
            load_adapter_state(self.model, state_dict)
        else:
            self.model.load_state_dict(state_dict)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p) :] = 1
        greedy = params.temperature <= 0
        kwargs: dict[str, Any] = {"do_sample": not greedy}
        if not greedy:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=attn.to(self.device),
                max_new_tokens=params.max_new_tokens,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                return_dict_in_generate=True,
                output_logits=True,
                **kwargs,
            )
        new = out.sequences[:, width:].cpu()
        # raw logits -> logprobs of the policy itself (temperature 1), as the learner computes
        logps = torch.stack(out.logits, dim=1).float().log_softmax(-1).cpu()
        chosen = torch.gather(logps, -1, new.unsqueeze(-1)).squeeze(-1)
        gens: list[Generation] = []
        eos = set(self.eos_token_ids)
        for i in range(len(prompts)):
            toks = new[i].tolist()
            end = len(toks)
            finish = "length"
            for j, t in enumerate(toks):
                if t in eos:
                    end, finish = j + 1, "stop"
                    break
            gens.append(Generation(toks[:end], chosen[i, :end].tolist(), finish))
        return gens
