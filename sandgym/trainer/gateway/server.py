"""The model gateway over HTTP: the OpenAI-compatible routes and `GatewayServer`, which serves them
with uvicorn on the engines' own event loop.

    POST /sessions/{sid}/v1/chat/completions   (tools, tool_calls, `stream: true` as SSE)
    GET  /sessions/{sid}/v1/models

An engine failure answers as OpenAI's API does: 400 for what the request caused (a prompt over
the context: code `context_length_exceeded`), 503 for the engine's own failure.

Streaming (`stream: true`) sends OpenAI `chat.completion.chunk` events: the role, then one
content chunk per generated token that adds text (decoded incrementally; a token that ends in the
middle of a UTF-8 character waits for the next), then the tool calls, then a final chunk with
`finish_reason` and `usage`, then `[DONE]`. The engines generate whole replies, so the chunks
follow the finished generation; their concatenated content equals the non-streamed content.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request  # at module level: FastAPI resolves the handler's annotations here

from sandgym.trainer.engines.base import EngineError, PolicyOutputError, PromptTooLongError
from sandgym.trainer.gateway.chat import ModelGateway
from sandgym.trainer.gateway.errors import GatewayError
from sandgym.trainer.loop_server import LoopServer


def gateway_app(gateway: ModelGateway) -> Any:
    """The FastAPI application serving `gateway` (the routes above)."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="sandgym model gateway")

    @app.get("/sessions/{sid}/v1/models")
    async def models(sid: str) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": gateway.model_name, "object": "model", "owned_by": "sandgym"}],
        }

    @app.post("/sessions/{sid}/v1/chat/completions", response_model=None)
    async def completions(sid: str, request: Request) -> Any:
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            raise HTTPException(400, f"request body is not JSON: {exc}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise HTTPException(400, "expected a JSON object with a `messages` list")
        try:
            resp, ids = await gateway.complete(sid, body)
        except GatewayError as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "gateway"}}, 400)
        except EngineError as exc:
            return JSONResponse(*_engine_error_reply(exc))
        if not body.get("stream"):
            return resp
        deltas = await asyncio.to_thread(gateway.token_deltas, ids)
        return StreamingResponse(_sse(resp, deltas), media_type="text/event-stream")

    return app


def _engine_error_reply(exc: EngineError) -> tuple[dict[str, Any], int]:
    """An engine failure as the OpenAI API answers it: a 400 the request caused
    (`context_length_exceeded` for a prompt over the context, as OpenAI's own servers and vLLM
    answer), else a 503 (the server's, retryable). The session's episode ends by the failure's
    cause either way (`ModelGateway.failure`)."""
    if isinstance(exc, PromptTooLongError):
        err = {"type": "invalid_request_error", "code": "context_length_exceeded"}
        return {"error": {"message": str(exc), **err}}, 400
    if isinstance(exc, PolicyOutputError):
        return {"error": {"message": str(exc), "type": "invalid_request_error"}}, 400
    return {"error": {"message": str(exc), "type": "server_error"}}, 503


def _sse(resp: dict[str, Any], deltas: list[str]) -> Any:
    """A finished completion as OpenAI `chat.completion.chunk` events, one content chunk per
    token that adds text (`deltas`, see `ModelGateway.token_deltas`)."""

    async def events() -> Any:
        choice = resp["choices"][0]
        msg = choice["message"]
        base = {k: resp[k] for k in ("id", "created", "model")} | {
            "object": "chat.completion.chunk"
        }

        def chunk(delta: dict[str, Any]) -> str:
            return f"data: {json.dumps(base | {'choices': [{'index': 0, 'delta': delta}]})}\n\n"

        yield chunk({"role": "assistant", "content": ""})
        content = msg.get("content") or ""
        # the reply's text is the tokens' text (else, never expected, send it in one piece)
        parts = deltas if "".join(deltas) == content else [content]
        for d in parts:
            if d:
                yield chunk({"content": d})
        if msg.get("tool_calls"):
            yield chunk({"tool_calls": [dict(c, index=i) for i, c in enumerate(msg["tool_calls"])]})
        last = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
        yield f"data: {json.dumps(base | {'choices': [last], 'usage': resp['usage']})}\n\n"
        yield "data: [DONE]\n\n"

    return events()


class GatewayServer(LoopServer):
    """Serves a gateway with uvicorn on this event loop (so it shares the engines' batcher).

    `async with GatewayServer(gw, port=0) as srv: srv.root` -> "http://127.0.0.1:PORT"."""

    def __init__(self, gateway: ModelGateway, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.gateway = gateway

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def make_app(self) -> Any:
        return gateway_app(self.gateway)

    def start_error(self) -> Exception:
        return GatewayError("the gateway server stopped while starting")

    async def __aenter__(self) -> GatewayServer:
        await super().__aenter__()
        return self
