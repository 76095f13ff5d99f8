"""Harbor multi-step tasks through a real env server, on local and docker: three steps walked in
one sandbox, each step's files and setup.sh applied before it, its tests (over the task's shared
tests/) scoring it on `submit`, a `min_reward` gate that ends the episode early, and both of
Harbor's aggregations (`mean`, `final`); the oracle checker runs every step's solution.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.cli.run_cli import oracle_step_actions
from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from sandgym.tasks.loaders import load_task_dir
from tests.e2e.conftest import REAL_BACKENDS, local_available

STEPS = ("one", "two", "three")


def make_task(root: Path, name: str, strategy: str, gate: bool, health: str | None = None) -> Path:
    """Step N asks for /app/N.txt holding N; step two's setup.sh leaves a marker its tests
    need; every step's test.sh sources the task's shared tests/lib.sh."""
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\nWORKDIR /app\n")
    gate_line = "min_reward = 1.0\n" if gate else ""
    health_toml = (
        f'[steps.healthcheck]\ncommand = "{health}"\ninterval_sec = 0.2\n'
        "start_interval_sec = 0.2\ntimeout_sec = 5\nretries = 3\nstart_period_sec = 5\n"
        if health
        else ""
    )
    steps_toml = "".join(
        f'[[steps]]\nname = "{s}"\n'
        + (gate_line if s == "one" else "")
        + (health_toml if s == "two" else "")
        for s in STEPS
    )
    (d / "task.toml").write_text(
        f'version = "1.0"\nmulti_step_reward_strategy = "{strategy}"\n'
        '[environment]\nnetwork_mode = "no-network"\n[verifier]\ntimeout_sec = 60\n' + steps_toml
    )
    (d / "tests" / "lib.sh").write_text(
        "reward() { mkdir -p /logs/verifier; echo $1 > /logs/verifier/reward.txt; }\n"
    )
    for s in STEPS:
        sd = d / "steps" / s
        (sd / "tests").mkdir(parents=True)
        (sd / "solution").mkdir()
        (sd / "instruction.md").write_text(f"Step {s}: write {s} to /app/{s}.txt\n")
        extra = " && [ -f /app/setup-two.marker ]" if s == "two" else ""
        (sd / "tests" / "test.sh").write_text(
            textwrap.dedent(
                f"""\
                #!/bin/bash
                source /tests/lib.sh
                if [ "$(cat /app/{s}.txt 2>/dev/null)" = {s} ]{extra}; then reward 1; else reward 0; fi
                """
            )
        )
        (sd / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {s} > /app/{s}.txt\n")
    wd = d / "steps" / "two" / "workdir"
    wd.mkdir()
    # the marker, and (for the healthcheck) a service that is ready only a second later
    (wd / "setup.sh").write_text(
        "#!/bin/bash\ntouch /app/setup-two.marker\n"
        "(sleep 1; touch /app/ready) >/dev/null 2>&1 </dev/null &\n"
    )
    (wd / "given.txt").write_text("a file step two brings\n")
    return d


@pytest.fixture(scope="module")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("multistep")
    make_task(root, "ms-mean-gated", "mean", gate=True)
    make_task(root, "ms-final", "final", gate=False)
    make_task(root, "ms-mean", "mean", gate=False)
    make_task(root, "ms-health", "mean", gate=False, health="test -f /app/ready")
    make_task(root, "ms-health-fails", "mean", gate=False, health="test -f /app/never")
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


async def _episode(
    url: str, task_id: str, per_step: list[list[dict[str, Any]]]
) -> tuple[list[Any], str]:
    """Plays each step's actions then a submit until the episode ends; the submit replies and
    the first observation."""
    replies = []
    async with AsyncEnvClient(url) as env:
        obs, _ = await env.reset(task_id, seed=0)
        first = obs["output"]
        for actions in per_step:
            for a in actions:
                await env.step(a)
            res = await env.step({"kind": "submit"})
            replies.append(res)
            if res.terminated or res.truncated:
                break
    return replies, first


async def test_oracle_walks_every_step(server: BackgroundServer, task_root: Path) -> None:
    task = load_task_dir(task_root / "ms-mean-gated")
    replies, first = await _episode(server.url, "ms-mean-gated", oracle_step_actions(task))
    assert "Step one" in first
    assert [r.terminated for r in replies] == [False, False, True]
    # while steps remain: reward 0, the next instruction, the step scored
    assert replies[0].reward == 0.0 and "Step two" in replies[0].observation["output"]
    assert replies[0].info["step"] == {
        "name": "one",
        "index": 0,
        "count": 3,
        "reward": 1.0,
        "rewards": [1.0],
        "next": {"name": "two", "index": 1},
    }
    assert replies[1].info["step"]["rewards"] == [1.0, 1.0]  # setup.sh ran before step two
    last = replies[-1]
    assert last.reward == 1.0
    assert last.info["step"]["rewards"] == [1.0, 1.0, 1.0]
    assert last.info["step"]["aggregate"] == "mean"


async def test_noop_is_stopped_by_the_gate(server: BackgroundServer) -> None:
    replies, _ = await _episode(server.url, "ms-mean-gated", [[], [], []])
    assert len(replies) == 1 and replies[0].terminated
    assert replies[0].reward == 0.0
    step = replies[0].info["step"]
    assert step["rewards"] == [0.0] and step["stopped"].startswith("min_reward: reward=0.0")


async def test_noop_without_a_gate_walks_every_step(server: BackgroundServer) -> None:
    replies, _ = await _episode(server.url, "ms-mean", [[], [], []])
    assert [r.terminated for r in replies] == [False, False, True]
    assert replies[-1].reward == 0.0 and replies[-1].info["step"]["rewards"] == [0.0, 0.0, 0.0]


def _only_last_step(task_root: Path, name: str) -> list[list[dict[str, Any]]]:
    return [[], [], oracle_step_actions(load_task_dir(task_root / name))[2]]


@pytest.mark.parametrize(("name", "reward"), [("ms-final", 1.0), ("ms-mean", 1 / 3)])
async def test_aggregations(
    server: BackgroundServer, task_root: Path, name: str, reward: float
) -> None:
    replies, _ = await _episode(server.url, name, _only_last_step(task_root, name))
    assert replies[-1].terminated
    assert replies[-1].info["step"]["rewards"] == [0.0, 0.0, 1.0]
    assert replies[-1].reward == pytest.approx(reward)


async def test_the_next_steps_tests_are_not_left_for_the_agent(server: BackgroundServer) -> None:
    async with AsyncEnvClient(server.url) as env:
        await env.reset("ms-mean", seed=0)
        res = await env.step({"kind": "submit"})
        assert not res.terminated
        res = await env.step({"kind": "command", "command": "ls /tests; cat /app/given.txt"})
        assert "test.sh" not in res.observation["output"]
        assert "a file step two brings" in res.observation["output"]


def test_tasks_check_runs_every_steps_oracle(task_root: Path) -> None:
    import asyncio

    from sandgym.tasks.cli import check_tasks

    if not local_available():
        pytest.skip("bubblewrap not installed")
    task = load_task_dir(task_root / "ms-mean-gated")
    (check,) = asyncio.run(check_tasks([task], "local", {}))
    assert check.error is None
    assert (check.oracle_reward, check.noop_reward) == (1.0, 0.0)
    entry = check.to_entry()
    assert entry["oracle_step_rewards"] == [1.0, 1.0, 1.0]
    assert entry["noop_step_rewards"] == [0.0]


async def test_a_step_healthcheck_holds_the_step_until_ready(server: BackgroundServer) -> None:
    async with AsyncEnvClient(server.url) as env:
        await env.reset("ms-health", seed=0)
        res = await env.step({"kind": "submit"})
        assert not res.terminated and "Step two" in res.observation["output"]
        res = await env.step({"kind": "command", "command": "test -f /app/ready && echo READY"})
        assert "READY" in res.observation["output"]


async def test_a_failing_step_healthcheck_ends_the_episode_with_its_output(
    server: BackgroundServer,
) -> None:
    async with AsyncEnvClient(server.url) as env:
        await env.reset("ms-health-fails", seed=0)
        res = await env.step({"kind": "submit"})
        assert res.terminated and res.reward == 0.0
        step = res.info["step"]
        assert step["rewards"] == [0.0]
        assert step["stopped"].startswith("step 'two'") and "test -f /app/never" in step["stopped"]
