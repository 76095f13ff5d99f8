"""A few of the canary suite's techniques (lab/bench/canaries.py) in CI, through a real server, in
every verify mode: on local a link to the expected answer the tests bring (`verifier_links`), a
rewritten test input of a task that declares its outputs (`task_inputs`) and a `/conftest.py`
that marks every test passed; on docker a replaced `diff`, a program the test script runs (the
case the issue was filed for). Each is paid in `shared` and reported there, and paid in neither
`pristine` nor `refuse-tampered`; the honest solution is paid in every mode. Then the families only the
trace of the verifier's run names (`TRACED`): paid in `shared` and reported there as
`verifier_opened` by the inotify trace, refused after the run in `refuse-tampered`, unpaid in
`pristine` (reported there by the fallback's paths). The whole suite is a bench (`sandgym bench
canaries`), not run here."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.bench.canaries import HONEST, MODES, play, techniques, write_fixture_tasks
from lab.bench.canary_tls import STORES
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from tests.e2e.conftest import docker_image_available, local_available

BY_BACKEND = {
    "local": ("symlink-to-expected", "edit-test-inputs", "root-conftest"),
    "docker": ("replace-coreutil",),
}
#: the families only a trace of the verifier names (sandgym/tasks/tamper_trace.py): a program in
#: a PATH directory of the image's own, a tool store, git hooks and config, name resolution,
#: certificate stores (local's /etc is the host's, read-only: no /etc/hosts or system CA store
#: canary there; its store is certifi's bundle in the image's own package directory)
TRACED = {
    "local": (
        "image-path-venv-python",
        "uv-managed-python",
        "git-hook",
        "git-config-hookspath",
        "certifi-ca-store",
    ),
    "docker": (
        "image-path-venv-python",
        "uv-managed-python",
        "git-hook",
        "hosts-fake-service",
        "system-ca-store",
    ),
}
#: in `pristine` nothing the agent changed reaches the verifier, and the report is the fallback's
#: list of places: a store outside it (certifi's bundle under /opt/pylib) is not named there
PRISTINE_UNREPORTED = {"certifi-ca-store"}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture_tasks(tmp_path_factory.mktemp("canaries"))


def _server(backend: str, root: Path) -> Iterator[BackgroundServer]:
    srv = BackgroundServer(
        ServerSettings(host="127.0.0.1", port=0, backend=backend, task_dirs=[root])
    )
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("local", marks=pytest.mark.skipif(not local_available(), reason="no bwrap")),
        pytest.param(
            "docker",
            marks=[
                pytest.mark.docker,
                pytest.mark.skipif(not docker_image_available(), reason="no sandgym/terminal"),
            ],
        ),
    ],
)
def server(request: pytest.FixtureRequest, fixtures: Path) -> Iterator[BackgroundServer]:
    yield from _server(request.param, fixtures)


async def test_canaries_per_mode(server: BackgroundServer) -> None:
    backend = server.settings.backend
    chosen = [t for t in techniques() if t.id in BY_BACKEND[backend]]
    assert len(chosen) == len(BY_BACKEND[backend])
    for tech in chosen:
        seen = {}
        for mode in MODES:
            out = await play(server.url, tech.task, tech.command, mode)
            assert out["error"] is None, (tech.id, mode, out)
            assert out["agent_exit_code"] == 0, (tech.id, out.get("agent_output"))
            seen[mode] = (out["reward"], bool(out["tamper"]["tampered"]))
        assert seen == {
            "shared": (1.0, True),
            "pristine": (0.0, True),
            "refuse-tampered": (0.0, True),
        }, tech.id
        honest = await play(server.url, tech.task, HONEST[tech.task], "refuse-tampered")
        assert honest["reward"] == 1.0 and not honest["tamper"]["tampered"], honest
        honest = await play(server.url, tech.task, HONEST[tech.task], "pristine")
        assert honest["reward"] == 1.0, honest


async def test_traced_families_per_mode(server: BackgroundServer) -> None:
    backend = server.settings.backend
    chosen = [t for t in techniques() if t.id in TRACED[backend]]
    assert len(chosen) == len(TRACED[backend])
    for tech in chosen:  # the three modes and the honest control at once (they are apart)
        seen = {}
        outs = await asyncio.gather(
            *(play(server.url, tech.task, tech.command, mode) for mode in MODES),
            play(server.url, tech.task, HONEST[tech.task], "refuse-tampered"),
        )
        honest = outs[-1]
        for mode, out in zip(MODES, outs[:-1], strict=True):
            assert out["error"] is None, (tech.id, mode, out)
            assert out["agent_exit_code"] == 0, (tech.id, out.get("agent_output"))
            tamper = out["tamper"]
            cats = {p["category"] for p in tamper["paths"]}
            seen[mode] = (out["reward"], bool(tamper["tampered"]), tamper["trace"]["method"])
            if mode != "pristine":  # the verifier ran in the agent's sandbox: traced
                assert "verifier_opened" in cats, (tech.id, mode, tamper)
                if tech.id in STORES:  # the changed store itself, as the verifier's TLS read it
                    opened = {
                        p["path"] for p in tamper["paths"] if p["category"] == "verifier_opened"
                    }
                    assert STORES[tech.id] in opened, (tech.id, mode, tamper)
        assert seen == {
            "shared": (1.0, True, "inotify"),
            "pristine": (0.0, tech.id not in PRISTINE_UNREPORTED, "paths"),
            "refuse-tampered": (0.0, True, "inotify"),
        }, tech.id
        assert honest["reward"] == 1.0 and not honest["tamper"]["tampered"], honest
        assert honest["tamper"]["trace"]["method"] == "inotify", honest
