"""The `e2b` backend against the real E2B service (marked `e2b`; skipped without E2B_API_KEY).

Runs the checks that `tests/unit/test_e2b_backend.py` runs against the SDK fake, for real:
metadata tagging and listing, exec with exit codes and tree-killing timeouts, the persistent
shell over an E2B pty, files and traversal refusal, a sandbox killed from outside becoming
SandboxLostError, idempotent close, reaping, and the cross-backend conformance suite (minus the
resource-limit checks, which are template properties on E2B).

    E2B_API_KEY=e2b_... SANDGYM_E2B_TEST_TEMPLATE=sandgym-terminal pytest -m e2b tests/integration

The template defaults to E2B's stock `base`; see docs/e2b.md to build `sandgym-terminal`.
Each test creates its own sandboxes and kills them, and a final reap removes any this run left.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from pathlib import Path

import pytest

from sandgym.sandboxes import (
    SandboxClosedError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxPathError,
    SandboxSpec,
)
from sandgym.sandboxes.e2b import LABEL_SANDBOX_ID, E2BBackend
from sandgym.sandboxes.labels import LABEL_MANAGED, LABEL_OWNER

TEMPLATE = os.environ.get("SANDGYM_E2B_TEST_TEMPLATE", "base")

pytestmark = [
    pytest.mark.e2b,
    pytest.mark.skipif(
        not os.environ.get("E2B_API_KEY"),
        reason="E2B_API_KEY is not set: the live E2B checks need an API key and network access",
    ),
]


@pytest.fixture
async def backend():
    pytest.importorskip("e2b", reason="the E2B SDK is not installed: pip install 'sandgym[e2b]'")
    b = E2BBackend(default_template=TEMPLATE, lease_s=900)
    yield b
    await b.reap(only_expired=False)  # whatever a failing test left behind
    await b.aclose()


@pytest.fixture
async def make(backend):
    made = []

    async def _make(**kw):
        sb = await backend.create(SandboxSpec(**kw))
        made.append(sb)
        return sb

    yield _make
    for sb in made:
        await sb.close()


async def test_create_is_tagged_and_listed(backend, make):
    sb = await make(env={"SPEC_VAR": "v"})
    infos = await backend.list_managed({LABEL_SANDBOX_ID: sb.id})
    assert [i.sandbox_id for i in infos] == [sb.e2b_id]
    assert infos[0].metadata[LABEL_MANAGED] == "1"
    assert infos[0].metadata[LABEL_OWNER] == backend.owner_id
    res = await sb.exec("pwd; echo $SPEC_VAR; id -u")
    assert res.stdout == "/app\nv\n0\n"


async def test_exec_exit_code_and_tree_kill(make):
    sb = await make()
    res = await sb.exec("echo out; echo err >&2; exit 7")
    assert (res.exit_code, res.stdout, res.stderr) == (7, "out\n", "err\n")
    res = await sb.exec("(sleep 311 &); (setsid sleep 312 &); sleep 313", timeout_s=2)
    assert res.timed_out and res.exit_code is None
    left = await sb.exec("ps -eo args | grep -c '^sleep 31[123]' || true")
    assert left.stdout.strip() == "0"


async def test_shell_state_timeout_and_screen(make):
    sb = await make()
    await sb.run("cd /tmp && export KEEP=yes")
    res = await sb.run("sleep 331 & sleep 332", timeout_s=2)
    assert res.timed_out
    after = await sb.run("pwd; echo $KEEP; ps -eo args | grep -c '^sleep 33[12]' || true")
    assert after.output.split() == ["/tmp", "yes", "0"]
    await sb.send_keys("printf 'SCREEN-%s\\n' OK<Enter>")
    assert "SCREEN-OK" in await sb.screen()
    assert (await sb.run("echo back")).output == "back\n"


async def test_files_and_traversal(make, tmp_path: Path):
    sb = await make()
    blob = bytes(range(256)) * 64
    await sb.write_file("/app/data/blob.bin", blob)
    assert await sb.read_file("/app/data/blob.bin") == blob
    await sb.write_file("/app/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert (await sb.exec("/app/run.sh")).stdout == "ran\n"
    with pytest.raises(SandboxFileNotFoundError):
        await sb.read_file("/app/missing")
    with pytest.raises(SandboxPathError):
        await sb.write_file("../../../../etc/evil", "x")
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "sub" / "f.txt").write_text("hello")
    await sb.upload(tmp_path / "t", "/app/tree")
    await sb.download("/app/tree", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "f.txt").read_text() == "hello"


async def test_killed_from_outside_is_lost_and_close_is_idempotent(backend, make):
    sb = await make()
    await sb.run("true")
    await backend.sdk.AsyncSandbox.kill(sb.e2b_id, api_key=backend.api_key)
    with pytest.raises(SandboxLostError):
        await sb.exec("echo hi")
    assert not await sb.is_alive()
    await sb.close()
    await sb.close()
    with pytest.raises(SandboxClosedError):
        await sb.exec("true")


async def test_reap_removes_our_sandboxes_on_shutdown(backend, make):
    sb = await make()
    # Other runs' expired sandboxes may go too; ours (live owner, lease running) stays.
    assert sb.id not in await backend.reap()
    assert sb.id in await backend.reap(only_expired=False)
    assert not await sb.is_alive()


_CONFORMANCE = Path(__file__).resolve().parent / "test_conformance.py"
_NOT_FOR_E2B = {"test_memory_hog_is_killed", "test_fork_bomb_is_contained"}


def _checks() -> dict[str, object]:
    spec = importlib.util.spec_from_file_location("_sg_conformance_live", _CONFORMANCE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {
        n: f
        for n, f in vars(mod).items()
        if n.startswith("test_") and inspect.iscoroutinefunction(f) and n not in _NOT_FOR_E2B
    }


_CHECKS = _checks() if _CONFORMANCE.is_file() else {}


@pytest.mark.parametrize("check", sorted(_CHECKS))
async def test_conformance_suite_live(check, make, tmp_path: Path):
    fn = _CHECKS[check]
    if "tmp_path" in inspect.signature(fn).parameters:  # type: ignore[arg-type]
        await fn(make, tmp_path)  # type: ignore[operator]
    else:
        await fn(make)  # type: ignore[operator]
