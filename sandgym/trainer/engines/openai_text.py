"""An OpenAI-compatible engine for servers that take the prompt as text and give back token
strings, not ids: llama-cpp-python's server (`python -m llama_cpp.server --logits_all true`).

The trainer works in token ids, so this engine turns them into text and back, and checks both
ways against the server's own tokenizer (`POST /extras/tokenize`, special tokens parsed):

- the prompt: the ids are rendered to text with the policy's tokenizer (special tokens kept);
  the server must tokenize that text back into exactly those ids, else `PolicyOutputError`;
- the reply: the generated text is tokenized by the server, and those ids must line up one to
  one with the token strings the server reported sampling (same count, each id's text equal to
  its token's), else `PolicyOutputError`. A sample that is not the tokenizer's own split of its text
  (it happens: "hel" + "lo" where the tokenizer says "hello") fails here, loudly, rather than
  train on ids the server never sampled;
- the end token: llama-cpp-python stops at it without reporting it or its logprob (its
  `echo` logprobs leave out the model's BOS token wherever it appears, and by its source (0.3.36)
  pair each echoed token with the distribution after it; its top logprobs spell every control
  token as ""), so a reply it ended is `finish_reason="stop_unscored"`: the end token is not in
  `token_ids`, the conversation closes the turn with it as context, and the policy is not
  trained on when to stop through this server.

What such a server cannot give, and this engine does not pretend to:

- its logprobs are the raw model's (before temperature, top-p, top-k), not those of the
  distribution it sampled from; the gap shows in the `tis/*` metrics and is corrected by
  truncated importance sampling (`algorithm.tis: auto` is on for this engine);
- weights cannot be pushed (no reload or adapter endpoint): `supports_weight_sync` is False;
- its context length (`/v1/models` does not report it): a prompt over the configured
  `agent.max_context_tokens` is refused before it is sent, one over the model's context by the
  server's 400 ("maximum context length"); either is that request's `PromptTooLongError`.

Sampling options the server would add by default (llama-cpp-python: `top_k` 40, `min_p` 0.05,
`repeat_penalty` 1.1) are switched off, so it samples from the rule the trainer asked for.
"""

from __future__ import annotations

from typing import Any

from sandgym.trainer.engines.base import (
    STOP_UNSCORED,
    Generation,
    PolicyOutputError,
    SamplingParams,
)
from sandgym.trainer.engines.openai import OpenAIEngine


def _root(base_url: str) -> str:
    """The server's root for `/extras/*`: `base_url` without a trailing `/v1`."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class TextCompletionEngine(OpenAIEngine):
    """See the module docstring. `tokenizer`: the policy's (a transformers tokenizer, or the
    path to one)."""

    def __init__(
        self,
        base_url: str,
        model_name: str,
        tokenizer: Any,
        api_key: str | None = None,
        eos_token_ids: list[int] | None = None,
        timeout_s: float = 120.0,
        max_concurrency: int = 64,
        max_context_tokens: int | None = None,
    ) -> None:
        super().__init__(
            base_url,
            model_name,
            api_key,
            eos_token_ids,
            timeout_s,
            max_concurrency,
            max_context_tokens=max_context_tokens,
        )
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        self.root_url = _root(base_url)
        self.rejected_samples = 0  # replies whose ids did not line up (raised)

    def _text(self, ids: list[int]) -> str:
        return str(
            self.tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    async def _tokenize(self, text: str) -> list[int]:
        reply = await self._post(f"{self.root_url}/extras/tokenize", {"input": text})
        ids = [int(i) for i in reply["tokens"]]
        bos = self.tokenizer.bos_token_id
        if ids and bos is not None and ids[0] == bos and not text.startswith(self._text([bos])):
            ids = ids[1:]  # the endpoint adds the model's BOS; a completion prompt does not
        return ids

    def _text_body(self, prompt: str, params: SamplingParams) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,  # 0: off (the server's default is 40)
            "min_p": 0.0,
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 1,
        }

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.check_prompt(prompt_ids, params)  # the configured budget (the server reports none)
        async with self._sem:
            prompt = self._text(prompt_ids)
            back = await self._tokenize(prompt)
            if back != list(prompt_ids):
                n = min(len(back), len(prompt_ids))
                first = next((i for i in range(n) if back[i] != prompt_ids[i]), n)
                raise PolicyOutputError(
                    f"the prompt does not survive the trip through text: {len(prompt_ids)} ids "
                    f"became {len(back)} in the server's tokenizer (first difference at {first})"
                )
            reply = await self._post(
                f"{self.base_url}/completions",
                self._text_body(prompt, params),
                self._text_body(self._text(prompt_ids[:1]), self._probe_params(params)),
            )
            choice = reply["choices"][0]
            text = str(choice.get("text") or "")
            lp = choice.get("logprobs") or {}
            tokens = [str(t) for t in lp.get("tokens") or []]
            logprobs = lp.get("token_logprobs") or []
            ids = await self._tokenize(text) if text else []
            self._check_alignment(text, tokens, logprobs, ids)
            # the server stops at the end token without reporting it or its logprob
            finish = STOP_UNSCORED if choice.get("finish_reason") == "stop" else "length"
        gen = Generation(ids, [float(x) for x in logprobs], finish)
        gen.version = self.version
        self.generated_tokens += len(ids)
        return gen

    def _check_alignment(
        self, text: str, tokens: list[str], logprobs: list[Any], ids: list[int]
    ) -> None:
        """The server's tokenization of `text` is the split it sampled, token for token."""
        problem = None
        if len(logprobs) != len(tokens):
            problem = f"{len(tokens)} tokens but {len(logprobs)} logprobs"
        elif "".join(tokens) != text:
            problem = "the token strings do not spell the reply's text"
        elif len(ids) != len(tokens):
            problem = (
                f"it sampled {len(tokens)} tokens; its tokenizer splits the text in {len(ids)}"
            )
        else:
            for i, (tid, tok) in enumerate(zip(ids, tokens, strict=True)):
                if self._text([tid]) != tok:
                    problem = f"token {i}: sampled {tok!r}, the tokenizer's id {tid} is {self._text([tid])!r}"
                    break
        if problem is not None:
            self.rejected_samples += 1
            raise PolicyOutputError(
                f"cannot recover the sampled token ids from {self.root_url}: {problem} "
                "(a sample that is not the tokenizer's own split of its text)"
            )
