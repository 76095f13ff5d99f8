"""A websocket server that speaks just enough of the episode protocol (`/v1/env`) to end an
episode each way a runner must tell apart, from the wire models themselves:

- `scored`: a command step answers its output; `submit` ends the episode with reward 1.0;
- `action_timeout`: a command step answers the `action_timeout` error the real server sends for
  an action past its limit (a failure the agent can cause);
- `internal`: a command step answers `internal` (a server fault);
- `killed`: a command step kills the server (listener closed, every socket dropped), so the
  client's resume finds nothing: a lost connection mid-episode.

It records what it was sent (`received`) and whether an episode's `close` arrived (`closed`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from websockets.asyncio.server import Server, ServerConnection, serve

from sandgym.wire.codes import retryable_for
from sandgym.wire.protocol import (
    ClosedReply,
    ErrorReply,
    Observation,
    ObservationReply,
    StepResultReply,
)

Mode = Literal["scored", "action_timeout", "internal", "killed"]
INSTRUCTION = "write hello to /app/hello.txt"


class FakeEnvServer:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.received: list[dict[str, Any]] = []
        self.closed = 0
        self.killed = False
        self._server: Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/v1/env"

    async def __aenter__(self) -> FakeEnvServer:
        self._server = await serve(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _reply(self, msg: dict[str, Any]) -> Any:
        rid = msg["request_id"]
        if msg["type"] == "reset":
            return ObservationReply(
                request_id=rid,
                session_id="s-1",
                resume_token="tok",
                observation=Observation(output=INSTRUCTION),
                info={"task_id": msg["task_id"], "seed": msg.get("seed")},
            )
        if msg["type"] == "close":
            self.closed += 1
            return ClosedReply(request_id=rid, session_id="s-1")
        if msg["type"] == "resume":
            return ErrorReply(request_id=rid, code="no_episode", message="no such session")
        action = msg["action"]
        if action["kind"] == "submit":
            return StepResultReply(
                request_id=rid, observation=Observation(output="scored"), reward=1.0,
                terminated=True,
            )  # fmt: skip
        if self.mode in ("action_timeout", "internal"):
            code = self.mode
            return ErrorReply(
                request_id=rid, code=code, message=f"fake {code}",
                retryable=retryable_for("episode", code),
            )  # fmt: skip
        return StepResultReply(request_id=rid, observation=Observation(output="ok\n", exit_code=0))

    async def _handle(self, ws: ServerConnection) -> None:
        async for raw in ws:
            msg = json.loads(raw)
            self.received.append(msg)
            if (
                self.mode == "killed"
                and msg["type"] == "step"
                and msg["action"]["kind"] != "submit"
            ):
                self.killed = True
                assert self._server is not None
                self._server.close()  # no more listening, every connection dropped
                return
            await ws.send(self._reply(msg).model_dump_json())

    def steps(self) -> list[dict[str, Any]]:
        return [m["action"] for m in self.received if m["type"] == "step"]
