"""`pristine` for tasks that declare no `outputs` (issue 58 item 4), through a real server on the
local and docker backends (docs/verification.md, sandgym/tasks/verifier/pristine.py):

- the outputs are derived: what the agent created under the working directory; a shipped input
  it rewrote stays the fresh sandbox's own, so the `edit-test-inputs` canary (rewrite the input
  the tests derive the expected answer from, then answer to match) is not paid, while the honest
  answer is (and `shared` and `refuse-tampered` pay the canary: the hole this closes);
- the copy is bounded: outputs past the bound end the step as `verifier_error` (scored by the
  trainer, never masked), naming what was expected and what was found;
- a copy that fails is a `verifier_error` too, not `internal`;
- `sandgym tasks check` says how pristine takes each task's outputs: declared, derived (naming
  the shipped files the solution edits, which a pristine verifier would not see), or refused;
- a backend that lists no changed paths (null, like e2b) refuses `pristine` at reset for a task
  without `outputs`, by name.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.sandboxes.errors import SandboxError
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from sandgym.tasks.verifier import pristine
from tests.e2e.conftest import REAL_BACKENDS, local_available

HONEST = "sort /app/data/input.txt > /app/out.txt"
#: the canary of lab/bench/canaries.py, on a task that (like every shipped one) declares no outputs
EDIT_INPUTS = "echo z > /app/data/input.txt && echo z > /app/out.txt"


def _task(root: Path, name: str = "sorted", solve: str = HONEST, toml: str = "") -> Path:
    d = root / name
    for sub in ("environment/data", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text(
        textwrap.dedent(
            """\
            version = "1.0"
            [verifier]
            timeout_sec = 60
            [environment]
            network_mode = "no-network"
            """
        )
        + toml
    )
    (d / "instruction.md").write_text(
        "Write the lines of /app/data/input.txt, sorted, to /app/out.txt\n"
    )
    (d / "environment" / "Dockerfile").write_text(
        "FROM sandgym/terminal:latest\nWORKDIR /app\nCOPY data /app/data\n"
    )
    (d / "environment" / "data" / "input.txt").write_text("pear\napple\nfig\n")
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\nsort /app/data/input.txt > /tmp/expected.txt\n"
        "if cmp -s /tmp/expected.txt /app/out.txt; then echo 1; else echo 0; fi"
        " > /logs/verifier/reward.txt\n"
    )
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    return d


@pytest.fixture(scope="module", params=REAL_BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BackgroundServer]:
    root = tmp_path_factory.mktemp("pristine-outputs")
    _task(root)
    srv = BackgroundServer(
        ServerSettings(host="127.0.0.1", port=0, backend=request.param, task_dirs=[root])
    )
    srv.start()
    yield srv
    srv.stop()


async def _episode(url: str, command: str, verify: str) -> Any:
    """The step result of the submit (raises EnvError on an error reply)."""
    async with AsyncEnvClient(url) as env:
        _, info = await env.reset("sorted", seed=0, options={"verify": verify})
        assert info["verify"] == verify
        res = await env.step(command)
        assert res.observation["exit_code"] == 0, res.observation
        return await env.step({"kind": "submit"})


async def test_derived_outputs_keep_the_shipped_inputs(server: BackgroundServer) -> None:
    res = await _episode(server.url, EDIT_INPUTS, "shared")
    assert res.reward == 1.0  # the hole: the tests read the input the agent rewrote
    res = await _episode(server.url, EDIT_INPUTS, "refuse-tampered")
    assert res.reward == 1.0  # not reported either: no category names an undeclared input
    res = await _episode(server.url, EDIT_INPUTS, "pristine")
    assert res.terminated and res.reward == 0.0, res.info.get("verifier_output")
    res = await _episode(server.url, HONEST, "pristine")
    assert res.terminated and res.reward == 1.0, res.info.get("verifier_output")


async def test_outputs_past_the_bound_are_a_verifier_error(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pristine, "MAX_COPY_BYTES", 64 * 1024)
    big = HONEST + " && head -c 200000 /dev/zero > /app/big.bin"
    with pytest.raises(EnvError) as err:
        await _episode(server.url, big, "pristine")
    assert err.value.code == "verifier_error", err.value
    assert "[outputs]" in err.value.message
    assert "expected at most 65536 bytes" in err.value.message
    assert "found 2000" in err.value.message  # 200,0xx bytes: the answer and the padding
    # under the bound, the same answer is scored
    monkeypatch.setattr(pristine, "MAX_COPY_BYTES", 1024 * 1024)
    res = await _episode(server.url, big, "pristine")
    assert res.reward == 1.0, res.info.get("verifier_output")


async def test_a_failed_copy_is_a_verifier_error(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandgym.sandboxes.docker.sandbox import DockerSandbox
    from sandgym.sandboxes.local.sandbox import LocalSandbox

    async def broken(self: Any, src: str, dst: Path) -> None:
        raise SandboxError(f"reading {src}: input/output error")

    monkeypatch.setattr(LocalSandbox, "download", broken)
    monkeypatch.setattr(DockerSandbox, "download", broken)
    with pytest.raises(EnvError) as err:
        await _episode(server.url, HONEST, "pristine")
    assert err.value.code == "verifier_error", err.value
    assert "[outputs]" in err.value.message and "input/output error" in err.value.message


async def test_no_change_set_refuses_pristine_without_outputs_at_reset(make_server: Any) -> None:
    from tests.e2e.conftest import NULL_TASK

    srv = make_server("null")
    async with AsyncEnvClient(srv.url) as env:
        with pytest.raises(EnvError) as err:
            await env.reset(NULL_TASK, seed=0, options={"verify": "pristine"})
        assert err.value.code == "unknown_task"
        assert "declares no metadata.outputs" in err.value.message


@pytest.mark.skipif(not local_available(), reason="bubblewrap not installed")
async def test_tasks_check_says_how_pristine_takes_the_outputs(tmp_path: Path) -> None:
    from sandgym.sandboxes import get_backend
    from sandgym.tasks import load_task_dir
    from sandgym.tasks.check import check_task

    derived = _task(tmp_path, "derived")
    # an answer that is an edit of a shipped file (the tests then read the edited input)
    edits = _task(tmp_path, "edits", f"echo z >> /app/data/input.txt && {HONEST}")
    declared = _task(tmp_path, "declared", toml='[metadata]\noutputs = ["/app/out.txt"]\n')
    local = get_backend("local")
    try:
        checks = [await check_task(load_task_dir(d), local, {}, 0) for d in (derived, edits)]
        checks.append(await check_task(load_task_dir(declared), local, {}, 0))
    finally:
        await local.aclose()
    entries = {c.task_id: c.to_entry() for c in checks}
    assert all(c.ok for c in checks), entries
    assert entries["derived"]["pristine"] == "derived"
    assert "pristine_kept_inputs" not in entries["derived"]
    assert entries["edits"]["pristine"] == "derived"
    assert entries["edits"]["pristine_kept_inputs"] == ["/app/data/input.txt"]
    assert entries["declared"]["pristine"] == "declared"
    null = get_backend("null")
    try:
        check = await check_task(load_task_dir(derived), null, {}, 0)
    finally:
        await null.aclose()
    assert str(check.pristine).startswith("refused: it declares no metadata.outputs"), check
