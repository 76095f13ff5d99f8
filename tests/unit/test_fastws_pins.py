"""sandgym/server/fastws.py overrides internals of uvicorn and websockets: the installed releases must
be the ones it was verified against (pinned exactly in pyproject.toml), and every internal it
touches must still be there, so an upgrade fails here loudly instead of changing behaviour.

Upgrading: bump the pins and `fastws.VERIFIED_AGAINST` together, after re-running
tests/e2e/test_server_frames.py and `sandgym bench sessions` against the new releases.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import re
import tomllib
from pathlib import Path

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.protocol import Protocol, Side, State

from sandgym.server import fastws

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _pins() -> dict[str, str]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)", dep)
        assert m, dep
        out[m.group(1).lower()] = m.group(3)
    return out


@pytest.mark.parametrize("dist", sorted(fastws.VERIFIED_AGAINST))
def test_pyproject_pins_the_verified_release(dist: str) -> None:
    verified = fastws.VERIFIED_AGAINST[dist]
    assert _pins()[dist] == f"=={verified}", (
        f"pyproject.toml must pin {dist}=={verified} (fastws.VERIFIED_AGAINST), "
        f"found {_pins()[dist]!r}"
    )


@pytest.mark.parametrize("dist", sorted(fastws.VERIFIED_AGAINST))
def test_installed_release_is_the_verified_one(dist: str) -> None:
    installed = importlib.metadata.version(dist)
    verified = fastws.VERIFIED_AGAINST[dist]
    assert installed == verified, (
        f"sandgym/server/fastws.py was verified against {dist} {verified}, but {installed} is "
        "installed: re-verify its overrides (tests/e2e/test_server_frames.py, bench sessions) "
        "and bump fastws.VERIFIED_AGAINST and the pin in pyproject.toml together"
    )


# What fastws reads, calls or overrides on uvicorn's protocol instance (attributes set by its
# __init__, methods of the class); a rename in a new release shows up here by name.
PROTOCOL_ATTRS = [
    "config", "conn", "queue", "loop", "logger", "tasks", "transport",
    "handshake_initiated", "handshake_complete", "close_sent", "disconnected", "read_paused",
    "writable", "initial_response", "frames", "asgi_version", "root_path", "app_state",
    "default_headers", "server", "client", "scheme",
]  # fmt: skip
PROTOCOL_METHODS = [
    "data_received", "connection_lost", "on_task_complete", "pause_writing", "resume_writing",
    "send", "run_asgi", "start_keepalive", "handle_events", "handle_parser_exception",
]  # fmt: skip
CONN_ATTRS = ["reader", "parser", "parser_exc", "close_rcvd", "state", "receive_data", "send_close"]


async def _app(scope, receive, send):  # type: ignore[no-untyped-def]
    pass


async def test_uvicorn_internals_fastws_uses_are_there() -> None:
    config = Config(app=_app, ws=fastws.FastWebSocketProtocol, http=fastws.FastHttpToolsProtocol)
    config.load()
    proto = fastws.FastWebSocketProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    missing = [a for a in PROTOCOL_ATTRS if not hasattr(proto, a)] + [
        m for m in PROTOCOL_METHODS if not callable(getattr(WebSocketsSansIOProtocol, m, None))
    ]
    missing += [f"conn.{a}" for a in CONN_ATTRS if not hasattr(proto.conn, a)]
    if not hasattr(proto.conn, "reader") or not hasattr(proto.conn.reader, "buffer"):
        missing.append("conn.reader.buffer")
    for name in ("ws_max_size", "ws_per_message_deflate"):
        if not hasattr(config, name):
            missing.append(f"config.{name}")
    if not callable(getattr(HttpToolsProtocol, "handle_websocket_upgrade", None)):
        missing.append("HttpToolsProtocol.handle_websocket_upgrade")
    assert not missing, f"uvicorn/websockets internals fastws relies on are gone: {missing}"
    assert proto.conn.state is State.CONNECTING
    assert issubclass(ClientDisconnected, Exception)


def test_websockets_frame_layer_fastws_builds() -> None:
    """The frame-layer object fastws makes after its own handshake, and the C mask function."""
    params = inspect.signature(Protocol).parameters
    assert {"state", "max_size", "logger"} <= set(params), list(params)
    conn = Protocol(Side.SERVER, state=State.OPEN, max_size=1 << 20)
    for a in CONN_ATTRS:
        assert hasattr(conn, a), f"websockets Protocol has no {a!r}"
    masked = fastws.apply_mask(b"abcd", b"\x01\x02\x03\x04")
    assert fastws.apply_mask(masked, b"\x01\x02\x03\x04") == b"abcd"
    assert inspect.isbuiltin(fastws.apply_mask), "websockets' C extension (speedups) is missing"
