"""A docker sandbox's file changes (`Sandbox.changes`), applied to a fresh sandbox of the same
spec (`apply_changes`, how a group's members copy member 0): afterwards the two file systems
list the same entries with the same type, mode, owner, size, link target and content, for
added, modified and deleted files, directories whose mode changed, symlinks and files of
another owner; the engine's own mounts stay the fresh container's. Then each diverges alone.

Skipped only when no Docker engine answers or `sandgym/terminal:latest` is not built.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sandgym.sandboxes import get_backend
from sandgym.sandboxes.docker import DockerBackend
from sandgym.sandboxes.docker.changes import MAX_CHANGES_BYTES
from sandgym.sandboxes.errors import SnapshotUnsupportedError
from sandgym.sandboxes.spec import FileChanges, SandboxSpec
from tests.e2e.conftest import docker_image_available

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
]

SPEC = SandboxSpec(image="sandgym/terminal:latest", workdir="/app")

#: what a task's set-up might do: every kind of change
SETUP = """
set -e
head -c 300000 /dev/urandom > /app/data.bin
mkdir -p /app/d/e && echo deep > /app/d/e/f
chown 1000:1000 /app/d/e/f && chmod 600 /app/d/e/f && chmod 700 /app/d
ln -s /app/data.bin /app/link
echo changed >> /etc/motd
rm -f /etc/debian_version
rm -rf /usr/share/doc/bash
useradd -m -u 1234 grader
"""

#: every entry of the sandbox's own files: path, type, mode, owner, size, link target, and a
#: checksum of each regular file's content
LISTING = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /run/sandgym \\) -prune "
    "-o -printf '%p %y %m %u:%g %s %l\\n' | sort; "
    "find /app /etc /home /root -xdev -type f ! -name hostname ! -name hosts ! -name resolv.conf "
    "-print0 | sort -z | xargs -0 -r md5sum"
)


@pytest.fixture
async def backend() -> AsyncIterator[DockerBackend]:
    b = get_backend("docker")
    assert isinstance(b, DockerBackend)
    yield b
    await b.aclose()


async def listing(sb: object) -> str:
    r = await sb.exec(LISTING, timeout_s=120)  # type: ignore[attr-defined]
    assert r.exit_code == 0, r.stderr
    return r.stdout


async def test_changes_applied_make_the_same_file_system(backend: DockerBackend) -> None:
    first, copy = await asyncio.gather(backend.create(SPEC), backend.create(SPEC))
    try:
        r = await first.exec(SETUP, timeout_s=120)
        assert r.exit_code == 0, r.stderr
        changes = await first.changes()
        assert isinstance(changes, FileChanges) and 0 < changes.size_bytes < MAX_CHANGES_BYTES
        assert "/etc/debian_version" in changes.deleted
        before = await listing(copy)
        await copy.apply_changes(changes)
        mine, theirs = await asyncio.gather(listing(first), listing(copy))
        assert mine != before  # the copy changed ...
        assert mine.splitlines() == theirs.splitlines()  # ... into the first's files exactly
        assert "/app/d/e/f f 600 1000:1000" in theirs and "/app/link l 777" in theirs
        assert "/etc/debian_version" not in theirs and "/usr/share/doc/bash " not in theirs
        # the engine's own files stay each container's (its hostname is its sandbox id)
        assert (await copy.read_file("/etc/hostname")).decode().strip() == copy.id
        # from now on each on its own
        await copy.exec("echo mine > /app/d/e/f")
        assert (await first.read_file("/app/d/e/f")) == b"deep\n"
    finally:
        await asyncio.gather(first.close(), copy.close())


async def test_no_changes_and_too_many(
    backend: DockerBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = await backend.create(SPEC)
    try:
        nothing = await sb.changes()
        assert nothing.deleted == () and nothing.size_bytes < 64 * 1024  # at most /app's entry
        await sb.exec("head -c 200000 /dev/urandom > /app/big")
        monkeypatch.setattr("sandgym.sandboxes.docker.changes.MAX_CHANGES_BYTES", 100_000)
        with pytest.raises(SnapshotUnsupportedError, match="over 100000 bytes"):
            await sb.changes()
    finally:
        await sb.close()
