"""The servers `sandgym bench sessions` drives, each a child process, and what they run on.

- `sandgym_server`: `sandgym serve` on `--backend` (null by default) with the bench-echo task.
- `openenv_server`: OpenEnv's own server from the python at `--openenv-python`, started the way
  OpenEnv's environment template deploys one (its Dockerfile's `uvicorn server.app:app --host
  ... --port ...`, uvicorn's defaults otherwise), hosting a plain async echo environment written
  here (`--openenv-env plain`) or OpenEnv's shipped `envs/echo_env` (`mcp`). The current
  release is the `openenv` distribution; the old `openenv-core` is recognised and labelled.

Each server's stack (uvicorn, event loop, HTTP and websocket implementations, versions) is
recorded as that server's python resolves it. `pinned(cpus)` starts a child on given CPUs (a
child inherits the starting thread's affinity, and its threads inherit the child's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from lab.bench.step import write_bench_task
from sandgym.server.settings import ServerSettings

#: What OpenEnv's environment template runs (openenv/cli/templates/openenv_env/server/Dockerfile)
OPENENV_TEMPLATE_CMD = "uvicorn server.app:app --host 0.0.0.0 --port 8000"

#: The plain echo environment the bench hosts on OpenEnv's server (`create_app`, its `/ws`):
#: async reset/step, so the server awaits them on its loop (OpenEnv's fastest path, no executor
#: thread per session). Written by this bench; OpenEnv itself only provides the server.
#: `max_concurrent_envs` is raised to the bench's sessions, as the template's comment says to.
OPENENV_PLAIN_APP = """
import os
from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""


class PlainEcho(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kw: Any):
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation()

    async def reset_async(self, seed=None, episode_id=None, **kw):
        return self.reset(seed=seed, episode_id=episode_id, **kw)

    def step(self, action: EchoAction, timeout_s: Optional[float] = None, **kw: Any):
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message)

    async def step_async(self, action, timeout_s=None, **kw):
        return self.step(action, timeout_s=timeout_s, **kw)

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    PlainEcho, EchoAction, EchoObservation, env_name="plain_echo",
    max_concurrent_envs=int(os.environ["MAX_CONCURRENT_ENVS"]),
)
"""

#: Run in a server's python: the uvicorn stack its `auto` settings resolve to there.
_STACK_PROBE = r"""
import importlib.metadata as md, importlib.util as u, json
from uvicorn.config import HTTP_PROTOCOLS, WS_PROTOCOLS, Config
from uvicorn.importer import import_from_string

def ver(d):
    try:
        return md.version(d)
    except md.PackageNotFoundError:
        return None

def name(c):
    return f"{c.__module__}.{c.__qualname__}"

print(json.dumps({
    "loop": "uvloop" if u.find_spec("uvloop") else "asyncio",
    "http": name(import_from_string(HTTP_PROTOCOLS["auto"])),
    "ws": name(import_from_string(WS_PROTOCOLS["auto"])),
    "ws_per_message_deflate": Config(app="server.app:app").ws_per_message_deflate,
    "versions": {d: ver(d) for d in ("uvicorn", "websockets", "httptools", "uvloop", "h11",
                                     "wsproto", "fastapi", "starlette")},
}))
"""

_OPENENV_PROBE = r"""
import importlib.metadata as md, json
import openenv.core.env_server.http_server  # the server the bench runs must import
for dist in ("openenv", "openenv-core"):
    try:
        print(json.dumps({"distribution": dist, "version": md.version(dist)}))
        break
    except md.PackageNotFoundError:
        pass
else:
    print(json.dumps({"distribution": None, "version": None}))
"""


class OpenEnvUnavailable(RuntimeError):
    """OpenEnv's server cannot be started from the given python (reason in the message)."""


@dataclass
class Target:
    """A running server the load generator can drive."""

    name: str
    url: str
    pid: int
    dialect: str
    meta: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def pinned(cpus: list[int] | None) -> Iterator[None]:
    """The calling thread on `cpus` meanwhile (children started here inherit them)."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def split_cpus() -> tuple[list[int] | None, list[int] | None, str]:
    """(server CPUs, load-generator CPUs, why): the first usable CPU for the servers and the
    rest for the load generator when there are at least two; else (None, None)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None, f"one usable CPU ({cpus}): server and load generator share it"
    return cpus[:1], cpus[1:], "server on the first usable CPU, load generator on the others"


def affinity_of(pid: int) -> list[int]:
    """CPUs the process `pid` may run on, read back (psutil)."""
    return sorted(psutil.Process(pid).cpu_affinity() or [])


def wait_quiet(pids: list[int], timeout_s: float = 60.0) -> float:
    """Wait until every server is idle (under 5 % of a CPU over a quarter second): a server
    still closing the last run's sessions would take CPU from the next run, and its memory
    reading would not be a baseline. Returns seconds waited."""
    procs = [psutil.Process(p) for p in pids]

    def used(p: psutil.Process) -> float:
        t = p.cpu_times()
        return float(t.user + t.system)

    start = time.monotonic()
    window = 0.25
    while True:
        before = [used(p) for p in procs]
        time.sleep(window)
        most = max(used(p) - b for p, b in zip(procs, before, strict=True))
        waited = time.monotonic() - start
        if (most < 0.05 * window and waited >= 0.5) or waited > timeout_s:
            return waited


def _probe(python: str, code: str, what: str) -> dict[str, Any]:
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise OpenEnvUnavailable(f"{what} failed in {python}: {out.stderr.strip()[-300:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def sandgym_stack() -> dict[str, Any]:
    """What `sandgym serve` runs on, from the same settings its child process reads."""
    import importlib.metadata as md

    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import uvicorn_config

    settings = ServerSettings()
    config = uvicorn_config(None, settings)

    def name(x: Any) -> str:
        return x if isinstance(x, str) else f"{x.__module__}.{x.__qualname__}"

    def ver(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    return {
        "loop": name(config.loop),
        "http": name(config.http),
        "ws": name(config.ws),
        "ws_impl": settings.ws_impl,
        "ws_per_message_deflate": config.ws_per_message_deflate,
        "versions": {
            d: ver(d)
            for d in (
                "uvicorn",
                "websockets",
                "httptools",
                "uvloop",
                "h11",
                "wsproto",
                "fastapi",
                "starlette",
            )  # fmt: skip
        },
    }


@contextlib.contextmanager
def sandgym_server(
    args: argparse.Namespace, top: int, cpus: list[int] | None = None
) -> Iterator[Target]:
    """`sandgym serve` on `args.backend` with the bench-echo task, as a child process."""
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import ServerProcess

    env = {
        "SANDGYM_MAX_SESSIONS": str(top),
        "SANDGYM_POOL_SIZE": "0",
        "SANDGYM_MAX_STEPS": str(args.steps + 5),
        "SANDGYM_INCLUDE_BUILTIN": "false",
        "SANDGYM_POOL_MAX_TOTAL": str(top * 2),
    }
    with tempfile.TemporaryDirectory(prefix="sandgym-bench-sessions-") as tmp:
        root = write_bench_task(Path(tmp))
        with pinned(cpus):
            srv = ServerProcess(args.backend, args=["--tasks", str(root)], env=env)
        with srv:
            meta = {
                "server": "sandgym serve",
                "backend": args.backend,
                "command": [str(a) for a in srv.proc.args],  # type: ignore[union-attr]
                "env": env,
                "stack": sandgym_stack(),
                "cpus": affinity_of(srv.pid),
            }
            yield Target("sandgym", srv.url, srv.pid, "sandgym", meta)


def _wait_http(proc: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise OpenEnvUnavailable(f"server exited with {proc.returncode} at startup")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise OpenEnvUnavailable(f"server did not answer {url} within {timeout_s:g}s")


@contextlib.contextmanager
def openenv_server(
    args: argparse.Namespace, top: int, cpus: list[int] | None = None
) -> Iterator[Target]:
    """OpenEnv's server (`--openenv-env`) from `--openenv-python`, as a child process."""
    python = args.openenv_python
    if not Path(python).exists():
        raise OpenEnvUnavailable(f"no python at --openenv-python {python}")
    release = _probe(python, _OPENENV_PROBE, "importing OpenEnv's server")
    stack = _probe(python, _STACK_PROBE, "reading uvicorn's settings")
    with contextlib.ExitStack() as stack_ctx:
        if args.openenv_env == "mcp":
            app_dir = Path(args.openenv_app_dir)
            if not (app_dir / "server" / "app.py").exists():
                raise OpenEnvUnavailable(f"no server/app.py under --openenv-app-dir {app_dir}")
            dialect = "openenv-mcp"
            what = "OpenEnv envs/echo_env (MCP tools through FastMCP)"
        else:
            app_dir = Path(stack_ctx.enter_context(tempfile.TemporaryDirectory()))
            (app_dir / "server").mkdir()
            (app_dir / "server" / "__init__.py").write_text("")
            (app_dir / "server" / "app.py").write_text(OPENENV_PLAIN_APP)
            dialect = "openenv"
            what = (
                "OpenEnv create_app (its /ws endpoint) hosting a plain async echo environment "
                "(EchoAction(message) -> EchoObservation(echoed_message))"
            )
        # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
        from sandgym.server.runner import free_port

        port = free_port()
        # As OpenEnv's template deploys it: uvicorn's defaults (log level, access log, loop,
        # http and ws "auto", permessage-deflate on), only the address differs.
        cmd = [python, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1",
               "--port", str(port)]  # fmt: skip
        env = {**os.environ, "MAX_CONCURRENT_ENVS": str(top + 16)}
        log = stack_ctx.enter_context(tempfile.TemporaryFile())
        with pinned(cpus):
            proc = subprocess.Popen(cmd, cwd=app_dir, env=env, stdout=log, stderr=log)
        try:
            try:
                _wait_http(proc, f"http://127.0.0.1:{port}/health", 120)
            except OpenEnvUnavailable as exc:
                log.seek(0)
                raise OpenEnvUnavailable(f"{exc}; its log ends: {log.read()[-1500:]!r}") from exc
            meta = {
                "server": f"{what}, under uvicorn",
                "openenv_distribution": release["distribution"],
                "openenv_version": release["version"],
                "command": cmd,
                "settings_from": f"OpenEnv's environment template: {OPENENV_TEMPLATE_CMD}",
                "env": {"MAX_CONCURRENT_ENVS": env["MAX_CONCURRENT_ENVS"]},
                "stack": stack,
                "cpus": affinity_of(proc.pid),
            }
            yield Target("openenv", f"ws://127.0.0.1:{port}/ws", proc.pid, dialect, meta)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def default_openenv_python() -> str:
    """`SANDGYM_BENCH_OPENENV_PYTHON`, else this python (the dev extra installs OpenEnv)."""
    return os.environ.get("SANDGYM_BENCH_OPENENV_PYTHON", sys.executable)
