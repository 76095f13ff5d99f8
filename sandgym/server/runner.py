"""Run the env server under uvicorn: in the foreground (`sandgym serve`) or in a background thread
(`sandgym run` without `--server`, tests, benchmarks).

The uvicorn settings that matter for step latency live here in one place: the websocket
implementation (`ServerSettings.ws_impl`), no per-request access log, the frame size cap and
keepalive pings.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from typing import Any

import uvicorn

from sandgym.sandboxes import SandboxBackend
from sandgym.server.app import create_app
from sandgym.server.settings import ServerSettings


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _use_uvloop(settings: ServerSettings) -> bool:
    """uvloop cuts the server's CPU per step (socket writes, reader (un)registration)."""
    if settings.event_loop == "asyncio":
        return False
    if settings.event_loop == "uvloop" or _installed("uvloop"):
        return True
    return False


def new_event_loop(settings: ServerSettings) -> asyncio.AbstractEventLoop:
    """A fresh event loop of the kind `settings.event_loop` asks for."""
    if _use_uvloop(settings):
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


logger = logging.getLogger(__name__)

#: uvicorn's own protocol, used where fastws steps aside
STOCK_WS = "websockets-sansio"


def fastws_unusable() -> str | None:
    """Why sandgym's websocket path (sandgym/server/fastws.py) cannot run on the installed uvicorn
    and websockets (None: it can): it cannot be imported, the releases are not the verified
    ones, or an internal it overrides is gone."""
    try:
        # lazy: fastws overrides uvicorn/websockets internals: its import can fail on unverified
        # releases, and the caller falls back
        from sandgym.server import fastws
    except ImportError as exc:
        return f"sandgym.server.fastws cannot be imported ({exc})"
    return fastws.unusable_reason()


def effective_ws_impl(requested: str) -> str:
    """`ServerSettings.ws_impl` as it will run: "sandgym" falls back to uvicorn's own
    websockets-sansio protocol, with one warning line, where fastws cannot run."""
    if requested != "sandgym":
        return requested
    reason = fastws_unusable()
    if reason is None:
        return requested
    logger.warning(
        "ws_impl=sandgym: %s; using uvicorn's %s protocol instead (pip install -c "
        "constraints/server.txt pins the verified releases)",
        reason,
        STOCK_WS,
    )
    return STOCK_WS


def _http_protocol(ws_impl: str) -> Any:
    """uvicorn's `http` setting: httptools when installed (ours under `ws_impl = "sandgym"`)."""
    if not _installed("httptools"):
        return "h11"
    if ws_impl == "sandgym":
        # lazy: fastws overrides uvicorn/websockets internals: its import can fail on unverified
        # releases, and the caller falls back
        from sandgym.server.fastws import FastHttpToolsProtocol

        return FastHttpToolsProtocol
    return "httptools"


def _ws_protocol(name: str) -> Any:
    """uvicorn's `ws` setting for `ServerSettings.ws_impl`: our protocol class, or uvicorn's name."""
    if name == "sandgym":
        # lazy: fastws overrides uvicorn/websockets internals: its import can fail on unverified
        # releases, and the caller falls back
        from sandgym.server.fastws import FastWebSocketProtocol

        return FastWebSocketProtocol
    return name


def uvicorn_config(app: Any, settings: ServerSettings, **overrides: Any) -> uvicorn.Config:
    ws_impl = effective_ws_impl(settings.ws_impl)
    kwargs: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "ws": _ws_protocol(ws_impl),
        "ws_per_message_deflate": settings.ws_per_message_deflate,
        "http": _http_protocol(ws_impl),
        "loop": "uvloop" if _use_uvloop(settings) else "asyncio",
        "lifespan": "on",
        "access_log": False,
        "log_level": "warning",
        # Frames up to 4x the app's limit reach the app, which answers `invalid_message` and
        # keeps the connection; only beyond that does the protocol layer drop the connection.
        "ws_max_size": settings.max_message_bytes * 4,
        "ws_ping_interval": settings.ping_interval_s,
        "ws_ping_timeout": settings.ping_timeout_s,
        "timeout_graceful_shutdown": 5,
    }
    kwargs.update(overrides)
    return uvicorn.Config(app, **kwargs)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 = any free port) handed to uvicorn, so the port is known."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


_PER_CONNECTION_LINES = frozenset({"connection open", "connection closed"})


class _DropPerConnectionLines(logging.Filter):
    """Drops the INFO lines uvicorn and websockets log for every websocket ("[accepted]",
    "connection open", "connection closed"): with thousands of sessions they are noise, and
    formatting them cost ~3% of the server's CPU in the sessions benchmark."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if not isinstance(msg, str) or record.levelno != logging.INFO:
            return True
        return not (msg in _PER_CONNECTION_LINES or msg.endswith('" [accepted]'))


_ACCEPTED_FILTER = _DropPerConnectionLines()


class BackgroundServer:
    """An env server in a thread of this process. Use as a context manager.

    Example:
        >>> from sandgym.server.settings import ServerSettings
        >>> with BackgroundServer(ServerSettings(backend="null", port=0)) as srv:
        ...     srv.url.startswith("ws://127.0.0.1:")
        True
    """

    def __init__(
        self,
        settings: ServerSettings,
        backend: SandboxBackend | None = None,
        startup_timeout_s: float = 60.0,
        **uvicorn_overrides: Any,
    ) -> None:
        self.settings = settings
        self.app = create_app(settings, backend)
        self._sock = bind_socket(settings.host, settings.port)
        self.port: int = self._sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn_config(self.app, settings, port=self.port, **uvicorn_overrides)
        )
        # After uvicorn.Config configured logging (it leaves existing filters in place).
        logging.getLogger("uvicorn.error").addFilter(_ACCEPTED_FILTER)
        self._thread = threading.Thread(target=self._run, name="sandgym-server", daemon=True)
        self._startup_timeout_s = startup_timeout_s
        self._error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def service(self) -> Any:
        return self.app.state.service

    @property
    def url(self) -> str:
        return f"ws://{self.settings.host}:{self.port}/v1/env"

    @property
    def http_url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def _run(self) -> None:
        try:
            loop = new_event_loop(self.settings)
            self.loop = loop
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._server.serve(sockets=[self._sock]))
        except BaseException as exc:  # reported by start()
            self._error = exc

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                died = not self._thread.is_alive()
                self.stop()
                raise RuntimeError(
                    "env server failed during startup (see its log above)"
                    if died
                    else f"env server did not start within {self._startup_timeout_s:g}s"
                )
            time.sleep(0.01)
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 180.0) -> None:
        """Shut down gracefully: episodes end and the pool destroys its sandboxes first."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(settings: ServerSettings, backend: SandboxBackend | None = None) -> None:
    """Run the server until SIGINT/SIGTERM, then drain it and return (exit status 0).

    uvicorn, run on the main thread, re-raises the signal after its graceful shutdown, so the
    process would die "by SIGTERM" (status 143 in a container) even after a clean drain. Here
    the server runs on a thread and the main thread owns the signals instead.
    """
    import gc
    import signal
    import threading

    if settings.gc_gen0_threshold is not None:
        # Fewer collections: every request allocates pydantic models, dicts, futures and a
        # task, so the default threshold (700) ran the collector every few requests.
        gc.set_threshold(settings.gc_gen0_threshold, 10, 10)
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        srv = BackgroundServer(settings, backend, log_level="info")
        srv.start()
        if settings.gc_gen0_threshold is not None:
            gc.freeze()  # what startup built (modules, app, task registry) is never scanned again
        # Between its startup and shutdown lines uvicorn.error logs at INFO only a line or
        # three per websocket; even filtered out, building those records cost ~6% of the
        # server's CPU per session in the sessions benchmark. Warnings still show.
        uv_log = logging.getLogger("uvicorn.error")
        level = uv_log.level
        uv_log.setLevel(logging.WARNING)
        try:
            while srv.running and not stop.wait(0.5):
                pass
        finally:
            uv_log.setLevel(level)
            srv.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`sandgym serve` in a child process (benchmarks read its RSS; tests kill it).

    Extra `serve` flags go in `args`; `env` adds `SANDGYM_*` variables. Waits for `/healthz`.
    """

    def __init__(
        self,
        backend: str = "null",
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 60.0,
    ) -> None:
        import subprocess
        import sys

        self.host = host
        self.port = free_port(host)
        cmd = [sys.executable, "-m", "sandgym.server.serve_cli", "--host", host,
               "--port", str(self.port), "--backend", backend, *(args or [])]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL
        )
        self._wait_healthy(startup_timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"env server exited with {self.proc.returncode} at startup")
            try:
                if httpx.get(f"{self.http_url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"env server did not answer /healthz within {timeout_s:g}s")

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/env"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def rss_bytes(self) -> int:
        """Resident set size of the server process (psutil: the `lab` extra; only the
        benchmarks and their tests read these figures, so a server install goes without it)."""
        import psutil

        return int(psutil.Process(self.pid).memory_info().rss)

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far (psutil, as above)."""
        import psutil

        t = psutil.Process(self.pid).cpu_times()
        return float(t.user + t.system)

    def stop(self) -> None:
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
