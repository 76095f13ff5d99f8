"""The bench's substitution layer on a real container: a Terminal-Bench 2.0 style verifier
preamble (the uv installer from astral.sh, then `uvx -p 3.13`) rewritten by
`lab.bench.substitutions` installs uv from PyPI and runs Debian's CPython 3.13 on an image that has
no Python 3.13 (needs Docker and the package registries; about 30 s)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lab.bench.substitutions import debian_cpython_debs, rewrite_script

pytestmark = pytest.mark.docker

IMAGE = "sandgym/terminal:latest"  # Debian bookworm: Python 3.11, curl

SCRIPT = """#!/bin/bash
set -e
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
uv --version
uvx -p 3.13 python -c 'import ssl, sqlite3, sys; print("py", sys.version.split()[0])'
"""


def _image_present() -> bool:
    if shutil.which("docker") is None:
        return False
    r = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    return r.returncode == 0


def test_uv_from_pypi_and_debian_cpython_in_a_container(tmp_path: Path) -> None:
    if not _image_present():
        pytest.skip(f"no Docker engine or no {IMAGE} (images/bootstrap-base.sh builds it)")
    debs = debian_cpython_debs("3.13", tmp_path)
    if debs is None:
        pytest.skip("Debian's package index cannot be read from here")
    text, records = rewrite_script(SCRIPT, cpython_debs={"3.13": debs})
    assert [r["name"] for r in records] == ["uv-installer-from-pypi", "uv-python-from-debian"]
    (tmp_path / "t.sh").write_text(text)
    r = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{tmp_path}:/w:ro", IMAGE, "bash", "/w/t.sh"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "uv 0.9.5" in out
    assert "py 3.13." in out
