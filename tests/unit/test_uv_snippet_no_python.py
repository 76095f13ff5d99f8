"""The uv-installer substitution in an image with neither python3 nor unzip: it installs Debian's
unzip, and a first refused `apt-get install` (a mirror's passing failure) does not leave the
task's verifier without uv. The snippet runs in a real `sh`, with a PATH holding only the tools
it names; `curl` and `apt-get` are stand-ins that serve a real zip and fail once."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

from lab.bench.substitutions import _uv_snippet

WHEEL_URL = (
    "https://files.pythonhosted.org/packages/aa/bb/uv-0.9.5-py3-none-manylinux_2_17_x86_64.whl"
)
TOOLS = ("sh", "mkdir", "cp", "chmod", "grep", "tail", "mktemp", "rm", "cat", "sleep", "printf")


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _world(tmp_path: Path, apt_failures: int) -> tuple[Path, dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real is not None, tool
        (bin_dir / tool).symlink_to(real)
    wheel = tmp_path / "uv.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("uv-0.9.5.data/scripts/uv", "#!/bin/sh\necho uv\n")
        zf.writestr("uv-0.9.5.data/scripts/uvx", "#!/bin/sh\necho uvx\n")
    # curl: the index page names the wheel; the wheel's URL gives the zip (`-o FILE`)
    _script(
        bin_dir / "curl",
        f'for a; do last="$a"; done\n'
        f'case "$last" in *pypi.org/simple/uv/) echo \'<a href="{WHEEL_URL}#sha256=0">\';;\n'
        f'  *) while [ "$1" != "-o" ]; do shift; done; cat "{wheel}" > "$2";; esac\n',
    )
    # apt-get: refuses `install` its first `apt_failures` times; then puts an unzip on PATH
    count = tmp_path / "apt-count"
    count.write_text("0")
    unzip = shutil.which("unzip")
    assert unzip is not None
    _script(
        bin_dir / "apt-get",
        f'[ "$1" = update ] && exit 0\n'
        f'n=$(cat "{count}"); echo $((n + 1)) > "{count}"\n'
        f'[ "$n" -lt {apt_failures} ] && {{ echo "E: Failed to fetch unzip" >&2; exit 100; }}\n'
        f'/usr/bin/ln -sf "{unzip}" "{bin_dir}/unzip"\n',
    )
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": str(bin_dir), "HOME": str(home), "TMPDIR": str(tmp_path)}
    return home, env


def _run(tmp_path: Path, apt_failures: int) -> tuple[Path, subprocess.CompletedProcess[str]]:
    home, env = _world(tmp_path, apt_failures)
    proc = subprocess.run(
        ["/bin/sh", "-c", _uv_snippet("0.9.5", None)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return home, proc


def test_uv_is_installed_after_one_refused_apt_get(tmp_path: Path) -> None:
    home, proc = _run(tmp_path, apt_failures=1)
    uv = home / ".local" / "bin" / "uv"
    assert uv.is_file(), proc.stderr
    assert os.access(uv, os.X_OK)
    assert (home / ".local" / "bin" / "env").is_file()
    assert "apt-get install unzip failed (try 1 of 3)" in proc.stderr
    assert (tmp_path / "apt-count").read_text().strip() == "2"


def test_a_mirror_that_keeps_refusing_leaves_no_uv_and_says_so(tmp_path: Path) -> None:
    home, proc = _run(tmp_path, apt_failures=5)
    assert not (home / ".local" / "bin" / "uv").exists()
    assert "apt-get install unzip failed (try 3 of 3)" in proc.stderr
    assert (tmp_path / "apt-count").read_text().strip() == "3"
