"""The cost ledger of an episode (sandgym/server/cost.py), end to end on the real backends: the reply
that ends the episode carries `info.cost` (sandbox seconds by phase, CPU seconds and peak memory
from the sandbox's cgroup, bytes written, commands), the server's /metrics sums it, the trainer's
episode record keeps it with the tokens, and `sandgym runs cost` sums records per update and per
run, prices only what the price table names, and draws the PNG. What ran beside the sandbox is
counted with it (`companions`): a compose service and the private verifier's container (docker),
the sandbox a pristine or separate verifier made (local and docker)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgym.cli.main import main as sandgym_main
from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from sandgym.trainer.episode import Episode, EpisodeWriter
from sandgym.trainer.episode_runner import EpisodeSession, run_episode
from tests.e2e.conftest import NULL_TASK, REAL_BACKENDS, docker_image_available

MIB = 2**20


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.parametrize("backend", REAL_BACKENDS)
async def test_episode_cost_reaches_reply_metrics_record_and_report(
    backend: str, make_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    srv = make_server(backend)

    async def play(session: EpisodeSession) -> Any:
        # two commands: 8 MiB written, and a process that holds 64 MiB and burns some CPU
        await session.step({"kind": "command", "command": "head -c 8388608 /dev/urandom > big"})
        await session.step(
            {
                "kind": "command",
                "command": "python3 -c 'a = bytearray(64 * 2**20); sum(range(3 * 10**6))'",
            }
        )
        session.trajectory.steps[0].response_ids = [1, 2, 3]  # as if the policy wrote it
        session.trajectory.steps[0].loss_mask = [1, 1, 0]
        return "submitted"

    def client() -> AsyncEnvClient:
        return AsyncEnvClient(srv.url, request_timeout_s=120)

    ep = await run_episode(client, Episode(task_id=NULL_TASK, seed=0, group_id="g0"), play)
    assert ep.termination == "submitted", ep.error
    cost = ep.cost
    phases = cost["pool_s"] + cost["prepare_s"] + cost["agent_s"] + cost["verifier_s"]
    assert cost["backend"] == backend and cost["commands"] == 2
    assert cost["verifier_s"] > 0 and cost["agent_s"] > 0 and cost["prepare_s"] >= 0
    assert abs(cost["sandbox_s"] - phases) < 1e-6
    assert cost["cpu_s"] > 0
    assert cost["peak_memory_bytes"] >= 64 * MIB  # the cgroup saw the 64 MiB process
    assert cost["bytes_written"] >= 8 * MIB  # the file the agent wrote is on its disk

    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{srv.http_url}/metrics")).text
    assert _metric(text, "sandgym_commands_total") == 2
    assert abs(_metric(text, "sandgym_sandbox_seconds_total") - cost["sandbox_s"]) < 1e-6
    assert abs(_metric(text, "sandgym_sandbox_cpu_seconds_total") - cost["cpu_s"]) < 1e-6

    # the record, and the report over a run of two updates
    run_dir = tmp_path / "run"
    writer = EpisodeWriter(run_dir / "episodes.jsonl")
    writer.write(ep, received_at_version=0)
    writer.write(ep, received_at_version=1)
    other = Episode(task_id=NULL_TASK, seed=1, group_id="g1")
    other.trajectories = []
    writer.write(other, received_at_version=1)  # failed before any ledger: counted, unmetered
    writer.close()
    record = json.loads((run_dir / "episodes.jsonl").read_text().splitlines()[0])
    assert record["cost"]["tokens_generated"] == 3 and record["cost"]["tokens_trained"] == 2
    (run_dir / "prices.yaml").write_text(f"sandbox_second: {{{backend}: 0.5}}\ntoken_trained: 2\n")

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sandgym_main(["runs", "cost", str(run_dir), "--json"]) == 0
    report = json.loads(out.getvalue())
    run = report["run"]
    assert run["episodes"] == 3 and run["unmetered"] == 1
    assert abs(run["sandbox_s"] - 2 * cost["sandbox_s"]) < 1e-6
    assert run["commands"] == 4 and run["tokens_trained"] == 4
    assert [u["update"] for u in report["updates"]] == [0, 1]
    assert report["updates"][1]["episodes"] == 2
    money = report["money"]
    assert abs(money["items"][f"sandbox_seconds[{backend}]"] - 0.5 * run["sandbox_s"]) < 1e-6
    assert money["items"]["token_trained"] == 8
    assert set(money["unpriced"]) == {"cpu_second", "token_generated"}  # nothing invented
    assert Path(report["png"]).read_bytes()[:4] == b"\x89PNG"  # noqa: ASYNC240


COMPOSE = """\
services:
  main:
    environment:
      FROM_COMPOSE: "yes"
  svc:
    image: sandgym/terminal
    command: ["sleep", "infinity"]
"""

#: the tests hold 48 MiB in their container's /dev/shm (charged to its cgroup), then score 1
HOLDING_TESTS = """\
#!/bin/bash
dd if=/dev/zero of=/dev/shm/held bs=1M count=48 2>/dev/null
mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt
"""


@pytest.mark.docker
@pytest.mark.skipif(not docker_image_available(), reason="sandgym/terminal not built")
async def test_ledger_counts_the_compose_service_and_the_private_verifier(tmp_path: Path) -> None:
    """An episode on docker whose task has a compose service and whose tests run in the private
    verifier's own container: `info.cost.companions` holds both, each with its seconds, CPU
    seconds and peak memory (the verifier's at least the 48 MiB its tests held), and /metrics
    sums their seconds by kind."""
    t = tmp_path / "tasks" / "with-service"
    for sub in ("environment", "tests", "solution"):
        (t / sub).mkdir(parents=True)
    (t / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60\n')
    (t / "instruction.md").write_text("Nothing to do.\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "environment" / "docker-compose.yaml").write_text(COMPOSE)
    (t / "tests" / "test.sh").write_text(HOLDING_TESTS)
    (t / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    settings = ServerSettings(
        host="127.0.0.1", port=0, backend="docker", task_dirs=[tmp_path / "tasks"],
        include_builtin=False, pool_size=0,
    )  # fmt: skip
    srv = BackgroundServer(settings, None)
    srv.start()
    try:

        async def play(session: EpisodeSession) -> Any:
            await session.step({"kind": "command", "command": "echo $FROM_COMPOSE"})
            return "submitted"

        def client() -> AsyncEnvClient:
            return AsyncEnvClient(srv.url, request_timeout_s=180)

        ep = await run_episode(client, Episode(task_id="with-service", seed=0), play)
        assert ep.termination == "submitted", ep.error
        cost = ep.cost
        assert cost["peak_memory_bytes"] is not None and cost["peak_memory_unavailable"] is None
        kinds = sorted(c["kind"] for c in cost["companions"])
        assert kinds == ["service", "verifier"], cost["companions"]
        for c in cost["companions"]:
            assert c["seconds"] > 0 and c["cpu_s"] is not None, c
            assert c["peak_memory_bytes"] is not None and c["peak_memory_unavailable"] is None, c
        service = next(c for c in cost["companions"] if c["kind"] == "service")
        verifier = next(c for c in cost["companions"] if c["kind"] == "verifier")
        assert service["name"] == "svc" and verifier["peak_memory_bytes"] >= 48 * MIB
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"{srv.http_url}/metrics")).text
        got = _metric(text, 'sandgym_companion_seconds_total{kind="verifier"}')
        assert abs(got - verifier["seconds"]) < 1e-6
    finally:
        srv.stop()


@pytest.mark.parametrize("backend", REAL_BACKENDS)
async def test_ledger_counts_the_pristine_verifier_sandbox(
    backend: str, make_server: Callable[..., BackgroundServer]
) -> None:
    """A pristine verify makes a sandbox of its own for the tests: the ledger of the episode
    counts it (`kind: pristine`, its seconds, CPU and peak memory, read before it closed)."""
    srv = make_server(backend)
    async with AsyncEnvClient(srv.url, request_timeout_s=180) as env:
        await env.reset(NULL_TASK, seed=0, options={"verify": "pristine"})
        await env.step("echo hello > /app/hello.txt")
        res = await env.step({"kind": "submit"})
    assert res.terminated and res.reward == 1.0, res.info.get("verifier_output")
    companions = res.info["cost"]["companions"]
    pristine = [c for c in companions if c["kind"] == "pristine"]
    assert len(pristine) == 1, companions
    assert pristine[0]["seconds"] > 0 and pristine[0]["cpu_s"] is not None, pristine
    assert pristine[0]["peak_memory_bytes"] is not None, pristine


@pytest.mark.parametrize("backend", REAL_BACKENDS)
async def test_ledger_counts_the_separate_verifier_sandbox(backend: str, tmp_path: Path) -> None:
    """A Harbor separate verifier (`environment_mode = "separate"`) runs the tests in a sandbox
    of their own: the episode's ledger counts it (`kind: separate_verifier`)."""
    t = tmp_path / "tasks" / "sep"
    for sub in ("environment", "tests"):
        (t / sub).mkdir(parents=True)
    (t / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 60\nenvironment_mode = "separate"\n'
    )
    (t / "instruction.md").write_text("Nothing to do.\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\nWORKDIR /app\n")
    (t / "tests" / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n"
    )
    settings = ServerSettings(
        host="127.0.0.1", port=0, backend=backend, task_dirs=[tmp_path / "tasks"],
        include_builtin=False, pool_size=0,
    )  # fmt: skip
    with BackgroundServer(settings) as srv:
        async with AsyncEnvClient(srv.url, request_timeout_s=180) as env:
            await env.reset("sep", seed=0)
            res = await env.step({"kind": "submit"})
    assert res.terminated and res.reward == 1.0, res.info.get("verifier_output")
    companions = res.info["cost"]["companions"]
    separate = [c for c in companions if c["kind"] == "separate_verifier"]
    assert len(separate) == 1, companions
    assert separate[0]["seconds"] > 0 and separate[0]["cpu_s"] is not None, separate
    assert separate[0]["peak_memory_bytes"] is not None, separate
