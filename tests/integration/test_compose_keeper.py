"""A compose service under sandgym's deadline keeper (`sandgym.sandboxes.docker.service_life`)
still gets what its own entrypoint expects: its environment, working directory and user, every
signal at its default disposition, and `docker stop`'s SIGTERM (forwarded by the keeper, pid 1),
whose exit status becomes the container's. A service image without /bin/bash gets the keeper
under the host's static bash (copied in) when the host has one (Debian's `bash-static`), else
falls back to Docker's init and the older watcher, as docs/operations.md says.

One sandbox with a deadline (600 s ahead, so it never ends during the test) and two services,
both built from sandgym/terminal; the bash-less image is that one with bash removed (built here
once, a few seconds).
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import pytest

from tests.e2e.conftest import docker_image_available
from tests.waiting import wait_until_in_thread

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
]

NOBASH = "sandgym-test/nobash:1"

#: what the service reports on its stdout, then it waits for SIGTERM and exits 7
REPORT = (
    'echo "cwd=$(pwd) user=$(id -un) foo=$FOO"; grep SigIgn /proc/self/status; '
    'echo "deadline=$(cat /run/sandgym-life/deadline)"; '
    "echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline | cut -c1-40); "
    'trap "exit 7" TERM; while :; do sleep 0.1; done'
)


def _docker(*args: str) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"docker {args[0]}: {out.stderr}"
    return out.stdout


def nobash_image() -> str:
    """sandgym/terminal without /bin/bash (built once; the engine keeps it)."""
    if subprocess.run(["docker", "image", "inspect", NOBASH], capture_output=True).returncode:
        subprocess.run(
            ["docker", "build", "-q", "-t", NOBASH, "-"],
            input="FROM sandgym/terminal:latest\nRUN rm -f /bin/bash /usr/bin/bash\n",
            text=True, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return NOBASH


async def _service_state(sandbox_id: str, name: str) -> tuple[str, str]:
    """(container id, its log) of service `name` once it has printed its report."""
    cid = (
        await asyncio.to_thread(
            _docker, "ps", "-q", "--no-trunc", "--filter", f"name={sandbox_id}-{name}"
        )
    ).strip()
    assert cid, f"service {name} is not running"

    def logs() -> str:
        return subprocess.run(["docker", "logs", cid], capture_output=True, text=True).stdout

    await wait_until_in_thread(lambda: "pid1=" in logs(), 30, 0.2, f"service {name}'s report")
    return cid, await asyncio.to_thread(logs)


async def test_a_service_under_the_keeper_runs_as_written_and_stops_cleanly() -> None:
    from sandgym.sandboxes import SandboxSpec
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.sandboxes.docker.service_life import STATIC_BASH_IN, static_bash
    from sandgym.sandboxes.lifetime import set_first_lifetime
    from sandgym.sandboxes.services import ServiceSpec

    nobash = await asyncio.to_thread(nobash_image)
    owner = "test-keeper-" + uuid.uuid4().hex[:6]
    backend = DockerBackend(owner_id=owner)
    common = {"command": ("sh", "-c", REPORT), "env": {"FOO": "bar"}, "workdir": "/tmp"}
    spec = SandboxSpec(
        memory_mb=256,
        pids_limit=64,
        services=(
            ServiceSpec(name="kept", image="sandgym/terminal:latest", user="nobody", **common),
            ServiceSpec(name="plain", image=nobash, **common),
        ),
    )
    set_first_lifetime(600.0)
    try:
        sb = await backend.create(spec)
        assert sb.deadline is not None
        kept, kept_log = await _service_state(sb.id, "kept")
        assert "cwd=/tmp user=nobody foo=bar" in kept_log, kept_log
        assert "SigIgn:\t0000000000000000" in kept_log, kept_log  # no signal left ignored
        # the keeper, run as the service's user, can read the deadline it keeps
        assert f"deadline={int(-(-sb.deadline // 1))}\n" in kept_log, kept_log
        assert "pid1=/bin/bash -c f() {" in kept_log, kept_log  # the keeper is pid 1
        # docker stop: SIGTERM to pid 1, forwarded to the service, whose status is the container's
        await asyncio.to_thread(_docker, "stop", "-t", "20", kept)
        code = await asyncio.to_thread(_docker, "inspect", "-f", "{{.State.ExitCode}}", kept)
        assert code.strip() == "7", f"expected the service's own exit status 7, found {code}"

        _plain, plain_log = await _service_state(sb.id, "plain")
        assert "cwd=/tmp user=root foo=bar" in plain_log, plain_log
        if static_bash() is not None:  # the host's static bash, copied in, runs the keeper
            assert f"pid1={STATIC_BASH_IN} -c f() {{" in plain_log, plain_log
            assert "SigIgn:\t0000000000000000" in plain_log, plain_log
        else:  # tini and the watcher
            assert "pid1=/sbin/docker-init" in plain_log, plain_log
        await sb.close()
    finally:
        await backend.reap(only_expired=False)
        await backend.aclose()
