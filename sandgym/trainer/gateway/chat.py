"""Chat handling of the model gateway: `ModelGateway` turns an OpenAI chat request into one
engine generation for its session, with exact prompt token ids, and records the call.

A session sticks to one engine replica (the one with the fewest sessions when it first calls).

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
native tool template); the reply is parsed with `sandgym.trainer.agents.parse_action` (a ```bash block,
a JSON / <tool_call> call), and a command becomes a `tool_calls` entry for the first offered tool
that takes a `command` argument; `submit` becomes a call of a tool named `submit` when offered.
Assistant turns with `tool_calls` and `tool` results in the history are rendered back as text.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sandgym.trainer.agents import parse_action
from sandgym.trainer.engines.base import EngineError, InferenceEngine, SamplingParams
from sandgym.trainer.episode import Step
from sandgym.trainer.gateway.errors import GatewayError, UnknownSessionError
from sandgym.trainer.gateway.records import CallRecord, CallStore, calls_to_steps


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
        #: the first engine failure of each session's calls, kept until the session is consumed:
        #: the harness saw an HTTP error, and its episode ends by that failure's cause
        #: (`failure`, sandgym/trainer/failures.py), never by what the verifier makes of it
        self._failures: dict[str, EngineError] = {}

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
        self._failures.pop(sid, None)
        return self.store.consume(sid)

    def failure(self, sid: str) -> EngineError | None:
        """The first engine failure one of the session's calls met (None when none did): a
        `PolicyOutputError` the session's own request caused (a prompt over the context), or an
        `EngineError` of the inference engine."""
        return self._failures.get(sid)

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
        resp, _ids = await self.complete(sid, body)
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

    async def complete(self, sid: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        """`chat`, and the generated token ids (what streaming decodes chunk by chunk)."""
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
            try:
                gen = await engine.agenerate(prompt, params)
            except EngineError as exc:
                self._failures.setdefault(sid, exc)
                raise
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
