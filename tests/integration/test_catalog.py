"""The built-in catalog and the real-format fixtures, end to end on real backends.

For every terminal task of the catalog: the oracle solution scores 1.0 and a no-op episode 0.0,
on `local` (bubblewrap, unmarked) and on `docker` (marked), one test per task. The catalog is
checked once per backend in a background thread with its own concurrency (`CatalogRun`); each
task's test waits only for its own entry, so its timeout bounds one task, not the whole catalog
on a busy machine. Plus the tamper test: an agent that forges a reward file and rewrites a test
file before submitting gains nothing.
Desktop tasks of the catalog need their own image and are checked by the desktop tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import posixpath
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes import BackendUnavailableError, get_backend
from sandgym.tasks import (
    TaskRegistry,
    load_dataset,
    load_task_dir,
    prepare_episode,
    run_oracle,
    run_verifier,
    sandbox_spec_for,
)
from sandgym.tasks.check import TaskCheck
from sandgym.tasks.cli import check_tasks
from sandgym.tasks.models import TaskSpec

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "tasks"
# The fixtures' verifiers run `python3 -m pytest` with pytest already in the image (the real
# t-bench images, and so their stand-ins, have none): map them onto the terminal image.
IMAGE_MAP = {
    name: "sandgym/terminal:latest"
    for name in (
        "ubuntu:24.04",
        "ghcr.io/laude-institute/t-bench/python-3-13:20250620",
        "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624",
    )
}


def terminal_catalog() -> list[TaskSpec]:
    return [t for t in TaskRegistry().list() if t.metadata.get("category") != "desktop"]


def assert_all_pass(entries: list[dict]) -> None:
    bad = [e for e in entries if e["error"] or e["oracle_reward"] != 1.0 or e["noop_reward"] != 0.0]
    assert not bad, "\n".join(str(e)[:600] for e in bad)


def local_backend_or_skip() -> None:
    try:
        get_backend("local")
    except BackendUnavailableError as exc:
        pytest.skip(f"local backend unavailable: {exc}")


def docker_or_skip() -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI")
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers: {exc}")
    # the terminal image every catalog task builds FROM (idempotent; built offline)
    subprocess.run(["bash", str(REPO / "images" / "bootstrap-base.sh")], check=True, timeout=900)


def host_python_has_pytest() -> bool:
    return (
        subprocess.run(["/usr/bin/python3", "-c", "import pytest"], capture_output=True).returncode
        == 0
    )


CATALOG_IDS = [t.id for t in terminal_catalog()]
#: one task's check (build, oracle episode, no-op episode) takes seconds to a minute on a busy
#: machine; the per-task wait and the test's timeout are hang guards well above that
TASK_WAIT_S = 540


class CatalogRun:
    """`check_tasks` over some tasks, in a thread with its own event loop, started at the first
    `entry()`; each finished entry resolves that task's future (in the given order, as the
    concurrency frees a slot)."""

    def __init__(
        self,
        backend: str,
        tasks: list[TaskSpec],
        concurrency: int,
        image_map: dict[str, str] | None = None,
    ) -> None:
        self.tasks, self.image_map = tasks, image_map or {}
        self.backend, self.concurrency = backend, concurrency
        self.futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {
            t.id: concurrent.futures.Future() for t in tasks
        }
        self.thread = threading.Thread(target=self._run, name=f"catalog-{backend}", daemon=True)

    def _run(self) -> None:
        def done(check: TaskCheck) -> None:
            self.futures[check.task_id].set_result(check.to_entry())

        try:
            asyncio.run(
                check_tasks(
                    self.tasks, self.backend, self.image_map, 0, self.concurrency, on_result=done
                )
            )
        except BaseException as exc:
            for f in self.futures.values():
                if not f.done():
                    f.set_exception(exc)

    def entry(self, task_id: str) -> dict[str, Any]:
        if self.thread.ident is None:
            self.thread.start()
        try:
            return self.futures[task_id].result(timeout=TASK_WAIT_S)
        except concurrent.futures.TimeoutError:
            pytest.fail(f"{task_id}: no result after {TASK_WAIT_S} s (a hang?)")

    def close(self) -> None:
        if self.thread.ident:  # let the sandboxes of the tasks still running be closed
            self.thread.join(timeout=TASK_WAIT_S)


def selected(
    request: pytest.FixtureRequest, test_name: str, tasks: list[TaskSpec]
) -> list[TaskSpec]:
    """The tasks whose test of this name the session runs (after -k and friends)."""
    ids = {
        item.callspec.params["task_id"]
        for item in request.session.items
        if getattr(item, "originalname", None) == test_name and hasattr(item, "callspec")
    }
    return [t for t in tasks if t.id in ids]


# -- local ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_catalog(request: pytest.FixtureRequest) -> Iterator[CatalogRun]:
    local_backend_or_skip()
    run = CatalogRun(
        "local", selected(request, "test_catalog_task_on_local", terminal_catalog()), 2
    )
    yield run
    run.close()


def test_the_catalog_has_its_terminal_tasks() -> None:
    assert len(CATALOG_IDS) >= 30


@pytest.mark.timeout(TASK_WAIT_S + 60)
@pytest.mark.parametrize("task_id", CATALOG_IDS)
def test_catalog_task_on_local(local_catalog: CatalogRun, task_id: str) -> None:
    assert_all_pass([local_catalog.entry(task_id)])


async def test_procedural_tasks_vary_with_seed_on_local() -> None:
    local_backend_or_skip()
    procedural = [t for t in terminal_catalog() if t.procedural]
    assert len({t.metadata["category"] for t in procedural}) >= 2
    backend = get_backend("local")
    for task in procedural:
        secrets = set()
        for seed in (1, 2):
            sb = await backend.create(sandbox_spec_for(task))
            try:
                setup = await prepare_episode(task, sb, seed)
                secrets.add(setup.secret["expected"])
                await run_oracle(task, sb, setup)
                assert (await run_verifier(task, sb, setup)).reward == 1.0, (task.id, seed)
            finally:
                await sb.close()
        assert len(secrets) == 2, f"{task.id}: seeds 1 and 2 gave the same instance"


@pytest.mark.parametrize("name", ["file-ops", "file-facts", "path-ops"])
async def test_generated_instructions_vary_and_reach_the_agent_on_local(name: str) -> None:
    """A generator's own instruction ($SANDGYM_INSTRUCTION_FILE) replaces instruction.md: it
    differs between seeds, names a path in the instance's directory (the path itself may be one to
    create), and the oracle (which reads it) solves every seed while an untouched sandbox fails."""
    local_backend_or_skip()
    task = TaskRegistry().get(f"builtin/{name}")
    backend = get_backend("local")
    seen = set()
    for seed in range(6):
        for oracle in (True, False):
            sb = await backend.create(sandbox_spec_for(task))
            try:
                setup = await prepare_episode(task, sb, seed)
                assert setup.instruction != task.instruction
                named = setup.instruction.split("`")[1]
                assert named.startswith("/app/")
                assert (await sb.exec(["ls", posixpath.dirname(named)])).exit_code == 0
                seen.add(setup.instruction)
                if oracle:
                    await run_oracle(task, sb, setup)
                reward = (await run_verifier(task, sb, setup)).reward
                assert reward == (1.0 if oracle else 0.0), (name, seed, setup.instruction)
            finally:
                await sb.close()
    assert len(seen) == 6, "seeds gave repeated instructions"


async def test_fixtures_on_local() -> None:
    local_backend_or_skip()
    tasks = load_dataset(FIXTURES) + load_dataset(FIXTURES / "lis" / "instances.jsonl")
    if not host_python_has_pytest():
        # Terminal-Bench/SETA verifiers run pytest with the host's /usr/bin/python3 on local
        tasks = [t for t in tasks if t.verifier.kind not in ("tbench", "seta")]
    assert_all_pass([c.to_entry() for c in await check_tasks(tasks, "local", IMAGE_MAP)])


@pytest.mark.parametrize("task_id", ["builtin/hello-file", "builtin/csv-column-sum"])
async def test_tampering_does_not_change_reward_on_local(task_id: str) -> None:
    local_backend_or_skip()
    await _tamper_check(TaskRegistry().get(task_id), "local")


# -- docker ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_catalog(request: pytest.FixtureRequest) -> Iterator[CatalogRun]:
    docker_or_skip()
    run = CatalogRun(
        "docker", selected(request, "test_catalog_task_on_docker", terminal_catalog()), 3
    )
    yield run
    run.close()


@pytest.mark.docker
@pytest.mark.timeout(TASK_WAIT_S + 60)
@pytest.mark.parametrize("task_id", CATALOG_IDS)
def test_catalog_task_on_docker(docker_catalog: CatalogRun, task_id: str) -> None:
    assert_all_pass([docker_catalog.entry(task_id)])


def fixture_tasks() -> list[TaskSpec]:
    return load_dataset(FIXTURES) + load_dataset(FIXTURES / "lis" / "instances.jsonl")


@pytest.fixture(scope="module")
def docker_fixtures(request: pytest.FixtureRequest) -> Iterator[CatalogRun]:
    docker_or_skip()
    tasks = selected(request, "test_fixture_on_docker", fixture_tasks())
    run = CatalogRun("docker", tasks, 2, IMAGE_MAP)
    yield run
    run.close()


@pytest.mark.docker
@pytest.mark.timeout(TASK_WAIT_S + 60)
@pytest.mark.parametrize("task_id", [t.id for t in fixture_tasks()])
def test_fixture_on_docker(docker_fixtures: CatalogRun, task_id: str) -> None:
    assert_all_pass([docker_fixtures.entry(task_id)])


@pytest.mark.docker
@pytest.mark.parametrize("task_id", ["builtin/hello-file", "builtin/csv-column-sum"])
async def test_tampering_does_not_change_reward_on_docker(task_id: str) -> None:
    docker_or_skip()
    await _tamper_check(TaskRegistry().get(task_id), "docker")


@pytest.mark.docker
async def test_tbench_tampering_on_docker() -> None:
    docker_or_skip()
    await _tamper_check(load_task_dir(FIXTURES / "tbench-modern"), "docker", IMAGE_MAP)


async def _tamper_check(
    task: TaskSpec, backend_name: str, image_map: dict[str, str] | None = None
) -> None:
    """The agent forges reward files and plants a passing test script, without solving the
    task: reward stays 0.0. Then it solves the task and tampers again: reward stays 1.0."""
    backend = get_backend(backend_name)
    forge = (
        "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
        "echo '{\"reward\": 1}' > /logs/verifier/reward.json && "
        "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
        "cp /tests/test.sh /tests/run-tests.sh && "
        "mkdir -p /tests/secret && echo forged > /tests/secret/expected"
    )
    try:
        for solve, want in ((False, 0.0), (True, 1.0)):
            sb = await backend.create(sandbox_spec_for(task, image_map))
            try:
                setup = await prepare_episode(task, sb, seed=5)
                if solve:
                    await run_oracle(task, sb, setup)
                r = await sb.exec(forge, user=task.agent_user)
                assert r.exit_code == 0, r
                result = await run_verifier(task, sb, setup)
                assert result.reward == want, (task.id, solve, result.output[-800:])
            finally:
                await sb.close()
    finally:
        await backend.aclose()


async def test_dockerfile_applied_on_local() -> None:
    """WORKDIR, ENV and COPY are applied; RUN is skipped with a warning unless opted in."""
    local_backend_or_skip()
    task = load_task_dir(FIXTURES / "harbor-legacy")
    backend = get_backend("local")
    for allow_run in (False, True):
        sb = await backend.create(sandbox_spec_for(task, allow_run=allow_run))
        try:
            setup = await prepare_episode(task, sb, 0)
            r = await sb.exec("pwd; echo $GREETING; cat data/input.txt; cat /app/out/.built")
            assert r.stdout.startswith("/app\nhello there\nalpha\nbeta\ngamma\n")
            assert ("built" in r.stdout) == allow_run
            assert bool(setup.warnings) != allow_run
        finally:
            await sb.close()
