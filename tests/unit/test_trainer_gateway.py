"""The model gateway over HTTP (in-process ASGI) with a scripted engine as the model's double:
OpenAI wire shapes, tool calls, SSE, recording, the token rule, storage bounds and replicas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgym.trainer.config import ModelSettings
from sandgym.trainer.engines.base import Generation, InferenceEngine, SamplingParams
from sandgym.trainer.gateway import (
    CallStore,
    MissingTokensError,
    ModelGateway,
    TokenAlignmentError,
    UnknownSessionError,
    calls_to_steps,
    gateway_app,
)
from sandgym.trainer.models import load_tokenizer

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
SUBMIT = {"type": "function", "function": {"name": "submit", "description": "finish"}}


class ScriptedEngine(InferenceEngine):
    """Test double for the model: fixed replies in order, + end token, logprob -0.25 each."""

    def __init__(self, tok: Any, replies: list[str], version: int = 3) -> None:
        super().__init__(batch_wait_s=0.0)
        self.tok, self.replies, self.version = tok, list(replies), version
        self.prompts: list[list[int]] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            ids = self.tok(self.replies.pop(0), add_special_tokens=False)["input_ids"]
            ids = ids + [self.tok.eos_token_id]
            out.append(Generation(ids, [-0.25] * len(ids), "stop"))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(ModelSettings(source="tiny"))


def _client(gw: ModelGateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gateway_app(gw)), base_url="http://gw"
    )


async def test_tool_calls_history_and_exact_steps(tok: Any, tmp_path: Path) -> None:
    engine = ScriptedEngine(tok, ["```bash\nls /app\n```", "All done. <submit/>"])
    gw = ModelGateway([engine], tok, CallStore(tmp_path / "calls.sqlite"))
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You solve tasks."},
        {"role": "user", "content": "List /app."},
    ]
    async with _client(gw) as c:
        models = (await c.get("/sessions/s1/v1/models")).json()
        assert models["data"][0]["id"] == "sandgym-policy"
        r = await c.post(
            "/sessions/s1/v1/chat/completions", json={"messages": msgs, "tools": [BASH, SUBMIT]}
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "bash"
        assert json.loads(call["function"]["arguments"]) == {"command": "ls /app"}
        msgs += [
            choice["message"],
            {"role": "tool", "tool_call_id": call["id"], "name": "bash", "content": "a.txt\n"},
        ]
        r2 = await c.post(
            "/sessions/s1/v1/chat/completions", json={"messages": msgs, "tools": [BASH, SUBMIT]}
        )
        assert [
            t["function"]["name"] for t in r2.json()["choices"][0]["message"]["tool_calls"]
        ] == ["submit"]
    calls = gw.store.calls("s1")
    assert [c.extends_previous for c in calls] == [False, True]
    assert all(c.weight_version == 3 and c.replica == 0 for c in calls)
    # what the engine saw is what was recorded, and the second prompt extends the first
    assert [c.prompt_ids for c in calls] == engine.prompts
    steps = gw.steps("s1")
    assert len(steps) == 2 and steps[0].response_logprobs == [-0.25] * len(steps[0].response_ids)
    head = steps[0].prompt_ids + steps[0].response_ids
    assert steps[1].prompt_ids[: len(head)] == head
    assert "a.txt" in tok.decode(steps[1].prompt_ids[len(head) :])
    with pytest.raises(UnknownSessionError):
        gw.steps("s1")  # consumed: removed from memory and SQLite


async def test_stream_sends_sse_chunks(tok: Any, tmp_path: Path) -> None:
    gw = ModelGateway(
        [ScriptedEngine(tok, ["```bash\necho hi\n```"])], tok, CallStore(tmp_path / "c.db")
    )
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [BASH], "stream": True}
    async with _client(gw) as c:
        r = await c.post("/sessions/s/v1/chat/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # one content chunk per generated token that adds text (the end token adds none)
    (rec,) = gw.store.calls("s")
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:]]
    content = [t for t in texts if t is not None]
    assert "".join(content) == rec.completion_text == "```bash\necho hi\n```"
    assert len(content) == len(rec.completion_ids) - 1 and all(content)
    assert chunks[-2]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "bash"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == len(rec.completion_ids)


def test_token_deltas_hold_back_split_characters(tok: Any, tmp_path: Path) -> None:
    gw = ModelGateway([ScriptedEngine(tok, [])], tok, CallStore(tmp_path / "c.db"))
    text = "héllo 🦩 wörld 龘"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    deltas = gw.token_deltas(ids)
    assert len(deltas) == len(ids) and "".join(deltas) == text
    assert "\ufffd" not in "".join(deltas)
    assert deltas.count("") >= 4 + 1  # two 3-token characters wait twice each; the end token
    assert deltas[-1] == ""  # the end token adds no text


async def test_an_edited_reply_is_refused_not_retokenised(tok: Any, tmp_path: Path) -> None:
    gw = ModelGateway(
        [ScriptedEngine(tok, ["first answer", "second"])], tok, CallStore(tmp_path / "c.db")
    )
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    async with _client(gw) as c:
        await c.post("/sessions/e/v1/chat/completions", json={"messages": msgs})
        msgs += [
            {"role": "assistant", "content": "an EDITED answer"},
            {"role": "user", "content": "q2"},
        ]
        await c.post("/sessions/e/v1/chat/completions", json={"messages": msgs})
        r = await c.post("/sessions/e/v1/chat/completions", json={"messages": "nope"})
        assert r.status_code == 400
    assert [c.extends_previous for c in gw.store.calls("e")] == [False, True]
    with pytest.raises(TokenAlignmentError, match="does not extend call 0"):
        gw.steps("e", consume=False)


async def test_a_new_conversation_in_a_session_is_a_new_sequence(tok: Any, tmp_path: Path) -> None:
    gw = ModelGateway([ScriptedEngine(tok, ["a", "b"])], tok, CallStore(tmp_path / "c.db"))
    async with _client(gw) as c:
        for q in ("one", "two"):
            await c.post(
                "/sessions/n/v1/chat/completions",
                json={"messages": [{"role": "user", "content": q}]},
            )
    assert len(gw.steps("n")) == 2


def test_missing_tokens_are_named(tok: Any, tmp_path: Path) -> None:
    from sandgym.trainer.gateway import CallRecord

    rec = CallRecord("s", 0, [1, 2], [], [], 0, 0.1, False, "", "stop", 0)
    with pytest.raises(MissingTokensError, match="0 completion ids"):
        calls_to_steps([rec])
    rec2 = CallRecord("s", 0, [1, 2], [3], [], 0, 0.1, False, "", "stop", 0)
    with pytest.raises(MissingTokensError, match="0 logprobs for 1"):
        calls_to_steps([rec2])


async def test_store_is_bounded_in_memory_durable_in_sqlite(tok: Any, tmp_path: Path) -> None:
    store = CallStore(tmp_path / "run" / "gateway.sqlite", max_sessions_in_memory=2)
    gw = ModelGateway([ScriptedEngine(tok, ["x"] * 4)], tok, store)
    for sid in ("a", "b", "c", "d"):
        await gw.chat(sid, {"messages": [{"role": "user", "content": sid}]})
    assert store.in_memory() == 2
    again = CallStore(tmp_path / "run" / "gateway.sqlite")  # a new process sees them all
    assert [len(again.calls(s)) for s in "abcd"] == [1, 1, 1, 1]
    assert len(store.calls("a")) == 1 and store.consume("a") and store.calls("a") == []


async def test_sessions_stick_to_the_least_loaded_replica(tok: Any, tmp_path: Path) -> None:
    engines = [ScriptedEngine(tok, ["x"] * 4), ScriptedEngine(tok, ["y"] * 4)]
    gw = ModelGateway(engines, tok, CallStore(tmp_path / "c.db"))
    for sid in ("s1", "s2", "s1", "s2"):
        await gw.chat(sid, {"messages": [{"role": "user", "content": "q"}]})
    assert {c.replica for c in gw.store.calls("s1")} == {0}
    assert {c.replica for c in gw.store.calls("s2")} == {1}
    assert len(engines[0].prompts) == len(engines[1].prompts) == 2


async def test_the_official_openai_client_gets_tool_calls_and_streams(
    tok: Any, tmp_path: Path
) -> None:
    """What a harness built on the `openai` SDK does: a tool call, then a streamed reply."""
    openai = pytest.importorskip("openai")
    engine = ScriptedEngine(tok, ["```bash\nls /app\n```", "Done, it holds a.txt."])
    gw = ModelGateway([engine], tok, CallStore(tmp_path / "o.db"))
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gateway_app(gw)), base_url="http://gw"
    )
    client = openai.AsyncOpenAI(
        base_url="http://gw/sessions/sdk/v1", api_key="unused", http_client=http
    )
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "What is in /app?"}]
    async with http:
        first = await client.chat.completions.create(
            model="sandgym-policy",
            messages=msgs,
            tools=[BASH, SUBMIT],  # type: ignore[arg-type]
        )
        (call,) = first.choices[0].message.tool_calls or []
        assert first.choices[0].finish_reason == "tool_calls"
        assert json.loads(call.function.arguments) == {"command": "ls /app"}
        msgs += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "a.txt\n"},
        ]
        stream = await client.chat.completions.create(
            model="sandgym-policy",
            messages=msgs,  # type: ignore[arg-type]
            tools=[BASH, SUBMIT],  # type: ignore[list-item]
            stream=True,
        )
        pieces, finish = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    assert "".join(pieces) == "Done, it holds a.txt." and len(pieces) > 1
    assert finish == "stop"
    steps = gw.steps("sdk")  # both calls recorded, the second extending the first
    assert len(steps) == 2
    head = steps[0].prompt_ids + steps[0].response_ids
    assert steps[1].prompt_ids[: len(head)] == head


def test_a_call_finishing_after_its_episode_was_consumed_is_dropped(tmp_path: Path) -> None:
    """A generation still in flight when its episode was cancelled lands after `consume`:
    it must not stay in the store (the trainer's run dir would keep it for ever)."""
    import sqlite3

    from sandgym.trainer.gateway.records import CallRecord

    def rec(sid: str, i: int) -> CallRecord:
        return CallRecord(sid, i, [1], [2], [-0.1], 0, 0.01, False, "x", "stop", 0)

    store = CallStore(tmp_path / "c.db")
    store.add(rec("done", 0))
    assert [c.index for c in store.consume("done")] == [0]
    store.add(rec("done", 1))  # late: its episode is gone
    store.add(rec("live", 0))
    assert store.calls("done") == [] and store.late_calls_dropped == 1
    with sqlite3.connect(store.path) as db:
        assert db.execute("SELECT session_id FROM calls").fetchall() == [("live",)]


class FailingEngine(ScriptedEngine):
    """The scripted model, whose generation raises `error` (the engine's own failure)."""

    def __init__(self, tok: Any, error: Exception) -> None:
        super().__init__(tok, [])
        self.error = error

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        raise self.error


async def test_engine_failures_answer_as_openai_does_and_stay_with_the_session(
    tok: Any, tmp_path: Path
) -> None:
    # a prompt over the context: the request's own 400, code context_length_exceeded
    short = ScriptedEngine(tok, ["never sent"])
    short.max_context_tokens = 8
    gw = ModelGateway([short], tok, CallStore(tmp_path / "a.sqlite"))
    sid = gw.new_session()
    body = {"messages": [{"role": "user", "content": "list the files in /app, please"}]}
    async with _client(gw) as http:
        r = await http.post(f"/sessions/{sid}/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert type(gw.failure(sid)).__name__ == "PromptTooLongError"
    assert short.prompts == []  # refused before generating
    # the engine's own failure: a 503 (retryable), an EngineError kept for the session
    broken = FailingEngine(tok, RuntimeError("CUDA error: an illegal memory access"))
    gw = ModelGateway([broken], tok, CallStore(tmp_path / "b.sqlite"))
    sid = gw.new_session()
    async with _client(gw) as http:
        r = await http.post(f"/sessions/{sid}/v1/chat/completions", json=body)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "server_error" and "illegal memory" in r.text
    assert type(gw.failure(sid)).__name__ == "EngineError"
    assert gw.failure(gw.new_session()) is None  # another session met nothing
    gw.consume(sid)
    assert gw.failure(sid) is None  # forgotten with its calls
