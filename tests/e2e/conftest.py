"""Fixtures for end-to-end tests: a real uvicorn env server on a free port, in a thread.

`make_server(backend=..., **settings)` starts one (stopped at teardown) and returns the
`BackgroundServer`: `.url` (websocket), `.http_url`, `.service` (the live `EnvService`, for
inspecting sessions) and, on the null backend, `.backend` (to kill sandboxes).

A tiny Harbor task `echo-task` (a tmp dir, always served) runs on the null backend, whose fake
shell has no `rm`/`bash`, so its verifier cannot run there: full episodes with rewards run on
`local` (and `docker`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes import get_backend
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings

NULL_TASK = "echo-task"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built once per session from a copy (no build/ in the tree);
    tests/e2e/test_resolution.py and test_door_envs.py install it."""
    src = tmp_path_factory.mktemp("src")
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(REPO / "sandgym", src / "sandgym", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(src), "-w", str(out)],
        check=True, timeout=300,
    )  # fmt: skip
    wheels = sorted(out.glob("sandgym-*.whl"))
    assert len(wheels) == 1, f"expected one sandgym wheel in {out}, found {wheels}"
    return wheels[0]


@pytest.fixture(scope="session")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    t = root / NULL_TASK
    (t / "environment").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "solution").mkdir()
    (t / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30\n')
    (t / "instruction.md").write_text("Write hello to /app/hello.txt\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "tests" / "test.sh").write_text(
        textwrap.dedent(
            """\
            #!/bin/bash
            mkdir -p /logs/verifier
            if [ "$(cat /app/hello.txt 2>/dev/null)" = hello ]; then r=1; else r=0; fi
            echo $r > /logs/verifier/reward.txt
            """
        )
    )
    (t / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    return root


@pytest.fixture
def make_server(task_dir: Path) -> Iterator[Callable[..., BackgroundServer]]:
    started: list[BackgroundServer] = []

    def _make(backend: str = "null", **overrides: Any) -> BackgroundServer:
        settings = ServerSettings(
            host="127.0.0.1",
            port=0,
            backend=backend,
            task_dirs=[task_dir],
            include_builtin=overrides.pop("include_builtin", backend != "null"),
            **overrides,
        )
        # The null backend is handed in so tests can reach its sandboxes (kill one, count them).
        be = get_backend("null") if backend == "null" else None
        srv = BackgroundServer(settings, be)
        srv.backend = be  # type: ignore[attr-defined]
        srv.start()
        started.append(srv)
        return srv

    yield _make
    for srv in started:
        srv.stop()


@pytest.fixture
def null_server(make_server: Callable[..., BackgroundServer]) -> BackgroundServer:
    return make_server("null", sweep_interval_s=0.05)


def local_available() -> bool:
    return shutil.which("bwrap") is not None


def docker_image_available(image: str = "sandgym/terminal") -> bool:
    try:
        import docker

        docker.from_env().images.get(image)
        return True
    except Exception:
        return False


#: the two real backends, as pytest params (a missing one skips; under CI=true it fails)
REAL_BACKENDS = [
    pytest.param(
        "local",
        marks=pytest.mark.skipif(not local_available(), reason="bubblewrap not installed"),
    ),
    pytest.param(
        "docker",
        marks=[
            pytest.mark.docker,
            pytest.mark.skipif(not docker_image_available(), reason="sandgym/terminal not built"),
        ],
    ),
]
