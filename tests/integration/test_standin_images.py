"""The offline stand-ins behave like the public images they stand in for (real Docker engine).

Each image is reached by its public name when that name is tagged here as our alias (the case
with no registry, as in CI), else by our own tag. Missing stand-ins are built first with
`python -m lab.images_cli build` (idempotent; a few minutes on a fresh engine). Network
from the containers: PyPI and the Debian mirror only.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab import images as im

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
BY_IMAGE = {s.image: s for s in im.STANDINS}
PYTHON_STANDINS = [s for s in im.STANDINS if s.python]
PLAIN_STANDINS = [
    s
    for s in im.STANDINS
    if not s.python
    and s.image
    in {
        "sandgym/standin:debian-bookworm",
        "sandgym/standin:debian-trixie",
        "sandgym/standin:debian-bullseye",
        "sandgym/standin:ubuntu-24.04",
        "sandgym/standin:ubuntu-22.04",
    }
]
TBENCH = [s for s in im.STANDINS if "t-bench" in s.aliases[0]]


def _client():  # type: ignore[no-untyped-def]
    try:
        import docker

        c = docker.from_env(timeout=600)
        c.ping()
        return c
    except Exception:
        return None


CLIENT = _client()
if CLIENT is None:
    pytest.skip("no Docker engine answers", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def standins_built() -> None:
    engine = im.ImageEngine(CLIENT)
    if all(engine.info(s.image) is not None for s in im.STANDINS):
        return
    subprocess.run(
        [sys.executable, "-m", "lab.images_cli", "build", "--no-progress"],
        check=True,
        timeout=1800,
        cwd=REPO,
    )


def image_for(s: im.StandIn) -> str:
    """The first public name of `s` when it is our alias here, else our own tag."""
    engine = im.ImageEngine(CLIENT)
    holder = engine.info(s.aliases[0])
    ours = engine.info(s.image)
    assert ours is not None, f"{s.image} was not built"
    if holder is not None and holder.id == ours.id:
        return s.aliases[0]
    return s.image


def sh(image: str, script: str, network: bool = False) -> str:
    """Run `script` with sh in a fresh container of `image`; stdout+stderr, or the failure."""
    import docker.errors

    assert CLIENT is not None
    try:
        out = CLIENT.containers.run(
            image,
            ["sh", "-c", script],
            remove=True,
            network_disabled=not network,
            stdout=True,
            stderr=True,
        )
    except docker.errors.ContainerError as exc:
        pytest.fail(f"{image}: {script!r} failed ({exc.exit_status}): {exc.stderr!r}")
    return out.decode()


@pytest.mark.parametrize("standin", PYTHON_STANDINS, ids=lambda s: s.image.split(":")[1])
def test_python_standin_is_the_version_its_tag_promises(standin: im.StandIn) -> None:
    image = image_for(standin)
    assert standin.python is not None
    minor = ".".join(standin.python.split(".")[:2])  # pip names the line: (python 3.13)
    out = sh(
        image,
        "python --version; python3 --version; pip --version; pip3 --version;"
        # headers for C extensions, as the official images have them
        " python -c 'import sysconfig, os; print(os.path.exists(os.path.join("
        'sysconfig.get_paths()["include"], "Python.h")))\';'
        # TermiGen-style Dockerfiles link python themselves: that must not collide
        " ln -s /usr/bin/python3 /usr/bin/python && echo linked;"
        # apt's defaults are Debian's (recommends on)
        " apt-config dump | grep -i 'APT::Install-Recommends'",
    )
    lines = out.splitlines()
    assert im.python_says(lines[0], standin.python), out
    assert im.python_says(lines[1], standin.python), out
    assert f"(python {minor})" in lines[2] and f"(python {minor})" in lines[3], out
    assert lines[4] == "True" and lines[5] == "linked", out
    assert lines[6] == 'APT::Install-Recommends "1";', out
    # pip installs from PyPI as root without --break-system-packages (no PEP 668 marker)
    out = sh(
        image,
        "pip install -q --no-deps --disable-pip-version-check six==1.16.0"
        " && python -c 'import six; print(six.__version__)'",
        network=True,
    )
    assert out.strip().splitlines()[-1] == "1.16.0", out
    # pip can replace itself, as on the official images (a Debian-installed pip has no RECORD:
    # `pip install --upgrade pip` then fails with uninstall-no-record-file)
    out = sh(image, "pip uninstall -y pip && echo removed")
    assert out.strip().splitlines()[-1] == "removed", out
    # ... and so can what a Dockerfile pins next to it (Terminal-Bench 2.0's pypi-server)
    out = sh(
        image,
        "pip install -q --upgrade --no-deps setuptools==75.6.0 wheel==0.45.1 && echo upgraded",
        network=True,
    )
    assert out.strip().splitlines()[-1] == "upgraded", out
    # slim: no compiler left behind (the official images have none)
    assert sh(image, "command -v gcc cc make || echo none").strip() == "none"
    if standin in TBENCH:
        assert "tmux" in sh(image, "tmux -V") and sh(image, "asciinema --version").startswith(
            "asciinema"
        )


_DEBIAN_TAGS = {
    "bookworm": "bookworm",
    "12": "bookworm",
    "trixie": "trixie",
    "13": "trixie",
    "bullseye": "bullseye",
    "11": "bullseye",
}


def _named_release(alias: str) -> str | None:
    """The Debian release a public tag names (`debian:12-slim`, `python:3.13-slim-bookworm`)."""
    name, _, tag = alias.partition(":")
    if name == "debian":
        return _DEBIAN_TAGS.get(tag.split("-")[0])
    return next((c for c in ("bookworm", "trixie") if tag.endswith("-" + c)), None)


CODENAMED = [(s, a, r) for s in im.STANDINS for a in s.aliases if (r := _named_release(a))]


@pytest.mark.parametrize(
    ("standin", "alias", "codename"), CODENAMED, ids=[f"{a}" for _, a, _ in CODENAMED]
)
def test_a_tag_that_names_a_debian_release_is_that_release(
    standin: im.StandIn, alias: str, codename: str
) -> None:
    """`python:3.13-slim-bookworm` is bookworm (gcc 12, OpenSSL 3.0, its package names), not the
    Debian release that happens to package the Python version."""
    out = sh(image_for(standin), ". /etc/os-release && echo $VERSION_CODENAME")
    assert out.strip() == codename, f"{alias} ({standin.image}) is {out.strip()}"


def test_tbench_ubuntu_standin_has_tmux_and_asciinema() -> None:
    s = im.standin_for("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624")
    assert s is not None
    out = sh(image_for(s), "tmux -V && asciinema --version && command -v gcc || true")
    assert out.startswith("tmux ") and "asciinema " in out and "gcc" not in out, out


def test_task_dockerfile_on_python_standin_builds() -> None:
    """A task Dockerfile FROM python:3.13-slim-bookworm that links python itself builds."""
    s = im.standin_for("python:3.13-slim-bookworm")
    assert s is not None
    dockerfile = (
        f"FROM {image_for(s)}\n"
        "RUN ln -s /usr/bin/python3 /usr/bin/python && python --version\n"
        "WORKDIR /app\n"
    )
    assert CLIENT is not None
    image, _ = CLIENT.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True)
    try:
        assert sh(image.id, "python --version").startswith("Python 3.13.")
    finally:
        CLIENT.images.remove(image.id, force=True)


@pytest.mark.parametrize("standin", PLAIN_STANDINS, ids=lambda s: s.image.split(":")[1])
def test_plain_standin_carries_none_of_our_extras(standin: im.StandIn) -> None:
    out = sh(
        image_for(standin),
        "for c in tmux python3 pip git jq curl vim; do command -v $c || true; done;"
        " apt-config dump | grep -i 'APT::Install-Recommends'",
    )
    assert out.strip() == 'APT::Install-Recommends "1";', out


def test_bullseye_standin_installs_from_the_mirror() -> None:
    """Debian 11 as Terminal-Bench 2.0's qemu tasks use it: its apt sources answer (the mirror
    still serves bullseye and bullseye-updates) and a package installs (~10 s)."""
    s = im.standin_for("debian:bullseye-slim")
    assert s is not None
    out = sh(
        image_for(s),
        "cat /etc/debian_version; export DEBIAN_FRONTEND=noninteractive;"
        " apt-get update -qq >/dev/null && apt-get install -y -qq wget >/dev/null 2>&1"
        " && wget --version | head -n 1",
        network=True,
    )
    lines = out.strip().splitlines()
    assert lines[0].startswith("11.") and lines[-1].startswith("GNU Wget 1.21"), out


DEBIAN_BASES = [
    ("debian:bookworm-slim", "bookworm"),
    ("debian:trixie-slim", "trixie"),
    ("debian:bullseye-slim", "bullseye"),
]


@pytest.mark.parametrize(("alias", "codename"), DEBIAN_BASES, ids=[c for _, c in DEBIAN_BASES])
def test_debian_standin_takes_security_updates_as_the_official_image(
    alias: str, codename: str
) -> None:
    """apt on a Debian stand-in reads the release's -security suite beside the release and its
    -updates, as the official image's sources do: a package's security update (there until the
    next point release) is what `apt-get install` takes, as it would there."""
    s = im.standin_for(alias)
    assert s is not None
    out = sh(
        image_for(s),
        "apt-get update -qq >/dev/null 2>&1; apt-cache policy | grep -o ' [a-z]*[-a-z]*/main'"
        " | sort -u",
        network=True,
    )
    suites = {line.strip().removesuffix("/main") for line in out.splitlines()}
    assert suites == {codename, f"{codename}-updates", f"{codename}-security"}, out


def test_gcc_from_apt_compiles_stdio_on_ubuntu_standin() -> None:
    """`apt-get install -y gcc` brings libc6-dev (recommends on, as on the real image), so a C
    file that includes stdio.h compiles and runs (the one slow test: ~30-60 s)."""
    s = im.standin_for("ubuntu:24.04")
    assert s is not None
    out = sh(
        image_for(s),
        "export DEBIAN_FRONTEND=noninteractive;"
        " apt-get update -qq >/dev/null && apt-get install -y -qq gcc >/dev/null 2>&1"
        " && printf '#include <stdio.h>\\nint main(void){puts(\"hi from c\");return 0;}\\n' > /t.c"
        " && gcc -o /t /t.c && /t",
        network=True,
    )
    assert out.strip().splitlines()[-1] == "hi from c", out


def test_images_list_reads_labels_back_from_the_engine() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lab.images_cli", "list", "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=120,
    )
    doc = json.loads(proc.stdout)  # exactly one JSON document on stdout
    engine = im.ImageEngine(CLIENT)
    assert [e["image"] for e in doc["stand_ins"]] == [s.image for s in im.STANDINS]
    for entry in doc["stand_ins"]:
        s = BY_IMAGE[entry["image"]]
        assert entry["present"] and entry["stands_in_for"] == list(s.aliases)
        info = engine.info(s.image)
        assert info is not None
        assert info.labels[im.LABEL_STANDIN_FOR] == ",".join(s.aliases)
        assert info.labels[im.LABEL_STANDIN_FROM] == s.really
        assert [a["name"] for a in entry["aliases"]] == list(s.aliases), entry
        for a in entry["aliases"]:
            # no registry here: every public name is our alias, unless a real image holds it
            assert a["status"] in (im.ALIAS, im.REAL), a
    # no stand-in can be made for 3.12: no alias of ours may sit on those names
    [py312] = doc["unavailable"]
    assert [a["name"] for a in py312["status"]] == list(im.UNAVAILABLE[0].aliases), py312
    assert all(a["status"] in (im.ABSENT, im.REAL) for a in py312["status"]), py312


def test_postgres_standin_starts_as_the_official_image_does() -> None:
    """postgres:15 as a compose service uses it (Terminal-Bench 1's simple-sheets-put): the
    user, password and database from the environment, reachable over TCP with that password
    (scram-sha-256), refused with another; `pg_isready` on PATH for the healthcheck."""
    assert CLIENT is not None
    image = image_for(BY_IMAGE["sandgym/standin:postgres-15"])
    env = {"POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": "postgres", "POSTGRES_DB": "sheetsdb"}
    c = CLIENT.containers.run(image, detach=True, environment=env, network_disabled=True)
    try:
        # polls until the server (started after its first-start set-up) answers over TCP
        ready = c.exec_run(
            [
                "sh",
                "-c",
                "for i in $(seq 120); do pg_isready -q -h 127.0.0.1 && exit 0;"
                " sleep 1; done; exit 1",
            ]
        )
        assert ready.exit_code == 0, c.logs().decode()[-2000:]
        query = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "sheetsdb", "-tAc"]
        ok = c.exec_run(
            [*query, "select current_database()"], environment={"PGPASSWORD": "postgres"}
        )
        assert (ok.exit_code, ok.output.decode().strip()) == (0, "sheetsdb")
        bad = c.exec_run([*query, "select 1"], environment={"PGPASSWORD": "wrong"})
        assert bad.exit_code != 0 and b"password authentication failed" in bad.output
        assert c.exec_run(["pg_isready", "-U", "postgres"]).exit_code == 0  # the healthcheck
    finally:
        c.remove(force=True)


def test_dnsmasq_standin_answers_as_the_compose_file_configures_it() -> None:
    """jpillora/dnsmasq as a compose service uses it (Terminal-Bench 1's home-server-https: its
    command adds `--address=/homeserver.local/172.20.0.30`): a container told to use it as its
    DNS server resolves that name to that address through its own resolver."""
    assert CLIENT is not None
    image = image_for(BY_IMAGE["sandgym/standin:dnsmasq"])
    net = CLIENT.networks.create("sg-test-dnsmasq-" + os.urandom(4).hex(), internal=True)
    server = client = None
    try:
        server = CLIENT.containers.run(
            image,
            command=["--no-daemon", "--log-queries", "--address=/homeserver.local/172.20.0.30"],
            detach=True,
            network=net.name,
        )
        server.reload()
        addr = server.attrs["NetworkSettings"]["Networks"][net.name]["IPAddress"]
        assert addr, server.logs().decode()
        probe = (
            "for i in $(seq 30); do getent hosts homeserver.local && exit 0; sleep 1; done; exit 1"
        )
        client = CLIENT.containers.run(
            im.TERMINAL_IMAGE, ["sh", "-c", probe], detach=True, network=net.name, dns=[addr]
        )
        result = client.wait(timeout=60)
        out = client.logs().decode()
        assert result["StatusCode"] == 0, (out, server.logs().decode()[-2000:])
        assert out.split() == ["172.20.0.30", "homeserver.local"], out
        assert "query[A] homeserver.local" in server.logs().decode()  # --log-queries, as asked
    finally:
        for c in (client, server):
            if c is not None:
                c.remove(force=True)
        net.remove()
