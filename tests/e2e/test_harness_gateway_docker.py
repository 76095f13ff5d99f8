"""The harness agent inside a *docker* sandbox (network `none`) solving a catalog task, its model
served by the gateway on the host's loopback through the bind-mounted bridge directory.

The engine is the scripted test double of test_harness_gateway.py (the model only); the server,
the container, the bridge, the gateway and the verifier are real.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandgym.client.env_client import AsyncEnvClient
from sandgym.sandboxes import SandboxSpec, get_backend
from sandgym.sandboxes.network import PUBLIC
from sandgym.server.runner import BackgroundServer
from sandgym.trainer.config import ModelSettings
from sandgym.trainer.gateway import CallStore, GatewayServer, ModelGateway
from sandgym.trainer.harness import HarnessRunner
from sandgym.trainer.models import load_tokenizer
from tests.e2e.conftest import docker_image_available
from tests.e2e.test_harness_gateway import SOLVE, ScriptedEngine, assert_public_sandbox_reaches
from tests.netprobe import Banner, default_gateway

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
]


async def test_harness_in_docker_sandbox_solves_hello_file_through_the_gateway(
    make_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    tok: Any = load_tokenizer(ModelSettings(source="tiny"))
    srv = make_server("docker")
    # The no-network probe: a listener on this machine's end of Docker's bridge, which a public
    # container reaches (checked below), so the probe can fail only for want of a network.
    backend = get_backend("docker")
    spec = SandboxSpec(image="sandgym/terminal:latest", network=PUBLIC)
    sb = await backend.create(spec)
    try:
        bridge_host = default_gateway((await sb.exec("cat /proc/net/route")).stdout)
    finally:
        await sb.close()
    banner = Banner(bridge_host)
    offline = f"```bash\n{banner.probe()}\n```"
    engine = ScriptedEngine(tok, [SOLVE, offline, '<tool_call>{"name": "submit"}</tool_call>'])
    gw = ModelGateway([engine], tok, CallStore(tmp_path / "gateway.sqlite"))
    with banner:
        async with GatewayServer(gw) as gsrv:
            runner = HarnessRunner(gw, gsrv.root, lambda: AsyncEnvClient(srv.url), max_turns=5)
            ep = await runner.run_episode("builtin/hello-file", 0)
        assert banner.accepted == 0
        await assert_public_sandbox_reaches(backend, banner, spec)
    assert ep.error is None, ep.error
    assert ep.termination == "submitted" and ep.reward == 1.0
    steps = ep.trajectories[0].steps
    assert [s.prompt_ids for s in steps] == engine.prompts and len(steps) == 3
    assert "Hello, world!" in tok.decode(steps[1].prompt_ids[len(steps[0].prompt_ids) :])
    third_obs = tok.decode(steps[2].prompt_ids[len(steps[1].prompt_ids) :])
    probe_result = third_obs.split("[bash result]")[-1]  # no network in there
    assert "[exit code 0]" not in probe_result and banner.token not in probe_result
