"""Runs inside the nemo-gym runner container (images/nemo-gym-runner): NeMo-Gym 0.7.0's own
public sandbox API (`nemo_gym.sandbox`: the provider registry, `AsyncSandbox`, `Sandbox`) drives
sandgym's provider, found through the installed sandgym wheel's entry point, against the sandgym
server named on the command line. Prints one JSON document of what it saw; the test on the host
(tests/e2e/test_integration_nemo_gym.py) checks it. Nothing here asserts: a failure of NeMo-Gym's
calls propagates (exit 1 with its traceback)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from nemo_gym.sandbox import (
    AsyncSandbox,
    Sandbox,
    SandboxCreateError,
    SandboxSpec,
    get_provider_class,
    list_providers,
)


def _result(res: Any) -> dict[str, Any]:
    return {
        "stdout": res.stdout,
        "stderr": res.stderr,
        "return_code": res.return_code,
        "error_type": getattr(res, "error_type", None),
    }


async def drive_async(config: dict[str, Any], tmp: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    # spec.files are uploaded by AsyncSandbox.start through the provider's upload_file
    spec = SandboxSpec(
        image="sandgym/terminal",
        env={"GREETING": "hi"},
        workdir="/tmp",
        files={"/tmp/nemo/in.txt": "payload\n"},
    )
    async with AsyncSandbox(config, spec) as sb:
        await sb.start()
        seen["status_started"] = (await sb.status()).value
        seen["env_and_streams"] = _result(await sb.exec("echo $GREETING; echo oops >&2; exit 3"))
        seen["workdir"] = _result(await sb.exec("pwd"))
        seen["cwd_env"] = _result(await sb.exec("pwd; echo $X", cwd="/", env={"X": "y"}))
        seen["spec_file"] = _result(await sb.exec("cat /tmp/nemo/in.txt"))
        src = tmp / "up.txt"
        src.write_text("uploaded\n")
        await sb.upload(src, "/tmp/nemo/up.txt")
        await sb.exec("tr a-z A-Z < /tmp/nemo/up.txt > /tmp/nemo/out.txt")
        await sb.download("/tmp/nemo/out.txt", tmp / "out.txt")
        seen["downloaded"] = (tmp / "out.txt").read_text()
        seen["timeout"] = _result(await sb.exec("sleep 30", timeout_s=1))
    seen["status_after_stop"] = (await sb.status()).value
    try:
        async with AsyncSandbox(config, SandboxSpec(image="sandgym/terminal", ttl_s=60)) as bad:
            await bad.start()
        seen["ttl_refused"] = None
    except SandboxCreateError as exc:
        seen["ttl_refused"] = str(exc)
    return seen


def drive_sync(config: dict[str, Any]) -> dict[str, Any]:
    with Sandbox(config, SandboxSpec(image="sandgym/terminal")) as sb:
        sb.start()
        return {"sync_exec": _result(sb.exec("echo sync; id -un"))}


def main() -> None:
    url = sys.argv[1]
    cls = get_provider_class("sandgym")
    doc: dict[str, Any] = {
        "providers": list_providers(),
        "provider_class": f"{cls.__module__}.{cls.__qualname__}",
        # the interpreter it runs on, and what the installed package declares it needs
        "python": platform.python_version(),
        "requires_python": importlib.metadata.metadata("nemo-gym")["Requires-Python"],
        "nemo_gym_version": importlib.metadata.version("nemo-gym"),
    }
    config = {"sandgym": {"server_url": url}}
    with tempfile.TemporaryDirectory() as tmp:
        doc.update(asyncio.run(drive_async(config, Path(tmp))))
    doc.update(drive_sync(config))
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
