"""Harbor's own released runner (`harbor run`, harbor 0.26.0, in its runner container) with
sandgym's environment provider (`--env sandgym.integrations.harbor:SandgymEnvironment`) against a real
`sandgym serve --backend docker`: the oracle agent solves a catalog task built from its
Dockerfile with a no-network policy (hello-file), and a task whose verifier phase has another
network than the agent's (net-phases: reward 1 only when the provider switched the network
between the phases). Afterwards the server holds no sandbox of the job."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lab.bench.harbor_runner import SANDGYM_ENV, ensure_runner_image, harbor_argv, read_trials
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from tests.e2e.conftest import docker_image_available

REPO = Path(__file__).resolve().parents[2]
TOKEN = "harbor-provider-e2e"

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
    pytest.mark.timeout(1500),
]


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        backend="docker",
        backend_options={"owner_id": "test-harbor-" + os.urandom(4).hex()},
        include_builtin=False,
        token=TOKEN,
    )
    with BackgroundServer(settings) as srv:
        yield srv


def test_harbor_run_oracle_with_sandgym_provider(server: BackgroundServer, tmp_path: Path) -> None:
    ensure_runner_image()  # built once from images/harbor-runner (pip install harbor==0.26.0)
    tasks = tmp_path / "tasks"
    shutil.copytree(REPO / "sandgym" / "tasks" / "catalog" / "hello-file", tasks / "hello-file")
    shutil.copytree(
        REPO / "tests" / "fixtures" / "harbor_provider" / "net-phases", tasks / "net-phases"
    )
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    argv = harbor_argv(
        tasks_path=tasks,
        jobs_dir=jobs,
        job_name="e2e",
        env=SANDGYM_ENV,
        agent="oracle",
        concurrency=2,
        server_url=server.http_url,
        token=TOKEN,
    )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    trials = read_trials(jobs / "e2e")
    detail = f"harbor exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert sorted(t.task for t in trials) == ["hello-file", "net-phases"], detail
    for t in trials:
        assert t.exception is None, (t, detail)
        assert t.reward == 1.0, (t, detail)
    # Harbor stopped every environment: the server holds none of the job's sandboxes
    r = httpx.get(server.http_url + "/v1/sandboxes", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.json()["count"] == 0, r.text
