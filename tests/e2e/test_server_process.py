"""`sandgym serve` as a real child process: flags reach the server, it serves an episode, and
SIGTERM drains it (episode ended, sandbox released) with exit status 0."""

from __future__ import annotations

import asyncio

import httpx

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import ServerProcess
from tests.e2e.conftest import NULL_TASK


async def test_serve_cli_process(task_dir):
    srv = await asyncio.to_thread(
        ServerProcess,
        "null",
        args=["--tasks", str(task_dir), "--token", "tok", "--max-sessions", "3"],
        env={"SANDGYM_INCLUDE_BUILTIN": "false"},
    )
    try:
        http = httpx.AsyncClient(base_url=srv.http_url)
        assert (await http.get("/v1/sessions")).status_code == 401
        auth = {"Authorization": "Bearer tok"}
        async with AsyncEnvClient(srv.url, token="tok") as env:
            await env.reset(NULL_TASK)
            assert (await env.step("echo hi")).observation["output"] == "hi\n"
            view = (await http.get("/v1/sessions", headers=auth)).json()
            await http.aclose()
            assert view["count"] == 1 and view["max_sessions"] == 3
            assert srv.rss_bytes() > 0 and srv.cpu_seconds() > 0
            await env.drop_connection()
        await asyncio.to_thread(srv.stop)
        assert srv.proc.returncode == 0
    finally:
        await asyncio.to_thread(srv.stop)


def test_serve_refuses_a_backend_that_cannot_work() -> None:
    """`sandgym serve --backend e2b` without a key stops at startup and says why."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "E2B_API_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "sandgym.cli", "serve", "--backend", "e2b", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "E2B_API_KEY" in proc.stderr or "sandgym[e2b]" in proc.stderr  # no key / no SDK
