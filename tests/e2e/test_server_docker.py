"""Full episodes through the server on the `docker` backend (needs Docker and the locally built
`sandgym/terminal` image; see images/bootstrap-base.sh)."""

from __future__ import annotations

import pytest

from sandgym.cli.run_cli import oracle_actions
from sandgym.client.env_client import AsyncEnvClient
from sandgym.tasks import TaskRegistry
from tests.e2e.conftest import docker_image_available

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
]


async def test_oracle_episode_on_docker_scores_one_and_resumes(make_server):
    srv = make_server("docker")
    task = TaskRegistry().get("builtin/hello-file")
    async with AsyncEnvClient(srv.url, reconnect_backoff_s=0.01) as env:
        _, info = await env.reset(task.id, seed=0)
        assert info["backend"] == "docker"
        await env.step("export MARK=docker-shell")
        await env.drop_connection()
        assert (await env.step("echo $MARK")).observation["output"].strip() == "docker-shell"
        for action in oracle_actions(task):
            await env.step(action)
        final = await env.step({"kind": "submit"})
    assert final.terminated is True and final.reward == 1.0, final.info.get("verifier_output")
