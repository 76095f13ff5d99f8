"""NeMo-Gym's door (integrations/nemo_gym.py), tested up to the boundary this machine allows.

nemo-gym 0.5 to 0.7 require Python >= 3.13.14 and this project runs on 3.11, so the package
cannot be installed here. What is real: the released nemo-gym 0.7.0 wheel (downloaded once from
the package index into ~/.cache/sandgym/wheels) provides its own provider interface
(`nemo_gym/sandbox/providers/base.py`: SandboxSpec, SandboxHandle, SandboxExecResult,
SandboxStatus, SandboxCreateError) and its own registry (`registry.py`: entry-point discovery in
`nemo_gym.sandbox_providers`, `create_provider`), loaded unmodified; only the three package
`__init__` files, which import the rest of NeMo-Gym, are left empty. The provider is found
through sandgym's installed entry point and drives a real sandbox of a local-backend server.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envserver.runner import BackgroundServer
from tests.e2e.conftest import REAL_BACKENDS

VERSION = "0.7.0"
WHEEL = Path("~/.cache/sandgym/wheels").expanduser() / f"nemo_gym-{VERSION}-py3-none-any.whl"
RELEASED = ("nemo_gym/sandbox/providers/base.py", "nemo_gym/sandbox/providers/registry.py")


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
    from integrations.nemo_gym import SandgymProvider

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
