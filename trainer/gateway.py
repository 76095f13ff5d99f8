"""Model gateway: an OpenAI-compatible chat endpoint in front of the rollout engines that records
every call with exact token ids, so a third-party harness (any program that speaks the OpenAI
API) can be trained on.

    POST /sessions/{sid}/v1/chat/completions   (tools, tool_calls, `stream: true` as SSE)
    GET  /sessions/{sid}/v1/models

Each episode gets its own base URL, `.../sessions/<sid>/v1`, so the harness needs no change
beyond `OPENAI_BASE_URL`. A session sticks to one engine replica (the one with the fewest
sessions when it first calls). Every call is recorded (`CallRecord`: prompt and completion token
ids, logprobs, weight version, latency) in memory (at most `max_sessions_in_memory` sessions, the
least recently used spill to SQLite only) and in SQLite under the run directory; `consume(sid)`
hands a session's calls over and deletes them.

Token rule (what makes `calls_to_steps` exact): the gateway tokenises a call's messages with the
chat template. When the messages *keep the history* (they start with the previous call's messages
followed by the assistant reply the gateway returned, unchanged), the prompt ids are the previous
prompt ids + the generated ids + the template text between turns, tokenised alone: the model's own
tokens are never re-tokenised. A call whose messages do not start with the previous call's is a
new conversation (a new sequence; `extends_previous=False`). A call that starts with the previous
messages but changed the model's reply (edited, trimmed) is re-rendered and marked
`extends_previous=True` with ids that do not line up, and `calls_to_steps` refuses it with
`TokenAlignmentError` rather than train on tokens the model never produced.

Tools: the offered tools are described in the system prompt (the small chat models here have no
native tool template); the reply is parsed with `trainer.agents.parse_action` (a ```bash block,
a JSON / <tool_call> call), and a command becomes a `tool_calls` entry for the first offered tool
that takes a `command` argument; `submit` becomes a call of a tool named `submit` when offered.
Assistant turns with `tool_calls` and `tool` results in the history are rendered back as text.
Streaming (`stream: true`) sends OpenAI `chat.completion.chunk` events: the role, then one
content chunk per generated token that adds text (decoded incrementally; a token that ends in the
middle of a UTF-8 character waits for the next), then the tool calls, then a final chunk with
`finish_reason` and `usage`, then `[DONE]`. The engines generate whole replies, so the chunks
follow the finished generation; their concatenated content equals the non-streamed content.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request  # at module level: FastAPI resolves the handler's annotations here

from trainer.agents import parse_action
from trainer.engines.base import InferenceEngine, SamplingParams
from trainer.episode import Step


class GatewayError(RuntimeError):
    """The gateway could not serve or convert a call."""


class UnknownSessionError(GatewayError, KeyError):
    """No calls are recorded for this session id."""


class MissingTokensError(GatewayError):
    """A recorded call lacks the token ids (or logprobs) a training step needs."""


class TokenAlignmentError(GatewayError):
    """A call that keeps the conversation's history does not extend the previous prompt +
    completion token for token."""


@dataclass
class CallRecord:
    """One chat completion served to a session."""

    session_id: str
    index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    weight_version: int
    latency_s: float
    #: the messages keep the history of the previous call (see the module's token rule)
    extends_previous: bool
    completion_text: str
    finish_reason: str
    replica: int
    created_at: float = field(default_factory=time.time)


def calls_to_steps(calls: list[CallRecord]) -> list[Step]:
    """A session's calls as `Step`s, in order, checked against the token rule.

    Raises `MissingTokensError` when a call has no prompt or completion ids or its logprobs do not
    match its completion, and `TokenAlignmentError` when a call marked `extends_previous` does not
    start with the previous call's prompt + completion ids (an end-of-turn token the model did
    not generate may follow the completion: it is part of the template text between turns).
    """
    steps: list[Step] = []
    prev: CallRecord | None = None
    for c in sorted(calls, key=lambda r: r.index):
        if not c.prompt_ids or not c.completion_ids:
            raise MissingTokensError(
                f"call {c.index} of session {c.session_id} has {len(c.prompt_ids)} prompt ids and "
                f"{len(c.completion_ids)} completion ids; both must be recorded"
            )
        if len(c.logprobs) != len(c.completion_ids):
            raise MissingTokensError(
                f"call {c.index} of session {c.session_id}: {len(c.logprobs)} logprobs for "
                f"{len(c.completion_ids)} completion ids"
            )
        if c.extends_previous:
            if prev is None:
                raise TokenAlignmentError(
                    f"call {c.index} of session {c.session_id} extends a previous call, but it "
                    "is the first call recorded"
                )
            head = prev.prompt_ids + prev.completion_ids
            if c.prompt_ids[: len(head)] != head:
                at = next(
                    (i for i, (x, y) in enumerate(zip(c.prompt_ids, head, strict=False)) if x != y),
                    min(len(c.prompt_ids), len(head)),
                )
                raise TokenAlignmentError(
                    f"call {c.index} of session {c.session_id} keeps the history but its prompt "
                    f"does not extend call {prev.index}'s prompt + completion ({len(head)} ids): "
                    f"first difference at token {at} of {len(c.prompt_ids)}"
                )
        steps.append(
            Step(
                prompt_ids=list(c.prompt_ids),
                response_ids=list(c.completion_ids),
                response_logprobs=list(c.logprobs),
                loss_mask=[1] * len(c.completion_ids),
                response_text=c.completion_text,
                policy_version=c.weight_version,
                generate_s=c.latency_s,
            )
        )
        prev = c
    return steps


class CallStore:
    """Calls per session: SQLite at `path` (durable) plus a bounded in-memory LRU."""

    def __init__(self, path: Path | str, max_sessions_in_memory: int = 256) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_sessions = max_sessions_in_memory
        self._mem: OrderedDict[str, list[CallRecord]] = OrderedDict()
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS calls (session_id TEXT, idx INTEGER, record TEXT, "
            "PRIMARY KEY (session_id, idx))"
        )
        self._db.commit()

    def add(self, rec: CallRecord) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO calls VALUES (?, ?, ?)",
                (rec.session_id, rec.index, json.dumps(asdict(rec))),
            )
            self._db.commit()
            self._mem.setdefault(rec.session_id, []).append(rec)
            self._mem.move_to_end(rec.session_id)
            while len(self._mem) > self.max_sessions:
                self._mem.popitem(last=False)  # still in SQLite

    def in_memory(self) -> int:
        return len(self._mem)

    def calls(self, session_id: str) -> list[CallRecord]:
        with self._lock:
            if session_id in self._mem:
                return list(self._mem[session_id])
            rows = self._db.execute(
                "SELECT record FROM calls WHERE session_id = ? ORDER BY idx", (session_id,)
            ).fetchall()
        return [CallRecord(**json.loads(r[0])) for r in rows]

    def consume(self, session_id: str) -> list[CallRecord]:
        """The session's calls, removed from memory and SQLite (its episode is consumed)."""
        calls = self.calls(session_id)
        with self._lock:
            self._mem.pop(session_id, None)
            self._db.execute("DELETE FROM calls WHERE session_id = ?", (session_id,))
            self._db.commit()
        return calls

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _text(content: Any) -> str:
    """OpenAI content (a string or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _tools_prompt(tools: list[dict[str, Any]]) -> str:
    lines = ["You can call these tools:"]
    for t in tools:
        fn = t.get("function", t)
        lines.append(
            f"- {fn.get('name')}: {fn.get('description', '')} "
            f"parameters: {json.dumps(fn.get('parameters', {}))}"
        )
    lines.append(
        'Call a tool with <tool_call>{"name": NAME, "arguments": {...}}</tool_call>, '
        "one call per reply."
    )
    return "\n".join(lines)


@dataclass
class _SessionState:
    replica: int
    calls: int = 0
    #: normalised messages of the last call, and the normalised assistant message returned
    last_messages: list[dict[str, str]] = field(default_factory=list)
    last_reply: dict[str, str] | None = None
    last_prompt: list[int] = field(default_factory=list)
    last_completion: list[int] = field(default_factory=list)
    last_finished: bool = True


class ModelGateway:
    """Serves chat completions for sessions from `engines` and records every call."""

    def __init__(
        self,
        engines: list[InferenceEngine],
        tokenizer: Any,
        store: CallStore,
        *,
        model_name: str = "sandgym-policy",
        default_params: SamplingParams | None = None,
        max_new_tokens_cap: int = 1024,
    ) -> None:
        if not engines:
            raise GatewayError("the gateway needs at least one engine replica")
        self.engines = engines
        self.tokenizer = tokenizer
        self.store = store
        self.model_name = model_name
        self.default_params = default_params or SamplingParams()
        self.max_new_tokens_cap = max_new_tokens_cap
        # per-session chat state, bounded like the store: a session evicted here (never
        # consumed) starts a new sequence at its next call, which is still exact, only unmerged
        self._sessions: OrderedDict[str, _SessionState] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    # -- sessions --------------------------------------------------------------------------------
    def new_session(self) -> str:
        return "gw-" + uuid.uuid4().hex[:16]

    def base_url(self, root: str, session_id: str) -> str:
        """The OpenAI base URL a harness uses for this session."""
        return f"{root.rstrip('/')}/sessions/{session_id}/v1"

    def _state(self, sid: str) -> _SessionState:
        st = self._sessions.get(sid)
        if st is None:
            load = [0] * len(self.engines)
            for s in self._sessions.values():
                load[s.replica] += 1
            st = _SessionState(replica=min(range(len(load)), key=lambda i: load[i]))
            self._sessions[sid] = st
            while len(self._sessions) > self.store.max_sessions:
                old, _ = self._sessions.popitem(last=False)
                self._locks.pop(old, None)
        self._sessions.move_to_end(sid)
        return st

    def consume(self, sid: str) -> list[CallRecord]:
        """The session's recorded calls (then forgotten): call when its episode is consumed."""
        self._sessions.pop(sid, None)
        self._locks.pop(sid, None)
        return self.store.consume(sid)

    def steps(self, sid: str, consume: bool = True) -> list[Step]:
        calls = self.consume(sid) if consume else self.store.calls(sid)
        if not calls:
            raise UnknownSessionError(f"no calls recorded for gateway session {sid!r}")
        return calls_to_steps(calls)

    # -- prompt building -------------------------------------------------------------------------
    def _normalize(self, messages: list[dict[str, Any]], tools: list[Any]) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for m in messages:
            role = m.get("role")
            if role == "assistant":
                out.append({"role": "assistant", "content": self._assistant_text(m)})
            elif role == "tool":
                name = m.get("name") or "tool"
                out.append(
                    {"role": "user", "content": f"[{name} result]\n{_text(m.get('content'))}"}
                )
            elif role in ("system", "developer"):
                out.append({"role": "system", "content": _text(m.get("content"))})
            else:
                out.append({"role": "user", "content": _text(m.get("content"))})
        if tools:
            if out and out[0]["role"] == "system":
                out[0] = {
                    "role": "system",
                    "content": out[0]["content"] + "\n\n" + _tools_prompt(tools),
                }
            else:
                out.insert(0, {"role": "system", "content": _tools_prompt(tools)})
        return out

    @staticmethod
    def _assistant_text(m: dict[str, Any]) -> str:
        text = _text(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            args = fn.get("arguments", "{}")
            try:
                args_obj = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                args_obj = args
            if f'"name": "{fn.get("name")}"' in text:
                continue  # the raw reply already holds this call
            call_json = json.dumps({"name": fn.get("name"), "arguments": args_obj})
            text += f"\n<tool_call>{call_json}</tool_call>"
        return text

    def _render(self, msgs: list[dict[str, str]], gen: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, st: _SessionState, msgs: list[dict[str, str]]) -> tuple[list[int], bool]:
        """(prompt ids, extends_previous) by the module's token rule."""
        n = len(st.last_messages)
        keeps = (
            st.last_reply is not None
            and n > 0
            and len(msgs) > n + 1
            and msgs[:n] == st.last_messages
        )
        if not keeps:
            return self._encode(self._render(msgs, gen=True)), False
        assert st.last_reply is not None
        if msgs[n] == st.last_reply:
            before = self._render(msgs[: n + 1], gen=False)
            after = self._render(msgs, gen=True)
            eos_text = self.tokenizer.eos_token or ""
            cut = before.rfind(eos_text) if eos_text else -1
            if after.startswith(before) and cut >= 0:
                ids = st.last_prompt + st.last_completion
                if not st.last_finished and self.tokenizer.eos_token_id is not None:
                    ids = ids + [self.tokenizer.eos_token_id]
                between = before[cut + len(eos_text) :] + after[len(before) :]
                return ids + self._encode(between), True
        # the history was kept but the model's reply was changed (or the template re-renders
        # earlier turns): re-render; calls_to_steps will refuse to train on this call
        return self._encode(self._render(msgs, gen=True)), True

    # -- the endpoint ----------------------------------------------------------------------------
    async def chat(self, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion for session `sid` (an OpenAI request body); records the call."""
        resp, _ids = await self._chat(sid, body)
        return resp

    def token_deltas(self, ids: list[int]) -> list[str]:
        """The text each of `ids` adds to the decoded reply (special tokens skipped), in order;
        joined, they are the whole decoded text. A token ending inside a multi-byte character
        adds "" and its bytes arrive with a later token."""
        deltas: list[str] = []
        sent = ""
        for i in range(len(ids)):
            text = str(self.tokenizer.decode(ids[: i + 1], skip_special_tokens=True))
            if text.endswith("\ufffd") or not text.startswith(sent):
                deltas.append("")  # an incomplete character (or a merge): wait for more
                continue
            deltas.append(text[len(sent) :])
            sent = text
        full = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        if deltas and full.startswith(sent):
            deltas[-1] += full[len(sent) :]
        elif deltas:  # decoding was not prefix-stable: correct it in the last chunk
            deltas = ["" for _ in deltas]
            deltas[-1] = full
        return deltas

    async def _chat(self, sid: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        lock = self._locks.setdefault(sid, asyncio.Lock())
        async with lock:  # one call at a time per session keeps the token chain well defined
            st = self._state(sid)
            tools = list(body.get("tools") or [])
            msgs = self._normalize(list(body.get("messages") or []), tools)
            if not msgs:
                raise GatewayError("chat completion request has no messages")
            prompt, extends = self.prompt_ids(st, msgs)
            d = self.default_params
            max_new = (
                body.get("max_completion_tokens") or body.get("max_tokens") or d.max_new_tokens
            )
            params = SamplingParams(
                temperature=float(body.get("temperature", d.temperature)),
                top_p=float(body.get("top_p", d.top_p)),
                max_new_tokens=min(int(max_new), self.max_new_tokens_cap),
                top_k=int(body.get("top_k", d.top_k)),
            )
            engine = self.engines[st.replica]
            t0 = time.monotonic()
            gen = await engine.agenerate(prompt, params)
            latency = time.monotonic() - t0
            text = str(self.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
            message, finish = self._reply_message(text, tools, gen.finish_reason)
            rec = CallRecord(
                session_id=sid,
                index=st.calls,
                prompt_ids=prompt,
                completion_ids=list(gen.token_ids),
                logprobs=list(gen.logprobs),
                weight_version=gen.version,
                latency_s=latency,
                extends_previous=extends,
                completion_text=text,
                finish_reason=gen.finish_reason,
                replica=st.replica,
            )
            await asyncio.to_thread(self.store.add, rec)
            st.calls += 1
            st.last_messages = msgs
            st.last_reply = {"role": "assistant", "content": self._assistant_text(message)}
            st.last_prompt, st.last_completion = prompt, list(gen.token_ids)
            st.last_finished = gen.finish_reason == "stop"
        resp = {
            "id": f"chatcmpl-{sid}-{rec.index}",
            "object": "chat.completion",
            "created": int(rec.created_at),
            "model": self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(gen.token_ids),
                "total_tokens": len(prompt) + len(gen.token_ids),
            },
        }
        return resp, list(gen.token_ids)

    def _reply_message(
        self, text: str, tools: list[dict[str, Any]], engine_finish: str
    ) -> tuple[dict[str, Any], str]:
        finish = "stop" if engine_finish == "stop" else "length"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if not tools:
            return message, finish
        names = [t.get("function", t).get("name") for t in tools]
        command_tool = next(
            (
                t.get("function", t).get("name")
                for t in tools
                if "command" in (t.get("function", t).get("parameters", {}).get("properties") or {})
            ),
            None,
        )
        parsed = parse_action(text)
        calls = []
        if parsed.action is not None and command_tool is not None:
            args = {"command": parsed.action.get("command", "")}
            calls.append((command_tool, args))
        if parsed.submit and "submit" in names:
            calls.append(("submit", {}))
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for name, args in calls
            ]
            finish = "tool_calls"
        return message, finish

    def app(self) -> Any:
        """The FastAPI application."""
        from fastapi import FastAPI, HTTPException
        from fastapi.responses import JSONResponse, StreamingResponse

        app = FastAPI(title="sandgym model gateway")

        @app.get("/sessions/{sid}/v1/models")
        async def models(sid: str) -> dict[str, Any]:
            return {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "owned_by": "sandgym"}],
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
                resp, ids = await self._chat(sid, body)
            except GatewayError as exc:
                return JSONResponse({"error": {"message": str(exc), "type": "gateway"}}, 400)
            if not body.get("stream"):
                return resp
            deltas = await asyncio.to_thread(self.token_deltas, ids)
            return StreamingResponse(_sse(resp, deltas), media_type="text/event-stream")

        return app


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


class GatewayServer:
    """Serves a gateway with uvicorn on this event loop (so it shares the engines' batcher).

    `async with GatewayServer(gw, port=0) as srv: srv.root` -> "http://127.0.0.1:PORT"."""

    def __init__(self, gateway: ModelGateway, host: str = "127.0.0.1", port: int = 0) -> None:
        self.gateway = gateway
        self.host, self.port = host, port
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> GatewayServer:
        import uvicorn

        config = uvicorn.Config(
            self.gateway.app(), host=self.host, port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise GatewayError("the gateway server stopped while starting")
            await asyncio.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task
