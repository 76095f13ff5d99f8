"""An ASGI app served by uvicorn on the running event loop, so its handlers share that loop's
engines (and their batchers): the base of the model gateway's `GatewayServer` and the engines'
`CompletionsServer`.

    async with SomeServer(...) as srv: ...   # srv.port is the bound port (0 asks for any free one)
"""

from __future__ import annotations

import asyncio
from typing import Any


class LoopServer:
    """uvicorn on this event loop; subclasses give the app (`make_app`) and the error raised when
    the server stops while starting (`start_error`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    def make_app(self) -> Any:
        raise NotImplementedError

    def start_error(self) -> Exception:
        return RuntimeError(f"{type(self).__name__} stopped while starting")

    async def __aenter__(self) -> Any:
        import uvicorn

        config = uvicorn.Config(
            self.make_app(), host=self.host, port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise self.start_error()
            await asyncio.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task
