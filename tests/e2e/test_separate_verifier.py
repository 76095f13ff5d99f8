"""Harbor's separate verifier (`[verifier] environment_mode = "separate"`) through a real env
server, on local and docker: the tests run in a sandbox of their own made from the tests'
Dockerfile (not the agent's image), holding a copy of the agent's working directory and
declared artifacts (links dropped); the agent never sees the tests or the verifier's image.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from tests.e2e.conftest import REAL_BACKENDS

TEST_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
ok=1
# the verifier's own image: a file only its Dockerfile brings
[ "$(cat /opt/verifier-marker.txt 2>/dev/null)" = "verifier image" ] || { echo no-marker; ok=0; }
# the agent's working directory and its declared artifact, copied over
[ "$(cat /app/answer.txt 2>/dev/null)" = 42 ] || { echo no-answer; ok=0; }
[ "$(cat /srv/out/report.txt 2>/dev/null)" = done ] || { echo no-artifact; ok=0; }
# nothing else of the agent's sandbox, and no link out of what was copied
[ ! -e /root/agent-note ] || { echo agent-sandbox; ok=0; }
[ ! -L /app/link ] || { echo link; ok=0; }
echo $ok > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="module")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sepver")
    d = root / "sep-verifier"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\nWORKDIR /app\n")
    (d / "instruction.md").write_text(
        "Write 42 to /app/answer.txt and done to /srv/out/report.txt\n"
    )
    (d / "task.toml").write_text(
        textwrap.dedent(
            """\
            version = "1.0"
            artifacts = ["/srv/out"]
            [environment]
            network_mode = "no-network"
            [verifier]
            timeout_sec = 60
            environment_mode = "separate"
            """
        )
    )
    (d / "tests" / "Dockerfile").write_text(
        "FROM sandgym/terminal:latest\nCOPY marker.txt /opt/verifier-marker.txt\n"
    )
    (d / "tests" / "marker.txt").write_text("verifier image\n")
    (d / "tests" / "test.sh").write_text(TEST_SH)
    return root


BACKENDS = REAL_BACKENDS


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest, task_root: Path) -> Iterator[BackgroundServer]:
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        backend=request.param,
        task_dirs=[task_root],
        include_builtin=False,
        pool_size=0,
    )
    with BackgroundServer(settings) as srv:
        yield srv


SOLVE = (
    "echo 42 > /app/answer.txt && mkdir -p /srv/out && echo done > /srv/out/report.txt && "
    "echo mine > /root/agent-note && ln -sf /etc/hostname /app/link"
)


async def _run(url: str, command: str | None) -> tuple[float, dict, str]:
    async with AsyncEnvClient(url) as env:
        await env.reset("sep-verifier", seed=0)
        seen = await env.step(
            {
                "kind": "command",
                "command": "ls -A /tests 2>&1; cat /opt/verifier-marker.txt 2>&1; true",
            }
        )
        if command:
            await env.step({"kind": "command", "command": command})
        res = await env.step({"kind": "submit"})
        assert res.terminated
        return res.reward, res.info, seen.observation["output"]


async def test_the_tests_run_in_their_own_sandbox(server: BackgroundServer) -> None:
    reward, info, seen = await _run(server.url, SOLVE)
    assert "test.sh" not in seen and "verifier image" not in seen  # invisible to the agent
    assert reward == 1.0, info.get("verifier_output")


async def test_noop_scores_zero(server: BackgroundServer) -> None:
    reward, info, _ = await _run(server.url, None)
    assert reward == 0.0
    assert "no-answer" in info["verifier_output"] and "no-marker" not in info["verifier_output"]
