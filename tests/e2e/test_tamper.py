"""Rewards an agent cannot buy, through a real server on local and docker (docs/verification.md):

- an agent that plants a `usercustomize.py` in Python's user site (which every `python3` the
  verifier starts imports, and which writes reward 1 and exits) is paid in `shared` mode, and
  the reply's `info.tamper` names the file (category `python_startup`); `/metrics` counts it;
- `pristine`: the tests run in a fresh sandbox holding only the agent's working directory: the
  same agent gets 0, the honest one 1;
- `refuse-tampered`: the tampered episode scores 0 without the verifier (the reason in the
  output), the honest one 1;
- a path the task declares in `metadata.expected_changes` is not reported.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from tests.e2e.conftest import REAL_BACKENDS

CHECK = """\
import pathlib
answer = pathlib.Path("/app/answer.txt")
ok = answer.is_file() and answer.read_text().strip() == "42"
pathlib.Path("/logs/verifier/reward.txt").write_text("1" if ok else "0")
"""

#: the exploit: every python3 imports usercustomize from the user site at start-up
PLANT = (
    'd=$(python3 -c "import site; print(site.getusersitepackages())") && mkdir -p "$d" && '
    'printf \'import os\\nos.makedirs("/logs/verifier", exist_ok=True)\\n'
    'open("/logs/verifier/reward.txt", "w").write("1")\\nos._exit(0)\\n\' > "$d/usercustomize.py"'
)
HONEST = "echo 42 > /app/answer.txt"


def _task(root: Path, name: str, extra_toml: str = "") -> None:
    d = root / name
    for sub in ("environment", "tests", "solution"):
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
        + extra_toml
    )
    (d / "instruction.md").write_text("Write 42 to /app/answer.txt\n")
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\npython3 /tests/check.py\n"
    )
    (d / "tests" / "check.py").write_text(CHECK)
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{HONEST}\n")


@pytest.fixture(scope="module")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tamper")
    _task(root, "answer")
    _task(root, "answer-expected", '[metadata]\nexpected_changes = ["/root/.local/**"]\n')
    return root


@pytest.fixture(scope="module", params=REAL_BACKENDS)
def server(request: pytest.FixtureRequest, task_root: Path) -> Iterator[BackgroundServer]:
    srv = BackgroundServer(
        ServerSettings(host="127.0.0.1", port=0, backend=request.param, task_dirs=[task_root])
    )
    srv.start()
    yield srv
    srv.stop()


async def _episode(
    url: str, command: str, verify: str | None = None, task: str = "answer"
) -> tuple[float, dict[str, Any]]:
    async with AsyncEnvClient(url) as env:
        options = {"verify": verify} if verify else {}
        _, info = await env.reset(task, seed=0, options=options)
        assert info["verify"] == (verify or "shared")
        res = await env.step(command)
        assert res.observation["exit_code"] == 0, res.observation
        final = await env.step({"kind": "submit"})
    assert final.terminated
    return final.reward, final.info


def _tampered(info: dict[str, Any]) -> list[tuple[str, str]]:
    tamper = info["tamper"]
    assert tamper["checked"] is True, tamper
    return [(p["category"], p["path"].rsplit("/", 1)[-1]) for p in tamper["paths"]]


async def test_shared_mode_pays_the_exploit_and_reports_it(server: BackgroundServer) -> None:
    reward, info = await _episode(server.url, PLANT)
    assert reward == 1.0  # Harbor's shared verifier ran the agent's code
    assert info["verify"] == "shared"
    assert ("python_startup", "usercustomize.py") in _tampered(info)
    reward, info = await _episode(server.url, HONEST)
    assert reward == 1.0 and info["tamper"]["tampered"] is False, info["tamper"]
    async with httpx.AsyncClient() as http:
        text = (await http.get(server.http_url + "/metrics")).text
    assert 'sandgym_tamper_reports_total{report="tampered",verify="shared"} 1.0' in text
    assert 'sandgym_tamper_reports_total{report="clean",verify="shared"} 1.0' in text
    assert 'sandgym_tampered_paths_total{category="python_startup"}' in text


@pytest.mark.parametrize("verify", ["pristine", "refuse-tampered"])
async def test_protected_modes_do_not_pay_the_exploit(
    server: BackgroundServer, verify: str
) -> None:
    reward, info = await _episode(server.url, PLANT, verify)
    assert reward == 0.0, info.get("verifier_output")
    assert ("python_startup", "usercustomize.py") in _tampered(info)
    if verify == "refuse-tampered":
        assert "not verified (refuse-tampered)" in info["verifier_output"]
    reward, info = await _episode(server.url, HONEST, verify)
    assert reward == 1.0, info.get("verifier_output")
    assert info["tamper"]["tampered"] is False


async def test_expected_changes_are_not_reported(server: BackgroundServer) -> None:
    reward, info = await _episode(
        server.url, PLANT + " && " + HONEST, "refuse-tampered", task="answer-expected"
    )
    assert info["tamper"]["tampered"] is False and info["tamper"]["expected"] >= 1
    assert reward == 1.0


async def test_a_backend_without_a_change_set_refuses_refuse_tampered_at_reset(
    make_server: Any,
) -> None:
    """The null backend, like e2b, lists no changed paths: `refuse-tampered` cannot be kept, so
    the reset says so (never a silent unchecked episode); `shared` starts, its reset saying so."""
    from sandgym.client.env_client import EnvError
    from tests.e2e.conftest import NULL_TASK

    srv = make_server("null")
    async with AsyncEnvClient(srv.url) as env:
        with pytest.raises(EnvError) as info:
            await env.reset(NULL_TASK, seed=0, options={"verify": "refuse-tampered"})
        assert info.value.code == "unknown_task"
        assert "cannot list the paths a sandbox changed" in info.value.message
        _, reset_info = await env.reset(NULL_TASK, seed=0)
        assert reset_info["verify"] == "shared"
