"""Offline stand-ins for the public base images task Dockerfiles start `FROM`.

With no container registry reachable, `FROM python:3.13-slim-bookworm` or `FROM
ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624` cannot build. This module builds, from
the Debian bases that `images/bootstrap-base.sh` makes with debootstrap, one local image per
public image family that behaves like it as far as this machine allows, and tags the public
names onto it only when no registry answers for them:

* `debian:*` / `ubuntu:*`: a plain Debian minbase (apt's defaults unchanged, none of sandgym's
  extra packages): bookworm, trixie, and bullseye (Debian 11, which the mirror still serves).
  No Ubuntu mirror is reachable, so `ubuntu:24.04` stands on Debian trixie and `ubuntu:22.04` on
  bookworm (the Debian releases nearest in glibc, gcc and Python); packages
  that exist only in Ubuntu, or versions pinned to Ubuntu's, still fail there.
* `python:3.X-slim*`: CPython 3.X as `python`, `python3`, `pip`, `pip3` on PATH (in
  /usr/local/bin, like the official images), headers for C extensions, `pip install` without
  `--break-system-packages`. `-trixie` 3.13 and `-bookworm` 3.11 are Debian's own packages;
  `-bookworm` 3.13 is built from python.org's tarball (which Debian's mirror carries) on
  bookworm, as the official image is. 3.12 has no source or build on any reachable host, so it
  gets no alias (`UNAVAILABLE`).
* Terminal-Bench's `t-bench/python-3-13` and `t-bench/ubuntu-24-04`: the python/ubuntu
  stand-in plus `tmux` and `asciinema`, as the real images are.

Every stand-in carries the labels `sandgym.stand-in-for` (the public names, comma-separated)
and `sandgym.stand-in-from` (what it really is), so `sandgym images list` reads back from the
engine what stands in for what. A public name is never tagged over an image that is not ours.

The docker SDK is imported where it is used; everything above `ImageEngine` is pure and
unit-tested.

Why over 500 lines: each stand-in family's recipe (its Dockerfile text, aliases and labels) is
data kept beside the one builder that uses it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import logging
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LABEL_STANDIN_FOR = "sandgym.stand-in-for"
LABEL_STANDIN_FROM = "sandgym.stand-in-from"
#: the Python version a python stand-in promises (checked after each build)
LABEL_PYTHON = "sandgym.stand-in-python"
#: hash of the recipe (Dockerfile text and labels): a changed recipe rebuilds the image
LABEL_RECIPE = "sandgym.recipe"
#: id of the image it was built FROM: a rebuilt base rebuilds the stand-in
LABEL_BUILT_FROM = "sandgym.built-from"

#: set by every version of images/bootstrap-base.sh on the base it imports; no official image has it
BASE_ENV_MARKER = "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"

BASE_BOOKWORM = "sandgym/base:bookworm"
BASE_TRIXIE = "sandgym/base:trixie"
BASE_BULLSEYE = "sandgym/base:bullseye"
TERMINAL_IMAGE = "sandgym/terminal:latest"
DESKTOP_IMAGE = "sandgym/desktop:latest"
ENVSERVER_IMAGE = "sandgym/envserver:latest"

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP_SCRIPT = REPO / "images" / "bootstrap-base.sh"

#: `sandgym images build --aliases`: auto = tag only names no registry answers for
ALIAS_MODES = ("auto", "always", "never")

# An alias's status in `images list` / `images build`.
ALIAS = "alias"  # the public name is tagged onto its stand-in here
REAL = "real"  # an image that is not ours holds the name: kept, never overwritten
PULLABLE = "pullable"  # a registry answers for the name: the real image is used, no alias
ABSENT = "absent"  # nothing holds the name (stand-in not built, or aliases off)
STALE = "stale"  # ours, but pointing at another image than its stand-in (build fixes it)
REMOVED = "removed"  # an alias of ours was untagged (registry reachable, or aliases off)


@dataclass(frozen=True)
class StandIn:
    """One local image standing in for a family of public images."""

    image: str  # our tag
    base: str  # what it is built FROM
    aliases: tuple[str, ...]  # the public names it stands in for
    really: str  # what it really is, in words (label sandgym.stand-in-from)
    run: tuple[str, ...] = ()  # Dockerfile lines after FROM
    python: str | None = None  # "3.13" or "3.13.15": `python --version` must say so (python_says)

    def dockerfile(self) -> str:
        return "\n".join([f"FROM {self.base}", *self.run]) + "\n"

    def labels(self) -> dict[str, str]:
        """The labels that identify it; `LABEL_RECIPE` hashes them with the Dockerfile."""
        labels = {LABEL_STANDIN_FOR: ",".join(self.aliases), LABEL_STANDIN_FROM: self.really}
        if self.python:
            labels[LABEL_PYTHON] = self.python
        return labels

    def recipe(self) -> str:
        text = self.dockerfile() + json.dumps(self.labels(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def python_says(line: str, version: str) -> bool:
    """Whether `python --version`'s `line` names `version`: that release exactly ("3.13.15"),
    or any release of that line ("3.13": 3.13.5 does, 3.130.1 does not)."""
    said = line.strip().removeprefix("Python ")
    return said == version or said.startswith(version + ".")


@dataclass(frozen=True)
class Unavailable:
    """Public names no stand-in can be made for here: they get no alias, and the list says why."""

    aliases: tuple[str, ...]
    reason: str


def _python_run(version: str) -> tuple[str, ...]:
    """CPython `version` from Debian's packages, laid out like the official python:*-slim
    images: python/python3/pip/pip3 in /usr/local/bin (pip installed by pip, so it can upgrade
    itself), headers (python3-dev) present, no gcc, no PEP 668 marker (so `pip install` works
    as root without --break-system-packages)."""
    links = " && ".join(
        f"ln -sf {target} /usr/local/bin/{name}"
        for name, target in (
            (f"python{version}", f"/usr/bin/python{version}"),
            ("python3", f"/usr/bin/python{version}"),
            ("python", f"/usr/bin/python{version}"),
            (f"python{version}-config", f"/usr/bin/python{version}-config"),
            ("python3-config", f"/usr/bin/python{version}-config"),
            ("python-config", f"/usr/bin/python{version}-config"),
        )
    )
    return (
        # Our own apt line may skip recommends (python3-dev recommends the whole gcc toolchain,
        # which the official slim images do not carry); the image's apt defaults stay Debian's.
        "RUN apt-get update"
        " && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"
        f" python{version} python{version}-venv python{version}-dev python3-venv python3-dev"
        " && rm -rf /var/lib/apt/lists/*"
        f" && rm -f /usr/lib/python{version}/EXTERNALLY-MANAGED"
        # pip as the official images have it: installed by pip itself, run from the wheel
        # Debian's venv package ships (offline; Debian disables ensurepip outside a venv), into
        # /usr/local with its RECORD, so `pip install --upgrade pip` can replace it; and no
        # Debian-installed pip, setuptools or wheel, which pip could not upgrade (no RECORD)
        # and the official 3.12+ images do not carry
        " && w=$(ls /usr/share/python-wheels/pip-*.whl)"
        f' && python{version} "$w/pip" install --no-cache-dir --no-index "$w"'
        # before 3.12, ensurepip (and so the official image) also installed setuptools
        + (
            " && s=$(ls /usr/share/python-wheels/setuptools-*.whl)"
            f' && python{version} -m pip install --no-cache-dir --no-index "$s"'
            if tuple(int(x) for x in version.split(".")) < (3, 12)
            else ""
        )
        + f" && python{version} -m pip --version"
        f" && {links}",
        "ENV PIP_DISABLE_PIP_VERSION_CHECK=1",
        'CMD ["python3"]',
    )


#: CPython sources the Debian mirror carries (python.org's signed release tarball, byte for byte:
#: Debian's `.orig.tar.xz` of the release that ships it), by release, so a python stand-in can be
#: built on the Debian release its tag names even where that release packages another Python.
#: 3.13.5: trixie's python3.13. 3.13.15: sid's and forky's python3.13 3.13.15-1; its sha256 is
#: the one Debian's signed index names (sid's InRelease, dated 2026-10-30 and signed by the
#: archive key, lists Sources.xz's sha256, and Sources.xz lists this file's).
PYTHON_SOURCES: dict[str, tuple[str, str]] = {
    "3.13.5": (
        "http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz",
        "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640",
    ),
    "3.13.15": (
        "http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_3.13.15.orig.tar.xz",
        "1e66a7945a48390ee4c2a4268a0e4185884059a13c4aab6d148aa208deea4a76",
    ),
}


def _python_source_run(release: str, usrmerge_diversions: bool = False) -> tuple[str, ...]:
    """CPython `release` (a key of `PYTHON_SOURCES`, e.g. "3.13.5") built from its release
    tarball into /usr/local, as the official python:*-slim images are (their Dockerfile's
    steps: runtime packages, build dependencies removed afterwards except the libraries the
    build links, shared libpython, ensurepip's pip, the unversioned links), without the
    official build's profile-guided and link-time optimisation (they cost the test suite's run
    under PGO, tens of minutes on two cores).

    `usrmerge_diversions`: the base's libc6 diverts its pre-usrmerge paths (trixie on: `diversion
    by libc6 from: /lib64/ld-linux-x86-64.so.2`), so `dpkg-query --search` also prints
    `diversion by` lines, which name no package and are dropped before `apt-mark manual`."""
    url, sha = PYTHON_SOURCES[release]
    no_diversions = " | grep -v '^diversion by'" if usrmerge_diversions else ""
    version = ".".join(release.split(".")[:2])  # python3.13, as the build names it
    build_deps = (
        "dpkg-dev gcc gnupg libbluetooth-dev libbz2-dev libc6-dev libdb-dev libffi-dev "
        "libgdbm-dev liblzma-dev libncursesw5-dev libreadline-dev libsqlite3-dev libssl-dev "
        "make tk-dev uuid-dev wget xz-utils zlib1g-dev"
    )
    return (
        # the official Debian images' apt setting (their docker-autoremove-suggests file):
        # without it apt keeps what a kept package merely suggests (libdpkg-perl suggests
        # gcc), so the build tools would stay in the image
        "RUN echo 'Apt::AutoRemove::SuggestsImportant \"false\";'"
        " > /etc/apt/apt.conf.d/docker-autoremove-suggests",
        "ENV PATH=/usr/local/bin:$PATH LANG=C.UTF-8",
        "RUN set -eux; apt-get update;"
        " DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"
        " ca-certificates netbase tzdata; rm -rf /var/lib/apt/lists/*",
        'RUN set -eux; savedAptMark="$(apt-mark showmanual)"; apt-get update;'
        f" DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {build_deps};"
        f" wget -q -O python.tar.xz {url};"
        f' echo "{sha} *python.tar.xz" | sha256sum -c -;'
        " mkdir -p /usr/src/python;"
        " tar --extract --directory /usr/src/python --strip-components=1 --file python.tar.xz;"
        " rm python.tar.xz; cd /usr/src/python;"
        ' gnuArch="$(dpkg-architecture --query DEB_BUILD_GNU_TYPE)";'
        ' ./configure --build="$gnuArch" --enable-loadable-sqlite-extensions'
        " --enable-option-checking=fatal --enable-shared --with-ensurepip;"
        ' EXTRA_CFLAGS="$(dpkg-buildflags --get CFLAGS)";'
        ' LDFLAGS="$(dpkg-buildflags --get LDFLAGS) -Wl,--strip-all";'
        ' make -j "$(nproc)" "EXTRA_CFLAGS=$EXTRA_CFLAGS" "LDFLAGS=$LDFLAGS";'
        " make install; cd /; rm -rf /usr/src/python;"
        r" find /usr/local -depth \( \( -type d -a \( -name test -o -name tests"
        r" -o -name idle_test \) \) -o \( -type f -a \( -name '*.pyc' -o -name '*.pyo'"
        r" -o -name 'libpython*.a' \) \) \) -exec rm -rf '{}' +;"
        " ldconfig;"
        # keep the libraries the build links (as the official recipe does), drop the rest
        " apt-mark auto '.*' > /dev/null; apt-mark manual $savedAptMark;"
        " find /usr/local -type f -executable -not -name '*tkinter*' -exec ldd '{}' ';'"
        ' | awk \'/=>/ { so = $(NF-1); if (index(so, "/usr/local/") == 1) { next };'
        ' gsub("^/(usr/)?", "", so); printf "*%s\\n", so }\''
        " | sort -u | xargs -r dpkg-query --search" + no_diversions + " | cut -d: -f1 | sort -u"
        " | xargs -r apt-mark manual;"
        " apt-get purge -y --auto-remove -o APT::AutoRemove::RecommendsImportant=false;"
        " rm -rf /var/lib/apt/lists/*;"
        f" python{version} --version; pip3 --version",
        "RUN set -eux; for src in idle3 pip3 pydoc3 python3 python3-config; do"
        ' dst="$(echo "$src" | tr -d 3)"; ln -svT "$src" "/usr/local/bin/$dst"; done',
        "ENV PIP_DISABLE_PIP_VERSION_CHECK=1",
        'CMD ["python3"]',
    )


#: What Ubuntu's own image holds that a Debian minbase lacks, as Ubuntu publishes it in the
#: image's package manifest (bionic's `ubuntu-bionic-oci-amd64-root.manifest`; noble's list has
#: the same three): procps (`ps`, `pgrep`, `free`: a Terminal-Bench 1 test runs `pgrep nginx`),
#: e2fsprogs and sensible-utils. Installed without recommends, as they are there.
UBUNTU_RUN = (
    "RUN apt-get update"
    " && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"
    " procps e2fsprogs sensible-utils"
    " && rm -rf /var/lib/apt/lists/*",
)

#: Terminal-Bench's base images are the python/ubuntu image plus these (installed with apt's
#: defaults, as their Dockerfiles do), working in /app: Terminal-Bench 1 tasks build on that
#: (path-tracing runs `./orig` and then moves `/app/reconstructed.ppm`; sqlite-db-truncate's
#: `COPY trunc.db /app` needs /app to be a directory, else /app becomes a file and a sandbox of
#: the image cannot start in it).
TBENCH_RUN = (
    "RUN apt-get update"
    " && DEBIAN_FRONTEND=noninteractive apt-get install -y tmux asciinema"
    " && rm -rf /var/lib/apt/lists/*",
    "WORKDIR /app",
)

#: the official postgres image's entrypoint, as far as a compose service uses it: on a first start
#: (no `$PGDATA/PG_VERSION`) it initialises the cluster as `postgres` with `POSTGRES_USER`
#: (default postgres) and `POSTGRES_PASSWORD` (required unless `POSTGRES_HOST_AUTH_METHOD=trust`),
#: creates `POSTGRES_DB` (default: the user's name), runs /docker-entrypoint-initdb.d/*.sh and
#: *.sql, listens on every address with scram-sha-256 for hosts (trust on the local socket), then
#: runs the command (default `postgres`) as `postgres`
POSTGRES_ENTRYPOINT = r"""#!/bin/bash
set -Eeo pipefail
export PGDATA="${PGDATA:-/var/lib/postgresql/data}"
if [ "${1:0:1}" = - ]; then set -- postgres "$@"; fi
if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
      echo "Error: Database is uninitialized and superuser password is not specified." >&2
      exit 1
    fi
    user="${POSTGRES_USER:-postgres}"
    pw="$(mktemp)"; printf '%s' "${POSTGRES_PASSWORD:-}" > "$pw"; chown postgres "$pw"
    runuser -u postgres -- initdb -D "$PGDATA" --username="$user" --pwfile="$pw"       --auth-local=trust --auth-host="$auth"
    rm -f "$pw"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    echo "host all all all $auth" >> "$PGDATA/pg_hba.conf"
    runuser -u postgres -- pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
    db="${POSTGRES_DB:-$user}"
    if [ "$db" != postgres ]; then
      runuser -u postgres -- psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres         -c "CREATE DATABASE "$db";"
    fi
    for f in /docker-entrypoint-initdb.d/*; do
      case "$f" in
        *.sh) . "$f" ;;
        *.sql) runuser -u postgres -- psql -v ON_ERROR_STOP=1 --username "$user"                  --dbname "$db" -f "$f" ;;
      esac
    done
    runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop
  fi
  exec runuser -u postgres -- "$@"
fi
exec "$@"
"""


def _write_file(text: str, path: str) -> str:
    """A shell command that writes `text` to `path` inside a Dockerfile `RUN` line (base64, so
    no quoting of the text is needed)."""
    return f"echo {base64.b64encode(text.encode()).decode()} | base64 -d > {path}"


def _postgres_run(major: str) -> tuple[str, ...]:
    """Debian's PostgreSQL `major` server and client, and `POSTGRES_ENTRYPOINT`."""
    return (
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y"
        f" --no-install-recommends postgresql-{major} && rm -rf /var/lib/apt/lists/*"
        " && mkdir -p /docker-entrypoint-initdb.d"
        f" && {_write_file(POSTGRES_ENTRYPOINT, '/usr/local/bin/docker-entrypoint.sh')}"
        " && chmod 755 /usr/local/bin/docker-entrypoint.sh",
        f"ENV PATH=$PATH:/usr/lib/postgresql/{major}/bin PGDATA=/var/lib/postgresql/data",
        'ENTRYPOINT ["docker-entrypoint.sh"]',
        "STOPSIGNAL SIGINT",
        "EXPOSE 5432",
        'CMD ["postgres"]',
    )


#: jpillora/dnsmasq's default /etc/dnsmasq.conf (github.com/jpillora/docker-dnsmasq): listen on
#: the container's interface as root, log queries, no resolv.conf, Google's servers upstream
DNSMASQ_CONF = (
    "listen-address=0.0.0.0\ninterface=eth0\nuser=root\nlog-queries\nno-resolv\n"
    "server=8.8.4.4\nserver=8.8.8.8\naddress=/myhost.company/10.0.0.2\n"
)
DNSMASQ_RUN = (
    "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y"
    " --no-install-recommends dnsmasq-base && rm -rf /var/lib/apt/lists/*"
    f" && {_write_file(DNSMASQ_CONF, '/etc/dnsmasq.conf')}",
    'ENTRYPOINT ["dnsmasq", "--conf-file=/etc/dnsmasq.conf", "--no-daemon"]',
    "EXPOSE 53/udp",
)


def _minbase(number: int, codename: str) -> str:
    return (
        f"Debian {number} ({codename}) minbase made with debootstrap (apt sources: {codename}, "
        f"{codename}-updates, {codename}-security), plus the host's CA bundle"
    )


_TRIXIE = _minbase(13, "trixie")
_BOOKWORM = _minbase(12, "bookworm")
_BULLSEYE = _minbase(11, "bullseye")
_NOT_UBUNTU = (
    "; NOT Ubuntu (no Ubuntu mirror is reachable): the nearest Debian release, so "
    "Ubuntu-only packages and versions pinned to Ubuntu's fail"
)

#: The one table of stand-ins and the public names they answer to. Order = build order (an
#: entry may be built FROM an earlier one).
STANDINS: tuple[StandIn, ...] = (
    StandIn(
        image="sandgym/standin:debian-bookworm",
        base=BASE_BOOKWORM,
        aliases=("debian:bookworm", "debian:bookworm-slim", "debian:12", "debian:12-slim"),
        really=_BOOKWORM,
    ),
    StandIn(
        image="sandgym/standin:debian-trixie",
        base=BASE_TRIXIE,
        aliases=("debian:trixie", "debian:trixie-slim", "debian:13", "debian:13-slim"),
        really=_TRIXIE,
    ),
    StandIn(
        image="sandgym/standin:debian-bullseye",
        base=BASE_BULLSEYE,
        aliases=("debian:bullseye", "debian:bullseye-slim", "debian:11", "debian:11-slim"),
        really=_BULLSEYE,
    ),
    StandIn(
        image="sandgym/standin:ubuntu-24.04",
        base=BASE_TRIXIE,
        aliases=("ubuntu:24.04", "ubuntu:noble"),
        really=_TRIXIE + _NOT_UBUNTU + " (24.04 has glibc 2.39, gcc 13, python3.12; trixie "
        "2.41, 14, 3.13); with procps, e2fsprogs and sensible-utils, which Ubuntu's image has",
        run=UBUNTU_RUN,
    ),
    StandIn(
        image="sandgym/standin:ubuntu-22.04",
        base=BASE_BOOKWORM,
        aliases=("ubuntu:22.04", "ubuntu:jammy"),
        really=_BOOKWORM + _NOT_UBUNTU + " (22.04 has glibc 2.35, gcc 11, python3.10; bookworm "
        "2.36, 12, 3.11); with procps, e2fsprogs and sensible-utils, which Ubuntu's image has",
        run=UBUNTU_RUN,
    ),
    StandIn(
        image="sandgym/standin:python-3.13",
        base=BASE_TRIXIE,
        aliases=(
            "python:3.13-slim",
            "python:3.13-slim-trixie",
        ),
        really=_TRIXIE + ", with Debian's CPython 3.13 (python3.13, pip, venv, headers) "
        "as python/python3/pip in /usr/local/bin",
        run=_python_run("3.13"),
        python="3.13",
    ),
    StandIn(
        image="sandgym/standin:python-3.13-bookworm",
        base=BASE_BOOKWORM,
        aliases=("python:3.13-slim-bookworm",),
        really=_BOOKWORM + ", with CPython 3.13.5 built from python.org's release tarball "
        "(Debian's pool copy) into /usr/local as the official image's Dockerfile does, "
        "without its PGO/LTO optimisation",
        run=_python_source_run("3.13.5"),
        python="3.13",
    ),
    StandIn(
        image="sandgym/standin:python-3.13.15-trixie",
        base=BASE_TRIXIE,
        aliases=("python:3.13.15-slim-trixie",),
        really=_TRIXIE + ", with CPython 3.13.15 built from python.org's release tarball "
        "(Debian's pool copy) into /usr/local as the official image's Dockerfile does, "
        "without its PGO/LTO optimisation",
        run=_python_source_run("3.13.15", usrmerge_diversions=True),
        python="3.13.15",
    ),
    StandIn(
        image="sandgym/standin:python-3.11",
        base=BASE_BOOKWORM,
        aliases=("python:3.11-slim", "python:3.11-slim-bookworm"),
        really=_BOOKWORM + ", with Debian's CPython 3.11 (python3.11, pip, venv, headers) "
        "as python/python3/pip in /usr/local/bin",
        run=_python_run("3.11"),
        python="3.11",
    ),
    StandIn(
        image="sandgym/standin:tbench-python-3-13",
        # made on 2025-06-20 from python:3.13-slim, which was bookworm until August 2025
        base="sandgym/standin:python-3.13-bookworm",
        aliases=(
            "ghcr.io/laude-institute/t-bench/python-3-13:20250620",
            "ghcr.io/laude-institute/t-bench/python-3-13:latest",
        ),
        really="the python:3.13-slim-bookworm stand-in (Debian bookworm, CPython 3.13 from "
        "source) plus tmux and asciinema, as Terminal-Bench's image is",
        run=TBENCH_RUN,
        python="3.13",
    ),
    StandIn(
        image="sandgym/standin:tbench-ubuntu-24-04",
        base="sandgym/standin:ubuntu-24.04",
        aliases=(
            "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624",
            "ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest",
        ),
        really="the ubuntu:24.04 stand-in (Debian trixie, NOT Ubuntu) plus tmux and asciinema "
        "(which brings Debian's python3), as Terminal-Bench's image is",
        run=TBENCH_RUN,
    ),
    StandIn(
        image="sandgym/standin:postgres-15",
        base=BASE_BOOKWORM,
        aliases=("postgres:15", "postgres:15-bookworm"),
        really=_BOOKWORM + ", with Debian's PostgreSQL 15 (postgresql-15) and an entrypoint that "
        "does what the official image's does for POSTGRES_USER/PASSWORD/DB and "
        "/docker-entrypoint-initdb.d (lab.images.POSTGRES_ENTRYPOINT)",
        run=_postgres_run("15"),
    ),
    StandIn(
        image="sandgym/standin:dnsmasq",
        base=BASE_BOOKWORM,
        aliases=("jpillora/dnsmasq", "jpillora/dnsmasq:latest"),
        really=_BOOKWORM + ", with Debian's dnsmasq (dnsmasq-base) started as jpillora/dnsmasq "
        "starts it (`dnsmasq --no-daemon` with /etc/dnsmasq.conf and the compose command's "
        "options after it) and that image's default configuration; NOT that image: no webproc "
        "web UI on port 8080, Debian's dnsmasq version instead of Alpine's",
        run=DNSMASQ_RUN,
    ),
)

UNAVAILABLE: tuple[Unavailable, ...] = (
    Unavailable(
        aliases=(
            "python:3.12-slim",
            "python:3.12-slim-bookworm",
            "python:3.12-slim-trixie",
        ),
        reason="no CPython 3.12 can be made offline: Debian bookworm has 3.11, trixie 3.13, "
        "and no reachable package registry ships a CPython 3.12 build (npm's portable-python "
        "downloads it from GitHub at install time); map such tasks yourself, e.g. "
        "--image-map python:3.12-slim-bookworm=python:3.13-slim",
    ),
)

#: sandgym's own images (not stand-ins), shown by `images list`
OWN_IMAGES = (
    BASE_BOOKWORM,
    BASE_TRIXIE,
    BASE_BULLSEYE,
    TERMINAL_IMAGE,
    DESKTOP_IMAGE,
    ENVSERVER_IMAGE,
)

#: the Debian bases besides bookworm (which comes with sandgym's own images), each made by
#: `images/bootstrap-base.sh --suite SUITE` when a chosen stand-in is built on it, in this order
SUITE_BASES: dict[str, str] = {BASE_TRIXIE: "trixie", BASE_BULLSEYE: "bullseye"}


def standin_for(name: str) -> StandIn | None:
    """The stand-in whose aliases include `name` (a public image name), if any."""
    for s in STANDINS:
        if name in s.aliases:
            return s
    return None


def registry_of(name: str) -> str:
    """The registry host a reference is pulled from (`docker.io` for Docker Hub names)."""
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


# -- what the engine holds ------------------------------------------------------------------


@dataclass(frozen=True)
class ImageInfo:
    """What `list`/`build` need of one local image."""

    id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()

    @property
    def is_standin(self) -> bool:
        return LABEL_STANDIN_FOR in self.labels

    @property
    def is_ours(self) -> bool:
        """A stand-in, one of sandgym's own images, or an image made on sandgym's base (older
        sandgym versions tagged public names straight onto sandgym/terminal:latest, without
        labels; once that was rebuilt, only the base's environment tells them apart)."""
        return (
            self.is_standin
            or any(t.startswith("sandgym/") for t in self.tags)
            or BASE_ENV_MARKER in self.env
        )


def alias_status(
    alias: str,
    standin_id: str | None,
    holder: ImageInfo | None,
    registry_answers: bool | None,
) -> str:
    """The status of one public name: `holder` is the local image under that name (None if
    none), `standin_id` the id of its stand-in (None if not built), `registry_answers` whether
    a registry answers for it (None: not probed)."""
    if holder is not None and not holder.is_ours:
        return REAL
    if holder is not None:
        return ALIAS if standin_id is not None and holder.id == standin_id else STALE
    if registry_answers:
        return PULLABLE
    return ABSENT


@dataclass(frozen=True)
class AliasAction:
    alias: str
    action: str  # "tag", "untag", "keep", "none"
    status: str  # the status after the action (ALIAS, REAL, PULLABLE, ABSENT, REMOVED)


def plan_alias(
    alias: str,
    standin_id: str | None,
    holder: ImageInfo | None,
    registry_answers: bool,
    mode: str = "auto",
) -> AliasAction:
    """What `build` does with one public name. Never touches a name held by an image that is
    not ours; tags the stand-in only when no registry answers (mode auto) or always; removes an
    alias of ours when a registry answers (auto) or aliases are off (never)."""
    if mode not in ALIAS_MODES:
        raise ValueError(f"alias mode {mode!r} (expected one of {', '.join(ALIAS_MODES)})")
    if holder is not None and not holder.is_ours:
        return AliasAction(alias, "keep", REAL)
    want = standin_id is not None and (
        mode == "always" or (mode == "auto" and not registry_answers)
    )
    if want:
        if holder is not None and holder.id == standin_id:
            return AliasAction(alias, "keep", ALIAS)
        return AliasAction(alias, "tag", ALIAS)
    after = PULLABLE if registry_answers else ABSENT
    if holder is not None:
        return AliasAction(alias, "untag", REMOVED if after == ABSENT else after)
    return AliasAction(alias, "none", after)


def needs_build(standin: StandIn, current: ImageInfo | None, base_id: str | None) -> bool:
    """A stand-in is rebuilt when it is missing, its recipe changed, or its base was rebuilt."""
    if current is None:
        return True
    if current.labels.get(LABEL_RECIPE) != standin.recipe():
        return True
    return base_id is not None and current.labels.get(LABEL_BUILT_FROM) != base_id


def list_report(
    images: Mapping[str, ImageInfo | None], registries: Mapping[str, bool] | None = None
) -> dict[str, Any]:
    """The document of `sandgym images list --json`. `images` maps every name of interest
    (own images, stand-ins, aliases) to what the engine holds under it (None: nothing)."""
    registries = registries or {}
    standins = []
    for s in STANDINS:
        cur = images.get(s.image)
        sid = cur.id if cur is not None and cur.is_standin else None
        standins.append(
            {
                "image": s.image,
                "present": sid is not None,
                "id": sid,
                "stands_in_for": list(s.aliases),
                "really": s.really,
                "python": s.python,
                "aliases": [
                    {
                        "name": a,
                        "status": alias_status(
                            a, sid, images.get(a), registries.get(registry_of(a))
                        ),
                    }
                    for a in s.aliases
                ],
            }
        )
    return {
        "stand_ins": standins,
        "unavailable": [
            {
                "names": list(u.aliases),
                "reason": u.reason,
                "status": [
                    {"name": a, "status": _unavailable_status(images.get(a))} for a in u.aliases
                ],
            }
            for u in UNAVAILABLE
        ],
        "own": [{"image": n, "present": images.get(n) is not None} for n in OWN_IMAGES],
        "registries": dict(registries),
    }


def _unavailable_status(holder: ImageInfo | None) -> str:
    """A name with no stand-in: held by a real image, or by an old alias of ours, or by none."""
    if holder is None:
        return ABSENT
    return STALE if holder.is_ours else REAL


def format_list(doc: Mapping[str, Any]) -> str:
    """`sandgym images list` without --json: one block per stand-in."""
    lines: list[str] = []
    for s in doc["stand_ins"]:
        state = "built" if s["present"] else "not built (sandgym images build)"
        lines.append(f"{s['image']}  [{state}]")
        lines.append(f"    is: {s['really']}")
        for a in s["aliases"]:
            lines.append(f"    {a['status']:<8} {a['name']}")
    for u in doc["unavailable"]:
        lines.append("no stand-in: " + ", ".join(u["names"]))
        lines.append(f"    why: {u['reason']}")
        for a in u["status"]:
            if a["status"] != ABSENT:
                lines.append(f"    {a['status']:<8} {a['name']}")
    own = ", ".join(f"{o['image']}{'' if o['present'] else ' (absent)'}" for o in doc["own"])
    lines.append(f"sandgym images: {own}")
    lines.append(
        f"status: {ALIAS} = tagged onto the stand-in here; {REAL} = an image not ours holds the "
        f"name (kept); {PULLABLE} = a registry answers (no alias); {ABSENT} = nothing local; "
        f"{STALE} = an old alias of ours (build fixes it)"
    )
    return "\n".join(lines)


# -- the engine -----------------------------------------------------------------------------


class BuildError(RuntimeError):
    pass


class ImageEngine:
    """The engine side: inspect, build, tag. Uses the docker SDK (imported here, lazily)."""

    def __init__(self, client: Any = None, timeout: int = 900) -> None:
        if client is None:
            import docker

            client = docker.from_env(timeout=timeout)
        self.client = client

    def info(self, name: str) -> ImageInfo | None:
        import docker.errors

        try:
            attrs = self.client.api.inspect_image(name)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            if getattr(exc, "status_code", None) == 404:
                return None
            raise
        config = attrs.get("Config") or {}
        return ImageInfo(
            id=attrs["Id"],
            labels=dict(config.get("Labels") or {}),
            tags=tuple(attrs.get("RepoTags") or ()),
            env=tuple(config.get("Env") or ()),
        )

    def infos(self, names: Iterable[str]) -> dict[str, ImageInfo | None]:
        return {n: self.info(n) for n in names}

    def registry_answers(self, name: str) -> bool:
        """Whether a registry answers for `name` (a manifest look-up, nothing pulled). With
        no registry reachable the engine fails at once (DNS or connect)."""
        try:
            self.client.api.inspect_distribution(name)
            return True
        except Exception as exc:
            log.debug("registry probe %s: %s", name, exc)
            return False

    def probe_registries(self, names: Iterable[str]) -> dict[str, bool]:
        """One probe per registry host, with the first name seen of that host."""
        first: dict[str, str] = {}
        for n in names:
            first.setdefault(registry_of(n), n)
        return {host: self.registry_answers(n) for host, n in first.items()}

    def build(self, standin: StandIn, on_line: Callable[[str], None] | None = None) -> str:
        """Build `standin` (classic builder, Dockerfile-only context); returns the image id."""
        base = self.info(standin.base)
        if base is None:
            raise BuildError(f"{standin.image}: its base {standin.base} is missing")
        labels = {**standin.labels(), LABEL_RECIPE: standin.recipe(), LABEL_BUILT_FROM: base.id}
        tail: list[str] = []
        stream = self.client.api.build(
            fileobj=io.BytesIO(standin.dockerfile().encode()),
            tag=standin.image,
            labels=labels,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                raise BuildError(
                    f"{standin.image}: {chunk['error'].strip()}\n" + "".join(tail[-30:])
                )
            text = chunk.get("stream")
            if text:
                tail.append(text)
                if on_line is not None:
                    on_line(text.rstrip("\n"))
        built = self.info(standin.image)
        if built is None:
            raise BuildError(f"{standin.image}: build ended without an image")
        if standin.python:
            self.check_python(standin)
        return built.id

    def check_python(self, standin: StandIn) -> None:
        """`python --version` in the built image must name the version its tag promises."""
        out = self.client.containers.run(
            standin.image,
            ["sh", "-c", "python --version && python3 --version && pip --version"],
            remove=True,
            network_disabled=True,
        ).decode()
        want = standin.python or ""
        lines = out.splitlines()
        if len(lines) < 3 or not all(python_says(ln, want) for ln in lines[:2]):
            raise BuildError(
                f"{standin.image}: expected Python {standin.python} (`python --version`), "
                f"the image says {out!r}"
            )

    def tag(self, image: str, alias: str) -> None:
        repo, _, tag = alias.rpartition(":")
        if not repo or "/" in tag:
            repo, tag = alias, "latest"
        self.client.api.tag(image, repo, tag, force=True)

    def untag(self, alias: str) -> None:
        # An image with other tags left only loses this one (noprune keeps its layers anyway).
        self.client.api.remove_image(alias, noprune=True)


def run_bootstrap(args: list[str], log_path: Path) -> None:
    """images/bootstrap-base.sh with `args`; its log goes to `log_path`."""
    with open(log_path, "ab") as fh:
        proc = subprocess.run(
            ["bash", str(BOOTSTRAP_SCRIPT), *args], stdout=fh, stderr=subprocess.STDOUT
        )
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-20:]
        raise BuildError(
            f"images/bootstrap-base.sh {' '.join(args)} failed ({proc.returncode}); "
            f"log {log_path}:\n" + "\n".join(tail)
        )


@dataclass
class BuildStep:
    name: str
    run: Callable[[], str]  # returns what happened: "built", "kept", ...


def alias_mode_default() -> str:
    """`SANDGYM_STANDIN_ALIASES` = auto (default) | always | never."""
    mode = os.environ.get("SANDGYM_STANDIN_ALIASES", "auto")
    return mode if mode in ALIAS_MODES else "auto"


def select_standins(only: Iterable[str] | None) -> list[StandIn]:
    """The stand-ins named in `only` (by our tag or by a public name), with the stand-ins they
    are built FROM; all of them when `only` is empty."""
    wanted = list(only or ())
    if not wanted:
        return list(STANDINS)
    by_image = {s.image: s for s in STANDINS}
    chosen: set[str] = set()
    for name in wanted:
        s = by_image.get(name) or standin_for(name)
        if s is None:
            known = ", ".join(s.image for s in STANDINS)
            raise ValueError(f"no stand-in for {name!r} (stand-ins: {known})")
        while s is not None:
            chosen.add(s.image)
            s = by_image.get(s.base)
    return [s for s in STANDINS if s.image in chosen]


def build_plan(
    engine: ImageEngine,
    *,
    only: Iterable[str] | None = None,
    force: bool = False,
    desktop: bool = False,
    envserver: bool = False,
    aliases: str = "auto",
    log_path: Path = Path("/tmp/sandgym-images.log"),
    on_line: Callable[[str], None] | None = None,
) -> tuple[list[BuildStep], dict[str, Any]]:
    """The steps of `sandgym images build` (run them in order; each returns what it did) and
    the report they fill in: `{"steps":[{"name","result"}], "aliases":[{"name","image",
    "status"}], "registries":{host: bool}}`."""
    if aliases not in ALIAS_MODES:
        raise ValueError(f"aliases={aliases!r} (expected one of {', '.join(ALIAS_MODES)})")
    chosen = select_standins(only)
    report: dict[str, Any] = {"steps": [], "aliases": [], "registries": {}}
    force_args = ["--force"] if force else []
    steps: list[BuildStep] = []

    def bootstrap(args: list[str]) -> str:
        run_bootstrap([*force_args, *args], log_path)
        return "done"

    own = (
        [TERMINAL_IMAGE]
        + ([DESKTOP_IMAGE] if desktop else [])
        + ([ENVSERVER_IMAGE] if envserver else [])
    )
    extra = (["--desktop"] if desktop else []) + (["--envserver"] if envserver else [])

    def own_images() -> str:
        return bootstrap(extra)

    steps.append(BuildStep(f"{BASE_BOOKWORM} + " + " + ".join(own), own_images))
    for base, suite in SUITE_BASES.items():
        if any(_root_base(s) == base for s in chosen):
            steps.append(BuildStep(base, functools.partial(bootstrap, ["--suite", suite])))

    def build_one(s: StandIn) -> str:
        base = engine.info(s.base)
        if not force and not needs_build(s, engine.info(s.image), base.id if base else None):
            return "kept"
        engine.build(s, on_line=on_line)
        return "built"

    for s in chosen:
        steps.append(BuildStep(s.image, functools.partial(build_one, s)))

    def do_aliases() -> str:
        names = [a for s in chosen for a in s.aliases] + [a for u in UNAVAILABLE for a in u.aliases]
        registries = engine.probe_registries(names) if aliases == "auto" else {}
        report["registries"] = registries
        changed = 0
        for s in chosen:
            cur = engine.info(s.image)
            sid = cur.id if cur is not None else None
            for a in s.aliases:
                act = plan_alias(
                    a, sid, engine.info(a), registries.get(registry_of(a), False), aliases
                )
                if act.action == "tag":
                    engine.tag(s.image, a)
                elif act.action == "untag":
                    engine.untag(a)
                changed += act.action in ("tag", "untag")
                report["aliases"].append({"name": a, "image": s.image, "status": act.status})
        # Names with no stand-in: an alias an older sandgym made there goes.
        for u in UNAVAILABLE:
            for a in u.aliases:
                holder = engine.info(a)
                if holder is not None and holder.is_ours:
                    engine.untag(a)
                    changed += 1
                    status = REMOVED
                else:
                    status = REAL if holder is not None else ABSENT
                report["aliases"].append({"name": a, "image": None, "status": status})
        return f"{changed} changed"

    steps.append(BuildStep(f"aliases ({aliases})", do_aliases))
    return steps, report


def _root_base(s: StandIn) -> str:
    by_image = {x.image: x for x in STANDINS}
    while s.base in by_image:
        s = by_image[s.base]
    return s.base
