"""Scores are sacred, end to end: what an agent leaves behind can fail its episode, never get it
masked. Through a real server (`local`, and `docker` when its image is built) and the trainer's
own `EpisodeRunner`:

- a FIFO at the file the tests read makes the verifier block until its timeout: `verifier_error`
  (cause `timeout`), and the trainer records it as a failed episode scored 0, not masked; the
  server stays healthy and the next episode scores normally;
- a file that crashes the test script (invalid JSON where the tests `json.load`): `verifier_error`
  (cause `no_reward`), scored 0, not masked;
- a catalog task with a FIFO at its file: the checker refuses it at once (reward 0, no timeout);
- a catalog checker that cannot run (its secret is missing): `verifier_error`, not a silent 0;
- a Terminal-Bench 1 task whose tests block on a FIFO past `max_test_timeout_sec`: scored as
  its harness scores it (unresolved): reward 0.0 with `info.verifier_reason = "test_timeout"`.
"""

from __future__ import annotations

import shutil
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from sandgym.tasks.registry import CATALOG_DIR
from sandgym.trainer.agents import OracleAgent
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.rollout import EpisodeRunner
from tests.e2e.conftest import docker_image_available, local_available

VERIFIER_TIMEOUT_S = 4


def _task(root: Path, name: str, test_sh: str, solve: str) -> None:
    t = root / name
    for d in ("environment", "tests", "solution"):
        (t / d).mkdir(parents=True)
    (t / "task.toml").write_text(
        f'version = "1.0"\n[verifier]\ntimeout_sec = {VERIFIER_TIMEOUT_S}\n'
        '[environment]\nnetwork_mode = "no-network"\n'
    )
    (t / "instruction.md").write_text(f"Task {name}.\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "tests" / "test.sh").write_text(textwrap.dedent(test_sh))
    (t / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve + "\n")


@pytest.fixture(scope="module")
def gaming_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gaming")
    # a typical Harbor test script: reads the agent's answer file (blocks on a FIFO)
    _task(
        root,
        "fifo-answer",
        """\
        #!/bin/bash
        mkdir -p /logs/verifier
        if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
        """,
        "echo 42 > /app/answer.txt",
    )
    # a test script that crashes on a malformed file (set -e, json.load)
    _task(
        root,
        "json-answer",
        """\
        #!/bin/bash
        set -e
        mkdir -p /logs/verifier
        python3 -c 'import json; assert json.load(open("/app/out.json"))["ok"] is True'
        echo 1 > /logs/verifier/reward.txt
        """,
        "echo '{\"ok\": true}' > /app/out.json",
    )
    # a catalog checker that cannot run: hello-file whose check.py needs a secret it lacks
    broken = root / "broken-checker"
    shutil.copytree(CATALOG_DIR / "hello-file", broken)
    check = broken / "tests" / "check.py"
    check.write_text(check.read_text().replace('print("PASS")', 'secret()\nprint("PASS")'))
    # a Terminal-Bench 1 task (task.yaml, run-tests.sh) whose tests read the agent's answer
    tb1 = root / "tb1-answer"
    (tb1 / "tests").mkdir(parents=True)
    (tb1 / "task.yaml").write_text(
        "instruction: Write 42 to /app/answer.txt\nparser_name: pytest\n"
        f"max_test_timeout_sec: {VERIFIER_TIMEOUT_S}\n"
    )
    (tb1 / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (tb1 / "run-tests.sh").write_text(
        "#!/bin/bash\nanswer=$(cat /app/answer.txt)\necho '=== short test summary info ==='\n"
        'if [ "$answer" = 42 ]; then echo "PASSED test_outputs.py::test_answer"; '
        'else echo "FAILED test_outputs.py::test_answer"; fi\n'
    )
    (tb1 / "tests" / "test_outputs.py").write_text("def test_answer():\n    pass\n")
    (tb1 / "solution.sh").write_text("#!/bin/bash\necho 42 > /app/answer.txt\n")
    return root


def _backends() -> list[Any]:
    return [
        pytest.param(
            "local", marks=pytest.mark.skipif(not local_available(), reason="bwrap missing")
        ),
        pytest.param(
            "docker",
            marks=[
                pytest.mark.docker,
                pytest.mark.skipif(not docker_image_available(), reason="no sandgym/terminal"),
            ],
        ),
    ]


@pytest.fixture(params=_backends())
def server(request: pytest.FixtureRequest, gaming_tasks: Path) -> Any:
    settings = ServerSettings(
        host="127.0.0.1", port=0, backend=request.param, task_dirs=[gaming_tasks]
    )
    srv = BackgroundServer(settings)
    srv.start()
    yield srv
    srv.stop()


def _runner(url: str, solutions: dict[str, str]) -> EpisodeRunner:
    cfg = TrainConfig.model_validate(
        {"env": {"task_ids": list(solutions), "server_urls": [url]}, "model": {"source": "tiny"}}
    )
    return EpisodeRunner(cfg, None, OracleAgent(solutions))


async def test_fifo_at_the_tested_file_is_a_failed_episode_not_masked(server: Any) -> None:
    runner = _runner(server.url, {"fifo-answer": "mkfifo /app/answer.txt"})
    t0 = time.monotonic()
    ep = await runner.run_episode("fifo-answer", 0)
    assert ep.termination == "verifier_error" and ep.reward == 0.0, ep.error
    assert "[timeout]" in (ep.error or "")
    assert not ep.is_infra_failure  # scored 0 in its group, never dropped
    assert time.monotonic() - t0 < VERIFIER_TIMEOUT_S + 60
    # the server is still healthy: /healthz answers and the next episode scores normally
    async with httpx.AsyncClient() as http:
        assert (await http.get(server.http_url + "/healthz")).status_code == 200
    ok = await _runner(server.url, {"fifo-answer": "echo 42 > /app/answer.txt"}).run_episode(
        "fifo-answer", 1
    )
    assert ok.termination == "submitted" and ok.reward == 1.0, ok.error


async def test_test_crashing_file_is_a_failed_episode_not_masked(server: Any) -> None:
    ep = await _runner(server.url, {"json-answer": "echo '{not json' > /app/out.json"}).run_episode(
        "json-answer", 0
    )
    assert ep.termination == "verifier_error" and ep.reward == 0.0, ep.error
    assert "[no_reward]" in (ep.error or "") and not ep.is_infra_failure
    good = _runner(server.url, {"json-answer": "echo '{\"ok\": true}' > /app/out.json"})
    ep = await good.run_episode("json-answer", 1)
    assert ep.termination == "submitted" and ep.reward == 1.0, ep.error


async def test_catalog_checker_refuses_a_fifo_at_once(server: Any) -> None:
    async with AsyncEnvClient(server.url) as env:
        await env.reset("builtin/hello-file", seed=0)
        await env.step("mkfifo /app/hello.txt")
        final = await env.step({"kind": "submit"})
    # Refused at once, not after blocking: a checker that opened the FIFO would block until the
    # verifier's timeout and its output would hold no verdict (no wall-clock assert needed).
    assert final.terminated and final.reward == 0.0
    assert "is not a regular file" in final.info["verifier_output"]


async def test_catalog_checker_that_cannot_run_is_a_verifier_error(server: Any) -> None:
    async with AsyncEnvClient(server.url) as env:
        await env.reset("broken-checker", seed=0)
        await env.step("printf 'Hello, world!\\n' > /app/hello.txt")
        with pytest.raises(EnvError) as info:
            await env.step({"kind": "submit"})
    assert info.value.code == "verifier_error"
    assert "[no_reward]" in info.value.message and "check.py could not run" in info.value.message


async def test_terminal_bench_1_tests_past_their_limit_score_0_with_the_reason(
    server: Any,
) -> None:
    async with AsyncEnvClient(server.url) as env:
        await env.reset("tb1-answer", seed=0)
        await env.step("mkfifo /app/answer.txt")
        final = await env.step({"kind": "submit"})
    assert final.terminated and final.reward == 0.0
    assert final.info["verifier_reason"] == "test_timeout"
    async with AsyncEnvClient(server.url) as env:  # the same task, solved: 1.0, no reason
        await env.reset("tb1-answer", seed=1)
        await env.step("echo 42 > /app/answer.txt")
        ok = await env.step({"kind": "submit"})
    assert ok.terminated and ok.reward == 1.0 and "verifier_reason" not in ok.info
