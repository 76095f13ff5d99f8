"""sandgym/server/fastws.py overrides internals of uvicorn and websockets. It runs only on the
releases it was verified against, which constraints/server.txt (what setup, CI and the images
install) holds exactly; pyproject.toml allows a range, and on any other release, or with an
internal gone, the server logs one warning and uses uvicorn's own websockets-sansio protocol.

Upgrading: bump the constraints and `fastws.VERIFIED_AGAINST` together, after re-running
tests/e2e/test_server_frames.py and `sandgym bench sessions` against the new releases.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import re
import tomllib
from pathlib import Path

import pytest
from uvicorn.config import Config
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.protocol import State

from sandgym.server import fastws, runner
from sandgym.server.settings import ServerSettings

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints" / "server.txt"


def _constraints() -> dict[str, str]:
    """name (lowercase, `_` as `-`) -> the exact version constraints/server.txt pins."""
    out: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.partition("#")[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"constraints/server.txt: expected NAME==VERSION, found {line!r}"
        out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


@pytest.mark.parametrize("dist", sorted(fastws.VERIFIED_AGAINST))
def test_constraints_pin_the_verified_release(dist: str) -> None:
    verified = fastws.VERIFIED_AGAINST[dist]
    found = _constraints().get(dist)
    assert found == verified, (
        f"constraints/server.txt must pin {dist}=={verified} (fastws.VERIFIED_AGAINST), "
        f"found {found!r}"
    )


def test_metadata_allows_a_range_not_the_pin() -> None:
    """The pins live in the constraints file only: pyproject names uvicorn and websockets with a
    floor (pip may take a newer release beside a trainer; fastws then steps aside)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    named = [r for r in reqs if re.match(r"(uvicorn|websockets)\b", r)]
    assert len(named) >= 2, f"expected uvicorn and websockets among the requirements: {named}"
    pinned = [r for r in named if "==" in r or "<" in r]
    assert not pinned, f"an exact pin or cap on uvicorn/websockets in pyproject.toml: {pinned}"


@pytest.mark.parametrize("dist", sorted(fastws.VERIFIED_AGAINST))
def test_installed_release_is_the_verified_one(dist: str) -> None:
    """The project's own environment (setup.sh, with the constraints) runs the fast path."""
    installed = importlib.metadata.version(dist)
    verified = fastws.VERIFIED_AGAINST[dist]
    assert installed == verified, (
        f"sandgym/server/fastws.py was verified against {dist} {verified}, but {installed} is "
        "installed: install with -c constraints/server.txt (scripts/setup.sh), or re-verify its "
        "overrides and bump fastws.VERIFIED_AGAINST and the constraints together"
    )


def test_fast_path_is_chosen_on_the_verified_releases(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=runner.logger.name)
    assert fastws.missing_internals() == []
    assert runner.fastws_unusable() is None
    config = runner.uvicorn_config(None, ServerSettings())
    assert config.ws is fastws.FastWebSocketProtocol
    assert config.http is fastws.FastHttpToolsProtocol
    assert [r.getMessage() for r in caplog.records] == []


def _fallback_config(caplog: pytest.LogCaptureFixture) -> tuple[Config, list[str]]:
    caplog.set_level(logging.WARNING, logger=runner.logger.name)
    config = runner.uvicorn_config(None, ServerSettings())
    return config, [r.getMessage() for r in caplog.records if r.name == runner.logger.name]


def test_another_release_falls_back_to_the_stock_protocol_with_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.metadata.version

    def fake(dist: str) -> str:
        return "0.99.0" if dist == "uvicorn" else real(dist)

    monkeypatch.setattr(importlib.metadata, "version", fake)
    config, lines = _fallback_config(caplog)
    assert config.ws == "websockets-sansio", f"expected uvicorn's own protocol, got {config.ws!r}"
    assert config.http in ("httptools", "h11"), f"expected uvicorn's own http, got {config.http!r}"
    assert len(lines) == 1, f"expected one warning line, got {lines}"
    assert "uvicorn 0.99.0 is installed" in lines[0] and "0.54.0" in lines[0], lines[0]
    assert "\n" not in lines[0]


def test_a_missing_internal_falls_back_with_its_name(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(WebSocketsSansIOProtocol, "handle_parser_exception")
    assert fastws.missing_internals() == ["WebSocketsSansIOProtocol.handle_parser_exception"]
    config, lines = _fallback_config(caplog)
    assert config.ws == "websockets-sansio", f"expected uvicorn's own protocol, got {config.ws!r}"
    assert len(lines) == 1, f"expected one warning line, got {lines}"
    assert "WebSocketsSansIOProtocol.handle_parser_exception" in lines[0], lines[0]


def test_a_stock_choice_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=runner.logger.name)
    config = runner.uvicorn_config(None, ServerSettings(ws_impl="wsproto"))
    assert config.ws == "wsproto"
    assert [r.getMessage() for r in caplog.records] == []


# What fastws reads on uvicorn's protocol instance (attributes its __init__ sets): with the
# verified releases installed a rename shows up here by name (the run-time check sees classes only).
PROTOCOL_ATTRS = [
    "config", "conn", "queue", "loop", "logger", "tasks", "transport",
    "handshake_initiated", "handshake_complete", "close_sent", "disconnected", "read_paused",
    "writable", "initial_response", "frames", "asgi_version", "root_path", "app_state",
    "default_headers", "server", "client", "scheme",
]  # fmt: skip


async def _app(scope, receive, send):  # type: ignore[no-untyped-def]
    pass


async def test_uvicorn_instance_internals_fastws_uses_are_there() -> None:
    config = Config(app=_app, ws=fastws.FastWebSocketProtocol, http=fastws.FastHttpToolsProtocol)
    config.load()
    proto = fastws.FastWebSocketProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    missing = [a for a in PROTOCOL_ATTRS if not hasattr(proto, a)]
    missing += [f"conn.{a}" for a in fastws.CONN_ATTRS if not hasattr(proto.conn, a)]
    assert not missing, f"uvicorn/websockets internals fastws relies on are gone: {missing}"
    assert proto.conn.state is State.CONNECTING
    assert issubclass(ClientDisconnected, Exception)


def test_websockets_c_mask_function() -> None:
    masked = fastws.apply_mask(b"abcd", b"\x01\x02\x03\x04")
    assert fastws.apply_mask(masked, b"\x01\x02\x03\x04") == b"abcd"
    import inspect

    assert inspect.isbuiltin(fastws.apply_mask), "websockets' C extension (speedups) is missing"
