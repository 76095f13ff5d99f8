"""Ready means ready, on real backends: a sandbox the pool hands out already has its persistent
shell started and answering, so the first command after an acquire starts no shell."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandgym.sandboxes import SandboxSpec, get_backend
from sandgym.sandboxes.pool import PoolSettings, SandboxPool
from tests.e2e.conftest import docker_image_available

BACKENDS = [
    pytest.param(
        "local",
        marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
    ),
    pytest.param(
        "docker",
        marks=[
            pytest.mark.docker,
            pytest.mark.skipif(not docker_image_available(), reason="sandgym/terminal not built"),
        ],
    ),
]


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_a_pool_hit_has_its_shell_running(backend_name: str, tmp_path: Path) -> None:
    opts = {"root": tmp_path / "sbx"} if backend_name == "local" else {}
    backend = get_backend(backend_name, owner_id="test-ready-" + os.urandom(4).hex(), **opts)
    pool = SandboxPool(backend, PoolSettings(min_ready=1))
    await pool.start()
    spec = SandboxSpec(workdir="/app")
    try:
        await pool.prewarm([spec])
        await pool.wait_idle()
        sb = await pool.acquire(spec)
        try:
            assert sb.from_pool
            assert sb.shell_alive() is True  # started by the pool, before this acquire
            shell = sb._shell  # type: ignore[attr-defined]
            res = await sb.run("pwd")
            assert res.exit_code == 0 and res.output.strip() == "/app"
            assert sb._shell is shell  # type: ignore[attr-defined]  # the same shell, no new one
        finally:
            await pool.release(sb)
    finally:
        await pool.close()
        await backend.aclose()
