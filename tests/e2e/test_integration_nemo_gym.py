"""NeMo-Gym's door (sandgym/integrations/nemo_gym.py), with the released nemo-gym 0.7.0.

nemo-gym 0.5 to 0.7 declare Requires-Python >= 3.13.14; this project runs on 3.11, and the
newest CPython packaged here is 3.13.5. Two tests:

- On the host: the released wheel's own provider interface (`nemo_gym/sandbox/providers/
  base.py`) and registry (`registry.py`), loaded unmodified (only the three package `__init__`
  files, which import the rest of NeMo-Gym, are left empty); the provider is found through
  sandgym's installed entry point and drives a real sandbox of a local-backend server.
- In a container (images/nemo-gym-runner: the whole package installed from the package index,
  nothing ignored, on the python:3.13.15-slim-trixie stand-in, CPython 3.13.15 built from
  source (lab/images.py); the test checks that the interpreter
  meets the installed package's own Requires-Python): NeMo-Gym's public sandbox API
  (`list_providers`, `get_provider_class`, `AsyncSandbox`, `Sandbox`) finds the provider through
  the entry point of the sandgym wheel built from this checkout and drives sandboxes of the
  same kind of server (tests/e2e/nemo_gym_released/drive_released.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from lab.bench.harbor_runner import ensure_runner_image
from sandgym.server.runner import BackgroundServer
from tests.e2e.conftest import REAL_BACKENDS

VERSION = "0.7.0"
WHEEL = Path("~/.cache/sandgym/wheels").expanduser() / f"nemo_gym-{VERSION}-py3-none-any.whl"
RELEASED = ("nemo_gym/sandbox/providers/base.py", "nemo_gym/sandbox/providers/registry.py")
REPO = Path(__file__).resolve().parents[2]
RUNNER_IMAGE = f"sandgym/nemo-gym-runner:{VERSION}-python3.13.15-slim-trixie"
RUNNER_CONTEXT = REPO / "images" / "nemo-gym-runner"
DRIVER_DIR = Path(__file__).resolve().parent / "nemo_gym_released"


@pytest.fixture
def nemo_gym(tmp_path: Path) -> Iterator[Any]:
    if not WHEEL.exists():
        WHEEL.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.13.14", f"nemo-gym=={VERSION}", "-d", str(WHEEL.parent)],
            check=True, timeout=600,
        )  # fmt: skip
    root = tmp_path / "released"
    with zipfile.ZipFile(WHEEL) as whl:
        for name in RELEASED:
            whl.extract(name, root)
    for pkg in ("nemo_gym", "nemo_gym/sandbox", "nemo_gym/sandbox/providers"):
        (root / pkg / "__init__.py").touch()
    sys.path.insert(0, str(root))
    try:
        from nemo_gym.sandbox.providers import base, registry

        yield type("NemoGym", (), {"base": base, "registry": registry})
    finally:
        sys.path.remove(str(root))
        for mod in [m for m in sys.modules if m == "nemo_gym" or m.startswith("nemo_gym.")]:
            del sys.modules[mod]


@pytest.mark.parametrize("backend", REAL_BACKENDS[:1])
def test_nemo_gym_finds_and_drives_the_sandgym_provider(
    backend: str, make_server: Callable[..., BackgroundServer], nemo_gym: Any, tmp_path: Path
) -> None:
    from sandgym.integrations.nemo_gym import SandgymProvider

    base, registry = nemo_gym.base, nemo_gym.registry
    srv = make_server(backend)
    assert "sandgym" in registry.list_providers()
    assert registry.get_provider_class("sandgym") is SandgymProvider  # via the entry point

    async def drive() -> None:
        provider = registry.create_provider({"sandgym": {"server_url": srv.http_url}})
        spec = base.SandboxSpec(image="sandgym/terminal", env={"GREETING": "hi"})
        handle = await provider.create(spec)
        assert isinstance(handle, base.SandboxHandle) and handle.provider_name == "sandgym"
        assert await provider.status(handle) is base.SandboxStatus.RUNNING

        res = await provider.exec(handle, "echo $GREETING; echo oops >&2; exit 3")
        assert isinstance(res, base.SandboxExecResult)
        assert (res.stdout, res.stderr, res.return_code) == ("hi\n", "oops\n", 3)
        res = await provider.exec(handle, "pwd; echo $X", cwd="/tmp", env={"X": "y"})
        assert res.stdout == "/tmp\ny\n" and res.return_code == 0

        src = tmp_path / "in.txt"
        src.write_text("payload\n")
        await provider.upload_file(handle, src, "/tmp/nemo/in.txt")
        res = await provider.exec(handle, "cat /tmp/nemo/in.txt | tr a-z A-Z > /tmp/nemo/out.txt")
        assert res.return_code == 0
        await provider.download_file(handle, "/tmp/nemo/out.txt", tmp_path / "out.txt")
        assert (tmp_path / "out.txt").read_text() == "PAYLOAD\n"

        res = await provider.exec(handle, "sleep 30", timeout_s=1)
        assert (res.return_code, res.error_type) == (125, "timeout")

        with pytest.raises(base.SandboxCreateError, match="ttl_s"):
            await provider.create(base.SandboxSpec(image="sandgym/terminal", ttl_s=60))

        await provider.close(handle)
        assert await provider.status(handle) is base.SandboxStatus.STOPPED
        await provider.aclose()

    asyncio.run(drive())


@pytest.mark.parametrize("backend", REAL_BACKENDS[:1])
def test_released_nemo_gym_sandbox_api_drives_the_sandgym_provider(
    backend: str, make_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    srv = make_server(backend)
    ensure_runner_image(RUNNER_IMAGE, 1800.0, RUNNER_CONTEXT)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(REPO), "-w", str(wheels)],
        check=True, timeout=600,
    )  # fmt: skip
    script = (
        "pip install -q --no-deps --root-user-action=ignore /w/*.whl"
        f" && python /d/drive_released.py {srv.http_url}"
    )
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "host", "-v", f"{wheels}:/w:ro",
         "-v", f"{DRIVER_DIR}:/d:ro", RUNNER_IMAGE, "sh", "-c", script],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])

    # the released package on an interpreter that meets its own Requires-Python declaration
    assert seen["nemo_gym_version"] == VERSION
    assert seen["requires_python"], seen
    assert Version(seen["python"]) in SpecifierSet(seen["requires_python"]), seen
    # found by NeMo-Gym's own registry, through the wheel's entry point
    assert "sandgym" in seen["providers"]
    assert seen["provider_class"] == "sandgym.integrations.nemo_gym.SandgymProvider"
    # AsyncSandbox: start (spec env, workdir, spec.files uploaded), exec, upload, download, stop
    assert seen["status_started"] == "running"
    assert seen["env_and_streams"] == {
        "stdout": "hi\n",
        "stderr": "oops\n",
        "return_code": 3,
        "error_type": None,
    }
    assert seen["workdir"]["stdout"] == "/tmp\n"  # the spec's workdir is exec's default cwd
    assert seen["cwd_env"]["stdout"] == "/\ny\n"
    assert seen["spec_file"]["stdout"] == "payload\n"
    assert seen["downloaded"] == "UPLOADED\n"
    assert (seen["timeout"]["return_code"], seen["timeout"]["error_type"]) == (125, "timeout")
    assert seen["status_after_stop"] == "stopped"
    assert seen["ttl_refused"] and "ttl_s" in seen["ttl_refused"]  # refused, not ignored
    # the synchronous Sandbox wrapper
    assert seen["sync_exec"]["stdout"] == "sync\nroot\n"
    # every sandbox NeMo-Gym started was closed through the provider
    listed = httpx.get(f"{srv.http_url}/v1/sandboxes", timeout=30).json()
    assert listed["sandboxes"] == [], listed
