"""The stand-in table, labels, alias decisions and list output of lab/images.py (no engine)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from lab import images as im
from lab import images_cli

REPO = Path(__file__).resolve().parents[2]
ALL_ALIASES = [a for s in im.STANDINS for a in s.aliases]


# -- the table --------------------------------------------------------------------------------


def test_every_public_name_has_one_stand_in_and_none_is_also_unavailable() -> None:
    assert len(ALL_ALIASES) == len(set(ALL_ALIASES))
    unavailable = {a for u in im.UNAVAILABLE for a in u.aliases}
    assert not unavailable & set(ALL_ALIASES)
    assert ALL_ALIASES, "the stand-in table names no public image"
    for name in ALL_ALIASES:
        assert im.standin_for(name) is not None
    assert im.standin_for("python:3.12-slim-bookworm") is None


def test_python_tags_promise_the_version_the_stand_in_has() -> None:
    checked: list[str] = []
    for s in im.STANDINS:
        for a in s.aliases:
            m = re.match(r"python:(\d+\.\d+(?:\.\d+)?)-", a) or re.search(
                r"t-bench/python-(\d+)-(\d+):", a
            )
            if m is None:
                continue
            version = m.group(1) if len(m.groups()) == 1 else f"{m.group(1)}.{m.group(2)}"
            assert s.python == version, (a, s.image)
            checked.append(a)
    assert checked, "no alias with a Python version in its tag was checked"


def test_3_12_has_no_stand_in_and_says_why() -> None:
    [u] = [u for u in im.UNAVAILABLE if "python:3.12-slim-bookworm" in u.aliases]
    assert "3.12" in u.reason and "--image-map" in u.reason


def test_stand_ins_are_built_after_the_stand_ins_they_start_from() -> None:
    seen: set[str] = set()
    stacked = [s for s in im.STANDINS if s.base.startswith("sandgym/standin:")]
    assert stacked, "no stand-in starts from another one: the order is not tested"
    for s in im.STANDINS:
        if s.base.startswith("sandgym/standin:"):
            assert s.base in seen, s.image
        else:
            assert s.base == im.BASE_BOOKWORM or s.base in im.SUITE_BASES, s.image
        seen.add(s.image)


def test_bullseye_stand_in_is_plain_debian_11_on_its_own_base() -> None:
    """Terminal-Bench 2.0's qemu-startup and qemu-alpine-ssh build FROM debian:bullseye-slim."""
    s = im.standin_for("debian:bullseye-slim")
    assert s is not None and s.image == "sandgym/standin:debian-bullseye"
    assert s.aliases == ("debian:bullseye", "debian:bullseye-slim", "debian:11", "debian:11-slim")
    assert s.base == im.BASE_BULLSEYE and im.SUITE_BASES[s.base] == "bullseye"
    assert s.dockerfile() == f"FROM {im.BASE_BULLSEYE}\n" and "Debian 11 (bullseye)" in s.really
    assert im.BASE_BULLSEYE in im.OWN_IMAGES


@pytest.mark.parametrize("suite", ["bookworm", *im.SUITE_BASES.values()])
def test_bootstrap_script_accepts_every_suite_the_table_builds_on(
    suite: str, tmp_path: Path
) -> None:
    """bootstrap-base.sh gets past its --suite check for each suite (it then stops at `docker
    info`, answered here by a stub that fails), and refuses one it does not know."""
    import os
    import subprocess

    stub = tmp_path / "docker"
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    script = str(REPO / "images" / "bootstrap-base.sh")

    def run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", script, "--suite", name], env=env, capture_output=True, text=True, timeout=30
        )

    ok = run(suite)
    assert ok.returncode == 1 and "no Docker engine answers" in ok.stderr, ok.stderr
    bad = run("buster")
    assert bad.returncode == 2 and "--suite buster (expected" in bad.stderr, bad.stderr


def test_ubuntu_stand_ins_say_they_are_not_ubuntu() -> None:
    ubuntu = [
        s
        for s in im.STANDINS
        if any(a.startswith("ubuntu:") or "ubuntu-24-04" in a for a in s.aliases)
    ]
    assert ubuntu, "no Ubuntu stand-in to check"
    for s in ubuntu:
        assert "NOT Ubuntu" in s.really, s.image


def test_plain_stand_ins_add_nothing_and_tbench_ones_add_tmux_and_asciinema() -> None:
    firsts = [s.aliases[0] for s in im.STANDINS]
    assert any(a.startswith("debian:") for a in firsts), "no plain Debian stand-in to check"
    assert any(a.startswith("ubuntu:") for a in firsts), "no Ubuntu stand-in to check"
    assert any("t-bench" in a for a in firsts), "no Terminal-Bench stand-in to check"
    for s in im.STANDINS:
        if s.aliases[0].startswith("debian:"):
            assert s.run == () and s.dockerfile() == f"FROM {s.base}\n"
        if s.aliases[0].startswith("ubuntu:"):
            # what Ubuntu's own image has beyond a Debian minbase, nothing more
            assert s.run == im.UBUNTU_RUN
            assert "apt-get install -y --no-install-recommends procps e2fsprogs" in s.dockerfile()
        if "t-bench" in s.aliases[0]:
            assert "tmux asciinema" in s.dockerfile()
            assert "--no-install-recommends" not in s.dockerfile()
            # Terminal-Bench 1 Dockerfiles `COPY file /app` and run `./x` expecting /app
            assert s.dockerfile().splitlines()[-1] == "WORKDIR /app"


def test_python_recipe_lays_out_like_the_official_image() -> None:
    s = im.standin_for("python:3.13-slim")
    assert s is not None
    df = s.dockerfile()
    assert "rm -f /usr/lib/python3.13/EXTERNALLY-MANAGED" in df
    links = dict((m[1], m[0]) for m in re.findall(r"ln -sf (\S+) /usr/local/bin/([\w.-]+)", df))
    assert links["python"] == links["python3"] == "/usr/bin/python3.13"
    # pip installs itself (with its RECORD, so it can be upgraded), not Debian's python3-pip
    assert "pip" not in links and not re.search(r"\bpython3-(pip|wheel|setuptools)\b", df)
    assert re.search(r'python3\.13 "\$w/pip" install .*"\$w"', df), df
    assert "python3.13-dev" in df and not re.search(r"\b(gcc|build-essential)\b", df)
    # no /usr/bin/python of its own: TermiGen Dockerfiles make that link themselves
    assert "/usr/bin/python " not in df and "python-is-python3" not in df


def test_bookworm_python_is_built_from_the_release_tarball_on_bookworm() -> None:
    """`-bookworm` must be bookworm (gcc 12, OpenSSL 3.0, its package names), so its CPython
    3.13, which bookworm does not package, is built from source as the official image does."""
    s = im.standin_for("python:3.13-slim-bookworm")
    assert s is not None and s.base == im.BASE_BOOKWORM and s.python == "3.13"
    assert s is not im.standin_for("python:3.13-slim-trixie")
    df = s.dockerfile()
    url, sha = im.PYTHON_SOURCES["3.13.5"]
    assert url.startswith("http://deb.debian.org/") and url.endswith("3.13.5.orig.tar.xz")
    assert f'echo "{sha} *python.tar.xz" | sha256sum -c -' in df  # checked before it is used
    assert "--enable-shared --with-ensurepip" in df and "make install" in df
    # Debian's Python stays out; pip is ensurepip's, in /usr/local, and the plain names link
    assert not re.search(r"\bpython3(\.13)?(-dev|-venv|-pip)?\b(?![-.\w])", df.split("wget")[0])
    assert re.search(r"for src in idle3 pip3 pydoc3 python3 python3-config", df)
    assert "ENV PATH=/usr/local/bin:$PATH LANG=C.UTF-8" in df
    # the build tools go again: gcc is not left in a slim image (apt must not keep what is
    # only suggested, as the official Debian images set it)
    assert "apt-get purge -y --auto-remove" in df
    assert df.index('SuggestsImportant "false"') < df.index("apt-get purge")
    tb = next(x for x in im.STANDINS if x.image == "sandgym/standin:tbench-python-3-13")
    assert tb.base == s.image


def test_a_python_release_tag_is_built_from_that_release() -> None:
    """`python:3.13.15-slim-trixie` promises 3.13.15 exactly: its stand-in builds that release
    from the tarball `PYTHON_SOURCES` pins, on trixie, and `check_python` holds it to it."""
    s = im.standin_for("python:3.13.15-slim-trixie")
    assert s is not None and s.base == im.BASE_TRIXIE and s.python == "3.13.15"
    url, sha = im.PYTHON_SOURCES["3.13.15"]
    assert url.endswith("/python3.13_3.13.15.orig.tar.xz")
    df = s.dockerfile()
    assert f"wget -q -O python.tar.xz {url};" in df
    assert f'echo "{sha} *python.tar.xz" | sha256sum -c -' in df
    assert "python3.13 --version" in df  # the build's own binary name: major.minor
    # trixie's libc6 diverts /lib64/ld-linux-x86-64.so.2: dpkg-query's `diversion by` lines
    # name no package and must not reach apt-mark
    assert "dpkg-query --search | grep -v '^diversion by' | cut -d: -f1" in df
    assert im.python_says("Python 3.13.15", "3.13.15")
    assert not im.python_says("Python 3.13.5", "3.13.15")
    assert not im.python_says("Python 3.13.150", "3.13.15")
    assert im.python_says("Python 3.13.5", "3.13") and not im.python_says("Python 3.130.1", "3.13")


class _Containers:
    def __init__(self, out: str) -> None:
        self.out = out

    def run(self, image: str, cmd: list[str], **kw: Any) -> bytes:
        return self.out.encode()


def test_check_python_refuses_another_release_than_the_tag_names() -> None:
    s = im.standin_for("python:3.13.15-slim-trixie")
    assert s is not None
    client = type("Client", (), {})()
    client.containers = _Containers("Python 3.13.5\nPython 3.13.5\npip 25.1")
    engine = im.ImageEngine(client)
    with pytest.raises(im.BuildError, match="expected Python 3.13.15"):
        engine.check_python(s)
    client.containers = _Containers("Python 3.13.15\nPython 3.13.15\npip 25.2")
    engine.check_python(s)


def test_the_nemo_gym_runner_starts_from_the_stand_in_and_builds_no_python() -> None:
    """The runner's CPython is the stand-in's (one source build in the repository): its FROM
    names a stand-in whose release meets nemo-gym's Requires-Python (>= 3.13.14)."""
    df = (REPO / "images" / "nemo-gym-runner" / "Dockerfile").read_text()
    base = re.findall(r"^FROM (\S+)", df, re.M)
    assert len(base) == 1
    s = im.standin_for(base[0])
    assert s is not None and s.python in im.PYTHON_SOURCES
    assert "python.tar.xz" in s.dockerfile()
    assert tuple(int(x) for x in s.python.split(".")) >= (3, 13, 14)
    assert "./configure" not in df and "sha256sum" not in df


def test_no_global_apt_recommends_switch_anywhere() -> None:
    """apt defaults stay Debian's: neither the base bootstrap nor a stand-in turns recommends
    off for the whole image (an image's own apt lines may pass --no-install-recommends)."""
    texts = [(REPO / "images" / "bootstrap-base.sh").read_text()]
    texts += [s.dockerfile() for s in im.STANDINS]
    for text in texts:
        assert not re.search(r"Install-Recommends\s+\"?(false|0)", text, re.I), text[:200]


# -- labels and recipes -----------------------------------------------------------------------


def test_labels_name_what_it_stands_in_for_and_what_it_is() -> None:
    s = im.standin_for("python:3.11-slim")
    assert s is not None
    labels = s.labels()
    assert labels[im.LABEL_STANDIN_FOR] == "python:3.11-slim,python:3.11-slim-bookworm"
    assert "bookworm" in labels[im.LABEL_STANDIN_FROM]
    assert labels[im.LABEL_PYTHON] == "3.11"


def test_recipe_changes_with_the_dockerfile_and_labels() -> None:
    s = im.STANDINS[0]
    other = im.StandIn(s.image, s.base, s.aliases, s.really, run=("RUN true",))
    relabelled = im.StandIn(s.image, s.base, (*s.aliases, "debian:x"), s.really)
    assert len({s.recipe(), other.recipe(), relabelled.recipe()}) == 3


def test_needs_build() -> None:
    s = im.STANDINS[0]
    cur = im.ImageInfo("sha256:a", {im.LABEL_RECIPE: s.recipe(), im.LABEL_BUILT_FROM: "sha256:b"})
    assert im.needs_build(s, None, "sha256:b")
    assert not im.needs_build(s, cur, "sha256:b")
    assert im.needs_build(s, cur, "sha256:new-base")
    old = im.ImageInfo("sha256:a", {im.LABEL_RECIPE: "0", im.LABEL_BUILT_FROM: "sha256:b"})
    assert im.needs_build(s, old, "sha256:b")


# -- aliases ----------------------------------------------------------------------------------


REAL_IMG = im.ImageInfo("sha256:real", {}, ("python:3.13-slim",), ("PATH=/usr/bin",))
STANDIN_IMG = im.ImageInfo("sha256:ours", {im.LABEL_STANDIN_FOR: "x"}, ("sandgym/standin:x",))
OLD_ALIAS = im.ImageInfo("sha256:old", {}, ("debian:bookworm",), (im.BASE_ENV_MARKER,))


def test_registry_of() -> None:
    assert im.registry_of("python:3.13-slim") == "docker.io"
    assert im.registry_of("library/debian:12") == "docker.io"
    assert im.registry_of("ghcr.io/laude-institute/t-bench/python-3-13:latest") == "ghcr.io"
    assert im.registry_of("localhost:5000/x:1") == "localhost:5000"


def test_is_ours() -> None:
    assert STANDIN_IMG.is_ours and OLD_ALIAS.is_ours
    assert im.ImageInfo("sha256:t", {}, ("sandgym/terminal:latest", "debian:12")).is_ours
    assert not REAL_IMG.is_ours


@pytest.mark.parametrize(
    ("holder", "registry", "mode", "action", "status"),
    [
        (None, False, "auto", "tag", im.ALIAS),
        (None, True, "auto", "none", im.PULLABLE),
        (REAL_IMG, False, "auto", "keep", im.REAL),
        (REAL_IMG, False, "always", "keep", im.REAL),  # never over an image not ours
        (STANDIN_IMG, False, "auto", "keep", im.ALIAS),
        (OLD_ALIAS, False, "auto", "tag", im.ALIAS),  # an old alias of ours is moved
        (STANDIN_IMG, True, "auto", "untag", im.PULLABLE),  # a registry answers: no shadowing
        (None, True, "always", "tag", im.ALIAS),
        (STANDIN_IMG, False, "never", "untag", im.REMOVED),
        (None, False, "never", "none", im.ABSENT),
    ],
)
def test_plan_alias(
    holder: im.ImageInfo | None, registry: bool, mode: str, action: str, status: str
) -> None:
    act = im.plan_alias("python:3.13-slim", "sha256:ours", holder, registry, mode)
    assert (act.action, act.status) == (action, status)


def test_plan_alias_without_a_built_stand_in_tags_nothing() -> None:
    assert im.plan_alias("debian:12", None, None, False).action == "none"
    with pytest.raises(ValueError):
        im.plan_alias("debian:12", None, None, False, "sometimes")


# -- a fake engine ----------------------------------------------------------------------------


class FakeEngine:
    def __init__(self, images: dict[str, im.ImageInfo], registries: dict[str, bool]) -> None:
        self.images = dict(images)
        self.registries = registries
        self.calls: list[tuple[str, ...]] = []

    def info(self, name: str) -> im.ImageInfo | None:
        return self.images.get(name)

    def infos(self, names: list[str]) -> dict[str, im.ImageInfo | None]:
        return {n: self.info(n) for n in names}

    def probe_registries(self, names: list[str]) -> dict[str, bool]:
        self.calls.append(("probe",))
        return {im.registry_of(n): self.registries.get(im.registry_of(n), False) for n in names}

    def build(self, s: im.StandIn, on_line: Any = None) -> str:
        self.calls.append(("build", s.image))
        base = self.images[s.base]
        self.images[s.image] = im.ImageInfo(
            "sha256:" + s.image,
            {**s.labels(), im.LABEL_RECIPE: s.recipe(), im.LABEL_BUILT_FROM: base.id},
            (s.image,),
        )
        return self.images[s.image].id

    def tag(self, image: str, alias: str) -> None:
        self.calls.append(("tag", alias))
        self.images[alias] = self.images[image]

    def untag(self, alias: str) -> None:
        self.calls.append(("untag", alias))
        del self.images[alias]


def _bases() -> dict[str, im.ImageInfo]:
    return {
        im.BASE_BOOKWORM: im.ImageInfo("sha256:bw", {}, (im.BASE_BOOKWORM,)),
        im.BASE_TRIXIE: im.ImageInfo("sha256:tx", {}, (im.BASE_TRIXIE,)),
        im.BASE_BULLSEYE: im.ImageInfo("sha256:bu", {}, (im.BASE_BULLSEYE,)),
    }


def _run(engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> dict[str, Any]:
    boot: list[list[str]] = []
    monkeypatch.setattr(im, "run_bootstrap", lambda args, log_path: boot.append(args))
    steps, report = im.build_plan(engine, **kw)  # type: ignore[arg-type]
    report["results"] = [st.run() for st in steps]
    report["bootstrap"] = boot
    return report


def test_build_plan_builds_all_tags_aliases_and_keeps_a_real_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    images = _bases()
    images["python:3.13-slim"] = REAL_IMG  # a real image someone loaded by hand
    images["python:3.12-slim-bookworm"] = OLD_ALIAS  # an alias an older sandgym made
    engine = FakeEngine(images, {})
    report = _run(engine, monkeypatch, desktop=True)
    assert report["bootstrap"] == [["--desktop"], ["--suite", "trixie"], ["--suite", "bullseye"]]
    assert [c[1] for c in engine.calls if c[0] == "build"] == [s.image for s in im.STANDINS]
    status = {a["name"]: a["status"] for a in report["aliases"]}
    assert status["python:3.13-slim"] == im.REAL and engine.images["python:3.13-slim"] is REAL_IMG
    assert status["python:3.12-slim-bookworm"] == im.REMOVED
    assert "python:3.12-slim-bookworm" not in engine.images
    tagged = [a for a in ALL_ALIASES if a != "python:3.13-slim"]
    assert len(tagged) == len(ALL_ALIASES) - 1 > 0, "no alias left to check"
    for a in tagged:
        assert status[a] == im.ALIAS
        assert engine.images[a].id == engine.images[im.standin_for(a).image].id  # type: ignore[union-attr]
    # a second run changes nothing
    engine.calls.clear()
    report = _run(engine, monkeypatch)
    assert report["results"][-1] == "0 changed"
    assert not [c for c in engine.calls if c[0] in ("build", "tag", "untag")]


def test_build_plan_with_a_registry_makes_no_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine(_bases(), {"docker.io": True, "ghcr.io": False})
    report = _run(engine, monkeypatch)
    status = {a["name"]: a["status"] for a in report["aliases"]}
    assert status["python:3.13-slim"] == im.PULLABLE and "python:3.13-slim" not in engine.images
    assert status["ghcr.io/laude-institute/t-bench/python-3-13:20250620"] == im.ALIAS
    assert report["registries"] == {"docker.io": True, "ghcr.io": False}


def test_build_plan_only_builds_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine(_bases(), {})
    report = _run(engine, monkeypatch, only=["ghcr.io/laude-institute/t-bench/python-3-13:latest"])
    built = [c[1] for c in engine.calls if c[0] == "build"]
    assert built == [
        "sandgym/standin:python-3.13-bookworm",
        "sandgym/standin:tbench-python-3-13",
    ]
    assert "debian:12" not in {a["name"] for a in report["aliases"]}
    engine2 = FakeEngine(_bases(), {})
    report = _run(engine2, monkeypatch, only=["debian:12"])
    assert report["bootstrap"] == [[]]  # no trixie base needed
    engine3 = FakeEngine(_bases(), {})
    report = _run(engine3, monkeypatch, only=["debian:bullseye-slim"])
    assert report["bootstrap"] == [[], ["--suite", "bullseye"]]
    assert [c[1] for c in engine3.calls if c[0] == "build"] == ["sandgym/standin:debian-bullseye"]
    bullseye = engine3.images["sandgym/standin:debian-bullseye"]
    assert bullseye.labels[im.LABEL_BUILT_FROM] == "sha256:bu"
    for a in ("debian:bullseye", "debian:bullseye-slim", "debian:11", "debian:11-slim"):
        assert engine3.images[a].id == bullseye.id
    with pytest.raises(ValueError, match="no stand-in"):
        im.build_plan(engine, only=["python:3.12-slim"])  # type: ignore[arg-type]


# -- list -------------------------------------------------------------------------------------


def _built_engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    images = _bases()
    images["python:3.13-slim"] = REAL_IMG
    engine = FakeEngine(images, {})
    _run(engine, monkeypatch)
    return engine


def test_list_report_and_text(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _built_engine(monkeypatch)
    names = [*im.OWN_IMAGES, *(s.image for s in im.STANDINS), *ALL_ALIASES]
    names += [a for u in im.UNAVAILABLE for a in u.aliases]
    doc = im.list_report(engine.infos(names))
    by_image = {e["image"]: e for e in doc["stand_ins"]}
    py = by_image["sandgym/standin:python-3.13"]
    assert py["present"] and py["python"] == "3.13"
    assert {a["name"]: a["status"] for a in py["aliases"]} == {
        "python:3.13-slim": im.REAL,
        "python:3.13-slim-trixie": im.ALIAS,
    }
    assert doc["unavailable"][0]["status"][0] == {"name": "python:3.12-slim", "status": im.ABSENT}
    bw = by_image["sandgym/standin:python-3.13-bookworm"]
    assert [(a["name"], a["status"]) for a in bw["aliases"]] == [
        ("python:3.13-slim-bookworm", im.ALIAS)
    ]
    text = im.format_list(doc)
    assert "sandgym/standin:ubuntu-24.04  [built]" in text
    assert "    real     python:3.13-slim" in text
    assert "no stand-in: python:3.12-slim" in text
    empty = im.list_report({})
    assert not any(e["present"] for e in empty["stand_ins"])
    assert "[not built" in im.format_list(empty)


def test_cli_list_json_prints_one_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = _built_engine(monkeypatch)
    monkeypatch.setattr(images_cli, "_engine", lambda: engine)
    parser = argparse.ArgumentParser()
    images_cli.add_arguments(parser)
    assert images_cli.run(parser.parse_args(["list", "--json"])) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert [e["image"] for e in doc["stand_ins"]] == [s.image for s in im.STANDINS]


def test_cli_build_json_reports_steps_and_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = FakeEngine(_bases(), {})
    monkeypatch.setattr(images_cli, "_engine", lambda: engine)
    monkeypatch.setattr(im, "run_bootstrap", lambda args, log_path: None)
    parser = argparse.ArgumentParser()
    images_cli.add_arguments(parser)
    assert images_cli.run(parser.parse_args(["build", "--json", "--no-progress"])) == 0
    doc = json.loads(capsys.readouterr().out)
    # bookworm + own images, each suite base, each stand-in, the aliases
    assert doc["error"] is None
    assert len(doc["steps"]) == 2 + len(im.SUITE_BASES) + len(im.STANDINS)

    def boom(args: list[str], log_path: Path) -> None:
        raise im.BuildError("debootstrap failed")

    monkeypatch.setattr(im, "run_bootstrap", boom)
    assert images_cli.run(parser.parse_args(["build", "--json", "--no-progress"])) == 1
    doc = json.loads(capsys.readouterr().out)
    assert "debootstrap failed" in doc["error"] and doc["steps"][0]["result"] == "failed"


def test_images_is_a_sandgym_command() -> None:
    from sandgym.cli import COMMANDS

    assert COMMANDS["images"][0] == "lab.images_cli"
