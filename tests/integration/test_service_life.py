"""The services beside a docker sandbox under its deadline (`sandgym.sandboxes.docker.service_life`), on
the real engine: a service whose image has a shell runs its image's own ENTRYPOINT and CMD where
it ran before (pid 2, now the child of sandgym's deadline keeper, pid 1, in Docker's init's
place) and ends when the deadline passes; one whose image
has no `/bin/sh` cannot run the wrapper and runs exactly as written, without a deadline,
instead of failing the sandbox.

The shell-less image is `FROM scratch` holding one static x86-64 program made here (a loop of
`pause()`), so nothing is pulled. That the services end after their server is SIGKILLed is
tests/reliability/test_lifetime.py.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import struct
import subprocess
import uuid
from pathlib import Path

import pytest

from sandgym.sandboxes import SandboxSpec
from sandgym.sandboxes.lifetime import set_first_lifetime
from sandgym.sandboxes.services import ServiceSpec
from tests.e2e.conftest import docker_image_available
from tests.waiting import wait_until

IMAGE = "sandgym/terminal:latest"

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason=f"image {IMAGE} not built"),
]


def pause_program() -> bytes:
    """A static x86-64 ELF that calls pause() forever: a service that needs no shell, no libc."""
    code = bytes.fromhex("b8220000000f05ebf7")  # mov eax, 34 (pause); syscall; jmp back
    base, start = 0x400000, 64 + 56
    header = struct.pack(
        "<4sBBBBB7sHHIQQQIHHHHHH",
        b"\x7fELF", 2, 1, 1, 0, 0, b"\0" * 7,  # 64-bit, little-endian, System V
        2, 0x3E, 1, base + start, 64, 0, 0, 64, 56, 1, 0, 0, 0,  # executable, x86-64
    )  # fmt: skip
    size = start + len(code)
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # load r-x
    return header + segment + code


#: the parent pid of the container's `sleep 600` (the service)
PARENT_OF_SLEEP = (
    "for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline)\" = 'sleep 600 ' ] && "
    "awk '/^PPid/ {print $2}' $p/status; done; true"
)


def inspect(ref: str, fmt: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "-f", fmt, ref], capture_output=True, text=True, timeout=60
    ).stdout.strip()


def service_container(owner: str, service: str) -> str:
    out = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=sandgym.owner={owner}"]
        + ["--filter", f"label=sandgym.service={service}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert len(out) == 1, out
    return out[0]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the shell-less program is x86-64")
async def test_services_run_as_written_under_the_deadline_or_without_a_shell(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandgym.sandboxes.docker import DockerBackend, service_life

    # a host without a static bash (else the shell-less image would get the keeper under it)
    monkeypatch.delenv(service_life.STATIC_BASH_ENV, raising=False)
    monkeypatch.setattr(service_life, "STATIC_BASH_PATHS", ())

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "pause").write_bytes(pause_program())
    (bare / "pause").chmod(0o755)
    (bare / "Dockerfile").write_text(
        'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\nCMD ["as-written"]\n'
    )
    shell = tmp_path / "shell"
    shell.mkdir()
    (shell / "Dockerfile").write_text(
        f'FROM {IMAGE}\nENTRYPOINT ["sh", "-c", "echo \\"$@\\" > /tmp/argv; exec sleep 600", '
        '"entry"]\nCMD ["from", "cmd"]\n'
    )
    spec = SandboxSpec(
        image=IMAGE,
        services=(
            ServiceSpec(name="bare", build_context=bare),
            ServiceSpec(name="shell", build_context=shell),
        ),
    )
    owner = "test-svclife-" + uuid.uuid4().hex[:6]
    backend = DockerBackend(owner_id=owner)
    try:
        set_first_lifetime(8.0)  # the sandbox and its services end 8 s after it is made
        with caplog.at_level(logging.WARNING, logger="sandgym.sandboxes.docker.group"):
            sb = await backend.create(spec)
        set_first_lifetime(None)
        bare_c = service_container(owner, "bare")
        shell_c = service_container(owner, "shell")
        # no shell: as written (its image's ENTRYPOINT and CMD), running, and said so
        assert inspect(bare_c, "{{json .Config.Entrypoint}} {{json .Config.Cmd}}") == (
            '["/pause"] ["as-written"]'
        )
        assert inspect(bare_c, "{{.State.Status}}") == "running"
        assert any("no /bin/sh" in r.getMessage() for r in caplog.records), caplog.text
        # a shell: the image's ENTRYPOINT + CMD, run through the wrapper
        argv = await asyncio.to_thread(
            subprocess.run,
            ["docker", "exec", shell_c, "cat", "/tmp/argv"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert argv.stdout == "from cmd\n", argv
        assert inspect(shell_c, "{{index .Config.Entrypoint 0}}") == "/bin/bash"
        # forked by the deadline keeper, pid 1 (as Docker's init's child, without it)
        parent = await asyncio.to_thread(
            subprocess.run,
            ["docker", "exec", shell_c, "sh", "-c", PARENT_OF_SLEEP],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert parent.stdout == "1\n", parent
        # past the deadline the wrapped service ends by itself (with the sandbox's container);
        # the one without a shell keeps running: it has no deadline
        await wait_until(
            lambda: inspect(shell_c, "{{.State.Status}}") == "exited",
            60.0, 0.5, "the wrapped service's end",
        )  # fmt: skip
        assert inspect(shell_c, "{{.State.Status}} {{.State.ExitCode}}") == "exited 143"
        assert inspect(bare_c, "{{.State.Status}}") == "running"
        await sb.close()
    finally:
        await backend.reap(only_expired=False)
        await backend.aclose()
