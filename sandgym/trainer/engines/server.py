"""An OpenAI-compatible `/v1/completions` server in front of any engine (vLLM's reply shape).

`OpenAIEngine` talks to `vllm serve`; this serves an in-process engine (the hf engine on CPU) the
same way, so the openai path can be run and tested where vLLM cannot: token-id prompts, sampling
by `temperature`, `top_p`, `top_k`, and per choice the generated `token_ids` and
`logprobs.token_logprobs` of the processed distribution the tokens were drawn from (what vLLM
reports with `--logprobs-mode processed_logprobs`).

    POST /v1/completions   {"prompt": [ids] | "text", "max_tokens", "temperature", "top_p",
                            "top_k", "logprobs": 0, "return_token_ids", "return_tokens_as_token_ids"}
    GET  /v1/models        (each model with its `max_model_len`, as vLLM reports it)

Failures answer as vLLM's do: a prompt over the engine's context is a 400 whose error names the
parameter `input_tokens`; another failure the request caused (`RequestFailedError`, a
`PolicyOutputError`) a 400; the engine's own failure a 500.

`python -m sandgym.trainer.engines.server --source smollm2 --port 8000` serves SmolLM2 on CPU.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import Request  # at module level: FastAPI resolves the handler's annotations here

from sandgym.trainer.config import ModelSettings
from sandgym.trainer.engines.base import (
    EngineError,
    InferenceEngine,
    PolicyOutputError,
    PromptTooLongError,
    SamplingParams,
)
from sandgym.trainer.engines.hf import HFEngine
from sandgym.trainer.loop_server import LoopServer
from sandgym.trainer.models import load_model, load_tokenizer


def completions_app(engine: InferenceEngine, model_name: str, tokenizer: Any = None) -> Any:
    """The FastAPI application (`tokenizer` decodes `text` and encodes string prompts)."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse

    app = FastAPI(title="sandgym completions")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry: dict[str, Any] = {"id": model_name, "object": "model", "owned_by": "sandgym"}
        if engine.context_limit is not None:
            entry["max_model_len"] = engine.context_limit
        return {"object": "list", "data": [entry]}

    def bad_request(exc: PolicyOutputError) -> JSONResponse:
        param = "input_tokens" if isinstance(exc, PromptTooLongError) else None
        error = {"message": str(exc), "type": "BadRequestError", "param": param, "code": 400}
        return JSONResponse({"error": error}, status_code=400)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> dict[str, Any] | JSONResponse:
        body = await request.json()
        if not isinstance(body, dict):
            raise HTTPException(400, "expected a JSON object")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            if tokenizer is None:
                raise HTTPException(400, "this server takes token-id prompts only")
            prompt = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) for t in prompt)
        ):
            raise HTTPException(400, "prompt must be a non-empty list of token ids (or a string)")
        if int(body.get("n", 1)) != 1:
            raise HTTPException(400, "n > 1 is not supported; send one request per sample")
        top_k = int(body.get("top_k") or 0)
        params = SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            max_new_tokens=int(body.get("max_tokens") or 16),
            top_k=max(0, top_k),  # vLLM spells "no top-k" -1
        )
        try:
            gen = await engine.agenerate(prompt, params)
        except PolicyOutputError as exc:  # the request caused it (vLLM: a 400)
            return bad_request(exc)
        except EngineError as exc:
            raise HTTPException(500, str(exc)) from exc
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=True) if tokenizer else ""
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "finish_reason": gen.finish_reason,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = list(gen.token_ids)
        if body.get("logprobs") is not None:
            if body.get("return_tokens_as_token_ids") or tokenizer is None:
                tokens = [f"token_id:{t}" for t in gen.token_ids]
            else:
                tokens = [tokenizer.decode([t]) for t in gen.token_ids]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(gen.logprobs)}
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(gen.token_ids),
                "total_tokens": len(prompt) + len(gen.token_ids),
            },
        }

    return app


class CompletionsServer(LoopServer):
    """Serves `completions_app` with uvicorn on this event loop (it shares the engine's batcher).

    `async with CompletionsServer(engine, "m") as srv: srv.base_url` -> "http://127.0.0.1:PORT/v1".
    """

    def __init__(
        self,
        engine: InferenceEngine,
        model_name: str,
        tokenizer: Any = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host, port)
        self.app = completions_app(engine, model_name, tokenizer)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def make_app(self) -> Any:
        return self.app

    def start_error(self) -> Exception:
        return EngineError("the completions server stopped while starting")

    async def __aenter__(self) -> CompletionsServer:
        await super().__aenter__()
        return self


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", choices=["smollm2", "tiny", "hf"], default="smollm2")
    ap.add_argument("--path", default=None, help="model directory when --source hf")
    ap.add_argument("--model-name", default="sandgym-policy")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    settings = ModelSettings(source=args.source, path=args.path)
    tok = load_tokenizer(settings)
    engine = HFEngine(
        load_model(settings), [tok.eos_token_id], tok.pad_token_id, device=args.device
    )

    async def serve() -> None:
        async with CompletionsServer(engine, args.model_name, tok, args.host, args.port) as srv:
            print(f"serving {args.model_name} at {srv.base_url}", flush=True)
            await asyncio.Event().wait()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
