"""The substitution layer of `sandgym bench harbor_compat` (opt-in: `--substitute`; bench only).

This machine reaches the package registries (PyPI, Debian's mirror, npm) and nothing else. Some
public tasks fetch their *tools* from hosts that are unreachable here, where the very same tool
is published on a registry too. For those fetches only, the bench runs a rewritten copy of the
task directory (under `--work-dir`, never the original) in which the fetch is replaced by its
registry equivalent. Nothing else in the task changes: not the tests, not the solution's logic,
not what the verifier checks. Each replacement is recorded on the task's entry
(`substitutions`: name, file, the original text) and the report counts substituted tasks apart.

The substitutions (`SUBSTITUTIONS`):

- `uv-installer-from-pypi`: `curl -LsSf https://astral.sh/uv[/<version>]/install.sh | sh` (the
  uv installer's own host, which downloads a release from GitHub) becomes a few lines that fetch
  the `uv` wheel of the same version from the Python package index (the wheel carries the same
  `uv`/`uvx` binaries), unpack it into the installer's directory (`$UV_INSTALL_DIR`, else
  `$XDG_BIN_HOME`, else `~/.local/bin`) and write the installer's `env` file, so the script's
  next line (`source $HOME/.local/bin/env`) works as before.
- `uv-image-from-pypi`: a Dockerfile's `COPY --from=ghcr.io/astral-sh/uv:<version> /uv /uvx
  ...` (uv's image on the GitHub container registry) copies from `sandgym/subst-uv:<version>`
  instead, a local image holding only those two binaries, unpacked from the same version's
  wheel on the Python package index (`ensure_uv_image`, built once).
- `uv-python-from-debian`: where the script then asks uv for an interpreter by version
  (`uvx -p 3.13`, `uv venv --python 3.12`), uv would download a CPython build from GitHub. With
  `UV_PYTHON_DOWNLOADS=never` it uses a system interpreter instead; when the image has no
  `python3.X`, the rewritten script installs Debian's `python3.X` package from the mirror. Where
  the image's distribution carries no such package, uv stops with "No interpreter found", and the
  report says "needs a host unreachable here" (github.com), never passed.

Everything else that needs an unreachable host (a dataset or model from Hugging Face, a source
tarball or repository from GitHub, a base image from a registry) is not substituted: such a task
is reported with the reason `needs_unreachable_host` and the hosts it tried.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

#: name -> what it replaces and with what (the JSON report carries this table)
SUBSTITUTIONS: dict[str, dict[str, str]] = {
    "uv-installer-from-pypi": {
        "replaces": "the uv installer from https://astral.sh/uv/<version>/install.sh "
        "(downloads uv from github.com)",
        "with": "the uv wheel of the same version from the Python package index (pypi.org, "
        "files.pythonhosted.org), unpacked where the installer puts uv, plus its env file",
    },
    "uv-python-from-debian": {
        "replaces": "uv's download of a CPython X.Y build (python-build-standalone) from "
        "github.com, for `uvx -p X.Y` / `uv ... --python X.Y` (in a script, or a Dockerfile "
        "`RUN`, where `uv run script.py` also takes X.Y from the script's requires-python)",
        "with": "UV_PYTHON_DOWNLOADS=never and, where the image has no pythonX.Y, Debian's own "
        "CPython X.Y packages (python3.X-minimal, libpython3.X-stdlib, ... and the libraries "
        "they link, from the Debian release that ships X.Y) fetched from the Debian mirror, "
        "unpacked under /opt/sandgym-cpython-X.Y and started through their own dynamic "
        "loader by a pythonX.Y wrapper on PATH, so they run on any glibc",
    },
    "uv-image-from-pypi": {
        "replaces": "a Dockerfile's `COPY --from=ghcr.io/astral-sh/uv:<version>` (uv's image on "
        "the GitHub container registry)",
        "with": "`COPY --from=sandgym/subst-uv:<version>`, a local image holding only /uv and "
        "/uvx, unpacked from the uv wheel of the same version on the Python package index "
        "(`ensure_uv_image`)",
    },
    "noto-font-from-debian": {
        "replaces": "a Dockerfile's download of a Noto font file from notofonts.github.io",
        "with": "the same font file (same name) from Debian's fonts-noto-core package, fetched "
        "with apt from Debian's mirror and unpacked to the same destination",
    },
    "digest-pinned-base-to-stand-in": {
        "replaces": "a Dockerfile's `FROM name:tag@sha256:<digest>` whose `name:tag` has a "
        "local stand-in (`sandgym images`): the digest names one build of the public image, "
        "which no registry here serves",
        "with": "`FROM name:tag`, the stand-in every other task of that image runs on (the "
        "digest's exact build is not reproduced; the stand-in's limits apply as to the tag)",
    },
    "service-image-stand-in": {
        "replaces": "a compose service's `image:` (no build) that only a registry here lacks "
        "serves, e.g. `postgres:15` from Docker Hub",
        "with": "the local stand-in tagged with that name (`sandgym images`, "
        "lab.images.STANDINS: for postgres:15, Debian's PostgreSQL 15 with an entrypoint "
        "doing what the official image's does); the stand-in's limits apply",
    },
    "copy-dest-dir-for-classic-builder": {
        "replaces": "a Dockerfile's `COPY a b /dest` (several sources, or a wildcard matching "
        "several files) without the destination's trailing slash, which BuildKit accepts and "
        "the classic builder refuses",
        "with": "the same `COPY` with `/dest/` (what BuildKit makes of it); made by the runtime "
        "(sandgym/tasks/dockerfile/copy_dest.py) on every build, listed here per task",
    },
}

#: the local stand-in of uv's registry image (`uv-image-from-pypi`)
UV_IMAGE_REPO = "sandgym/subst-uv"

#: Debian release that ships each CPython minor version, and the packages of a working
#: interpreter there (the interpreter, its standard library, and every library they link)
DEBIAN_CPYTHON: dict[str, tuple[str, list[str]]] = {
    "3.13": (
        "trixie",
        (
            "python3.13-minimal libpython3.13-minimal libpython3.13-stdlib python3.13 libc6 "
            "libgcc-s1 libexpat1 zlib1g libssl3t64 libffi8 libbz2-1.0 liblzma5 libsqlite3-0 "
            "libmpdec4 libncursesw6 libtinfo6 libreadline8t64 libuuid1 libzstd1 libgdbm6t64 "
            "libnsl2 libtirpc3t64 libcrypt1 media-types libdb5.3t64 libgssapi-krb5-2 libkrb5-3 "
            "libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1"
        ).split(),
    ),
}
DEBIAN_MIRROR = "http://deb.debian.org/debian"

#: hosts that answer from this machine (and from its containers)
REACHABLE_HOSTS = (
    "deb.debian.org",
    "security.debian.org",
    "pypi.org",
    "files.pythonhosted.org",
    "pypi.python.org",
    "registry.npmjs.org",
    "localhost",
    "127.0.0.1",
)

#: files of a task directory whose shell text may be rewritten
SCRIPT_FILES = (
    "tests/test.sh",
    "solution/solve.sh",
    "run-tests.sh",
    "solution.sh",
    "environment/Dockerfile",
    "Dockerfile",
)

_UV_INSTALLER_RE = re.compile(
    r"(?:curl|wget)\b[^\n|;&]*?https?://astral\.sh/uv/(?:(?P<ver>\d+\.\d+\.\d+)/)?install\.sh"
    r"[^\n|;&]*\|\s*(?:env\s+(?P<env>(?:[A-Za-z_]+=\S+\s+)+))?(?:ba)?sh\b(?:\s+-s\b[^\n;&|]*)?"
)
_UV_IMAGE_RE = re.compile(
    r"(?im)^(?P<head>\s*COPY\s+(?:--\S+\s+)*--from=)ghcr\.io/astral-sh/uv:(?P<ver>\d+\.\d+\.\d+)(?=\s)"
)
_DIGEST_FROM_RE = re.compile(
    r"(?im)^(?P<head>\s*FROM\s+(?:--\S+\s+)*)(?P<ref>[^\s@]+:[^\s@/]+)@sha256:[0-9a-f]{64}(?=\s|$)"
)
_UV_PYVER_RE = re.compile(
    r"\b(?:uvx|uv)\b[^\n]*?(?:\s-p|\s--python)(?:\s+|=)(?:python)?(?P<ver>3\.\d+)\b"
)


def _uv_snippet(version: str | None, env: str | None) -> str:
    """POSIX sh that does what the uv installer does, from the Python package index."""
    pin = version or ""
    pre = f"export {env.strip()}; " if env else ""
    return (
        "{ " + pre + f'_sg_v="{pin}"; _sg_d="$(mktemp -d)"; '
        '_sg_bin="${UV_INSTALL_DIR:-${XDG_BIN_HOME:-$HOME/.local/bin}}"; '
        "_sg_url=\"$(curl -fsSL --retry 4 --retry-all-errors --retry-delay 2 https://pypi.org/simple/uv/ | grep -o 'https://files.pythonhosted"
        '.org/[^\\"#]*/uv-\'"${_sg_v:-[0-9.]*}"\'-py3-none-manylinux_2_17_x86_64[^\\"#]*\\.whl\''
        ' | tail -n 1)"; '
        'echo "sandgym-substitution uv-installer-from-pypi: $_sg_url" >&2; '
        'curl -fsSL --retry 4 --retry-all-errors --retry-delay 2 "$_sg_url" -o "$_sg_d/uv.whl" && '
        '{ python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])"'
        ' "$_sg_d/uv.whl" "$_sg_d" 2>/dev/null || unzip -q -o "$_sg_d/uv.whl" -d "$_sg_d" '
        # no python3, no unzip: Debian's unzip, tried three times (a mirror's passing refusal
        # must not cost the task its verifier), each failure said on stderr
        "|| { for _sg_i in 1 2 3; do apt-get install -y -qq unzip >&2 && break; "
        'echo "sandgym-substitution uv-installer-from-pypi: apt-get install unzip failed '
        '(try $_sg_i of 3)" >&2; sleep 2; apt-get update -qq >&2; done; '
        'unzip -q -o "$_sg_d/uv.whl" -d "$_sg_d"; }; } && '
        'mkdir -p "$_sg_bin" && cp "$_sg_d"/uv-*.data/scripts/uv "$_sg_d"/uv-*.data/scripts/uvx '
        '"$_sg_bin"/ && chmod 755 "$_sg_bin/uv" "$_sg_bin/uvx" && '
        'printf \'#!/bin/sh\\ncase ":${PATH}:" in *:"%s":*) ;; *) export PATH="%s:$PATH" ;; '
        'esac\\n\' "$_sg_bin" "$_sg_bin" > "$_sg_bin/env"; rm -rf "$_sg_d"; }'
    )


def _python_snippet(ver: str, debs: list[str] | None) -> str:
    """POSIX sh: no CPython downloads by uv; a Debian CPython `ver` where the image has none."""
    exe = f"python{ver}"
    if not debs:
        return (
            "export UV_PYTHON_DOWNLOADS=never; "
            f"command -v {exe} >/dev/null 2>&1 || echo 'sandgym-substitution: no Debian release "
            f"ships CPython {ver}; uv would download it from github.com (unreachable here)' >&2"
        )
    root = f"/opt/sandgym-cpython-{ver}"
    lib = f"{root}/usr/lib/x86_64-linux-gnu"
    urls = " ".join(f"{DEBIAN_MIRROR}/{d}" for d in debs)
    return (
        "export UV_PYTHON_DOWNLOADS=never; "
        f"command -v {exe} >/dev/null 2>&1 || {{ "
        f"echo 'sandgym-substitution uv-python-from-debian: Debian CPython {ver} into {root}' >&2; "
        f'_sg_t="$(mktemp -d)"; for _sg_u in {urls}; do '
        f'curl -fsSL --retry 4 --retry-all-errors --retry-delay 2 "$_sg_u" -o "$_sg_t/p.deb" && dpkg-deb -x "$_sg_t/p.deb" {root} || break; '
        f'done; rm -rf "$_sg_t"; '
        f"mv {root}/usr/bin/{exe} {root}/usr/bin/{exe}.real && "
        f"printf '#!/bin/sh\\nexec {lib}/ld-linux-x86-64.so.2 --library-path {lib} "
        f'--argv0 "$0" {root}/usr/bin/{exe}.real "$@"\\n\' > {root}/usr/bin/{exe} && '
        f"chmod 755 {root}/usr/bin/{exe} && mkdir -p /usr/local/bin && "
        # not a symlink: started as /usr/local/bin/pythonX.Y, CPython would look for its
        # library under /usr/local; the wrapper must see itself under its own root
        f"printf '#!/bin/sh\\nexec {root}/usr/bin/{exe} \"$@\"\\n' > /usr/local/bin/{exe} && "
        f"chmod 755 /usr/local/bin/{exe}; }}"
    )


def debian_cpython_debs(ver: str, cache_dir: Path) -> list[str] | None:
    """The pool paths (on the Debian mirror) of `DEBIAN_CPYTHON[ver]`'s packages, read from
    the release's package index (fetched once into `cache_dir`); None where no release ships
    `ver` or the index cannot be read."""
    import lzma
    import urllib.request

    if ver not in DEBIAN_CPYTHON:
        return None
    suite, names = DEBIAN_CPYTHON[ver]
    cache = cache_dir / f"Packages-{suite}-amd64"
    if not cache.exists():
        url = f"{DEBIAN_MIRROR}/dists/{suite}/main/binary-amd64/Packages.xz"
        try:
            with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 (fixed http mirror)
                data = lzma.decompress(r.read())
        except OSError:
            return None
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(data)
    pool: dict[str, str] = {}
    pkg = None
    for line in cache.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("Package: "):
            pkg = line[9:].strip()
        elif line.startswith("Filename: ") and pkg is not None:
            pool[pkg] = line[10:].strip()
    try:
        return [pool[n] for n in names]
    except KeyError:
        return None


def rewrite_script(
    text: str,
    is_dockerfile: bool = False,
    cpython_debs: dict[str, list[str] | None] | None = None,
    context: Path | None = None,
) -> tuple[str, list[dict[str, str]]]:
    """`text` with every substitutable fetch replaced, and one record per replacement.
    `cpython_debs` maps a CPython version to the Debian packages that provide it (see
    `debian_cpython_debs`); a version it lacks gets only `UV_PYTHON_DOWNLOADS=never`."""
    debs = cpython_debs or {}
    records: list[dict[str, str]] = []
    pyvers = script_python_versions(text)

    def uv(m: re.Match[str]) -> str:
        records.append({"name": "uv-installer-from-pypi", "original": m.group(0)})
        snippet = _uv_snippet(m.group("ver"), m.group("env"))
        if pyvers and not is_dockerfile:
            for v in pyvers:
                records.append(
                    {
                        "name": "uv-python-from-debian",
                        "original": f"uv's download of CPython {v} (github.com)",
                    }
                )
            snippet += "; " + "; ".join(_python_snippet(v, debs.get(v)) for v in pyvers)
        return snippet

    def uv_image(m: re.Match[str]) -> str:
        ver = m.group("ver")
        records.append(
            {"name": "uv-image-from-pypi", "original": m.group(0).strip(), "version": ver}
        )
        return f"{m.group('head')}{UV_IMAGE_REPO}:{ver}"

    def digest_from(m: re.Match[str]) -> str:
        from lab.images import standin_for

        if standin_for(m.group("ref")) is None:
            return m.group(0)  # no stand-in: the build says the image is unavailable
        records.append({"name": "digest-pinned-base-to-stand-in", "original": m.group(0).strip()})
        return f"{m.group('head')}{m.group('ref')}"

    new = _UV_INSTALLER_RE.sub(uv, text)
    if is_dockerfile:
        new = _DIGEST_FROM_RE.sub(digest_from, new)
        new = _UV_IMAGE_RE.sub(uv_image, new)
        new = _NOTO_FONT_RE.sub(lambda m: _noto_font(m, records), new)
        new = _uv_python_in_run_steps(new, debs, context, records)
    return new, records


#: a font fetched from the Noto project's site (notofonts.github.io), written to a file
_NOTO_FONT_RE = re.compile(
    r"(?:curl|wget)\b[^\n|;&]*?https?://notofonts\.github\.io/\S*/(?P<font>Noto[A-Za-z0-9-]+\.ttf)"
    r"[^\n|;&>]*?(?:>\s*|\s-o\s+|\s-O\s+)(?P<dest>[^\s;&|]+)"
)
NOTO_DEB = "fonts-noto-core"


def _noto_font(m: re.Match[str], records: list[dict[str, str]]) -> str:
    """The same font file from Debian's `fonts-noto-core` package (Debian's mirror)."""
    font, dest = m.group("font"), m.group("dest")
    records.append({"name": "noto-font-from-debian", "original": m.group(0), "font": font})
    return (
        '{ _sg_d="$(mktemp -d)" && '
        f'{{ (cd "$_sg_d" && apt-get download {NOTO_DEB}) || '
        f'{{ apt-get update -qq && (cd "$_sg_d" && apt-get download {NOTO_DEB}); }}; }} && '
        f'echo "sandgym-substitution noto-font-from-debian: {font} from {NOTO_DEB}" >&2 && '
        f'dpkg-deb --fsys-tarfile "$_sg_d"/{NOTO_DEB}_*.deb | '
        f"tar -xO ./usr/share/fonts/truetype/noto/{font} > {dest} && "
        f'test -s {dest} && rm -rf "$_sg_d"; }}'
    )


_RUN_UV_RE = re.compile(r"(?im)^(?P<head>\s*RUN\s+)(?P<cmd>.*\buv(?:x|\s+run)\b.*)$")
_UV_RUN_SCRIPT_RE = re.compile(r"\buv\s+run\s+(?:--\S+\s+)*(?P<path>\S+\.py)\b")
_REQUIRES_PYTHON_RE = re.compile(r"(?m)^#\s*requires-python\s*=\s*[\"']>=\s*(3\.\d+)")


def _uv_python_in_run_steps(
    text: str,
    debs: dict[str, list[str] | None],
    context: Path | None,
    records: list[dict[str, str]],
) -> str:
    """A Dockerfile `RUN uv run script.py` / `RUN uvx -p 3.X ...` whose CPython uv would
    download from github.com: the step first gets the `uv-python-from-debian` interpreter (the
    version from `-p`/`--python`, or from the script's inline `requires-python`, read from the
    build context)."""

    def one(m: re.Match[str]) -> str:
        cmd = m.group("cmd")
        vers = script_python_versions(cmd)
        script = _UV_RUN_SCRIPT_RE.search(cmd)
        if not vers and script is not None and context is not None:
            name = Path(script.group("path")).name
            for f in sorted(context.rglob(name)):
                try:
                    head = f.read_text(encoding="utf-8")[:4000]
                except (OSError, UnicodeDecodeError):
                    continue
                found = _REQUIRES_PYTHON_RE.search(head)
                if found:
                    vers = [found.group(1)]
                    break
        if not vers:
            return m.group(0)
        for v in vers:
            records.append(
                {
                    "name": "uv-python-from-debian",
                    "original": f"uv's download of CPython {v} (github.com) in `{cmd.strip()}`",
                }
            )
        curl = (
            "{ command -v curl >/dev/null 2>&1 || { apt-get update -qq && "
            "apt-get install -y -qq curl >/dev/null; }; }"
        )
        pre = "; ".join(_python_snippet(v, debs.get(v)) for v in vers)
        return f"{m.group('head')}{curl}; {pre}; {cmd}"

    return _RUN_UV_RE.sub(one, text)


def ensure_uv_image(version: str, work_dir: Path) -> str:
    """`sandgym/subst-uv:<version>` in the local engine (built once): FROM scratch, /uv and /uvx
    from the uv wheel of `version` on the Python package index. Returns the tag."""
    import subprocess
    import sys
    import zipfile

    tag = f"{UV_IMAGE_REPO}:{version}"
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    ctx = Path(work_dir) / f"subst-uv-{version}"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "wheel").mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--platform", "manylinux_2_17_x86_64", "--python-version", "3.11",
         "-d", str(ctx / "wheel"), f"uv=={version}"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = (ctx / "wheel").glob("uv-*.whl")
    with zipfile.ZipFile(wheel) as z:
        for name in ("uv", "uvx"):
            (member,) = [n for n in z.namelist() if n.endswith(f".data/scripts/{name}")]
            (ctx / name).write_bytes(z.read(member))
            (ctx / name).chmod(0o755)
    (ctx / "Dockerfile").write_text(
        "FROM scratch\nLABEL sandgym.substitution=uv-image-from-pypi\nCOPY uv uvx /\n"
    )
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True, timeout=600
    )
    return tag


def script_python_versions(text: str) -> list[str]:
    """The CPython versions a script asks uv for (`uvx -p 3.13`, `--python 3.12`)."""
    return sorted(set(_UV_PYVER_RE.findall(text.replace("\\\n", " "))))


_RUN_LINE_RE = re.compile(r"^\s*RUN\b(.*)$", re.MULTILINE | re.IGNORECASE)


def dockerfile_run_scripts(task: Path) -> list[str]:
    """The shell scripts of a task's build context that its Dockerfile runs (a `RUN` line
    naming the script's file name, as Terminal-Bench 1's path-tracing-reverse does with `COPY
    install.sh /app` then `RUN bash /app/install.sh`): scripts of the task too, relative to
    `task`. Only the build context's top level, where such scripts are copied from."""
    out: list[str] = []
    for docker in ("Dockerfile", "environment/Dockerfile"):
        f = task / docker
        if not f.is_file():
            continue
        runs = " ".join(m.group(1) for m in _RUN_LINE_RE.finditer(f.read_text(encoding="utf-8")))
        for script in sorted(f.parent.glob("*.sh")):
            if script.is_file() and re.search(rf"(?<![\w.-]){re.escape(script.name)}\b", runs):
                out.append(str(script.relative_to(task)))
    return out


def prepare_task_copy(
    src: Path, dst: Path, cpython_debs: dict[str, list[str] | None] | None = None
) -> list[dict[str, str]]:
    """Copy task directory `src` to `dst` (replacing it) and apply the substitutions to its
    scripts (`SCRIPT_FILES`, Terminal-Bench 1's harness scripts under tests/, and the build
    context's scripts its Dockerfile runs); the records name the file each one was made in. With no substitution to make,
    `dst` is still a faithful copy (the caller may as well use `src`)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)
    records: list[dict[str, str]] = []
    # Terminal-Bench 1's harness scripts (setup-uv-pytest.sh, run-uv-pytest.sh), which its
    # run-tests.sh sources from $TEST_DIR, are scripts of the task too
    harness = (
        sorted(str(p.relative_to(dst)) for p in (dst / "tests").glob("*.sh") if p.is_file())
        if (dst / "tests").is_dir()
        else []
    )
    for rel in dict.fromkeys([*SCRIPT_FILES, *harness, *dockerfile_run_scripts(dst)]):
        f = dst / rel
        if not f.is_file() or f.is_symlink():
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new, recs = rewrite_script(
            text, is_dockerfile=f.name == "Dockerfile", cpython_debs=cpython_debs, context=f.parent
        )
        if recs:
            mode = f.stat().st_mode
            f.write_text(new, encoding="utf-8")
            f.chmod(mode)
            records.extend({**r, "file": rel} for r in recs)
    return records


_URL_HOST_RE = re.compile(r"https?://([A-Za-z0-9.-]+\.[A-Za-z]{2,})")
_HOST_WORD_RE = re.compile(
    r"\b((?:[a-z0-9-]+\.)*(?:github\.com|githubusercontent\.com|huggingface\.co|hf\.co|"
    r"astral\.sh|docker\.io|ghcr\.io|gitlab\.com|googleapis\.com|amazonaws\.com))\b"
)


#: a host quoted in a client library's error (urllib3: `host='x.org'`, `Failed to resolve 'x.org'`)
_QUOTED_HOST_RE = re.compile(r"(?:host=|Failed to resolve )'([A-Za-z0-9.-]+\.[A-Za-z]{2,})'")


#: a host a command-line tool names when its lookup fails (curl: `Could not resolve host: x`;
#: wget: `Resolving x (x)... failed`, `unable to resolve host address 'x'`; apt: `Temporary
#: failure resolving 'x'`, `Could not resolve 'x'`)
_TOOL_HOST_RE = re.compile(
    r"Could not resolve host: ([A-Za-z0-9.-]+\.[A-Za-z]{2,})|"
    r"Resolving ([A-Za-z0-9.-]+\.[A-Za-z]{2,}) \([^)]*\)\.\.\. failed|"
    r"unable to resolve host address [‘'`\"]([A-Za-z0-9.-]+\.[A-Za-z]{2,})|"
    r"(?:Temporary failure resolving|Could not resolve) '([A-Za-z0-9.-]+\.[A-Za-z]{2,})'"
)


def unreachable_hosts(text: str) -> list[str]:
    """Hosts named in `text` (URLs, well-known hosts named in messages, hosts a client
    library's error quotes, hosts a tool's failed lookup names) that this machine cannot
    reach, sorted."""
    hosts = (
        set(_URL_HOST_RE.findall(text))
        | set(_HOST_WORD_RE.findall(text))
        | set(_QUOTED_HOST_RE.findall(text))
        | {h for groups in _TOOL_HOST_RE.findall(text) for h in groups if h}
    )
    out = set()
    for h in hosts:
        h = h.lower().rstrip(".")
        if h in REACHABLE_HOSTS or h.endswith(".debian.org") or "example" in h:
            continue
        out.add(h)
    return sorted(out)


#: a call that fetches from the Hugging Face Hub by repository id ("org/name"), no URL written
_HF_CALL_RE = re.compile(
    r"\b(?:from_pretrained|load_dataset|hf_hub_download|snapshot_download)\(\s*"
    r"(?:repo_id\s*=\s*)?[\"'][A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+[\"']"
)
#: the same call given a variable (`from_pretrained(model_name)`), and that variable's assignment
#: of a repository id in the same script (`model_name = 'distilbert-base-uncased-...'`, the
#: Hub's older ids have no "org/"); a path (`/app/model`, `./m`) is no id
_HF_CALL_VAR_RE = re.compile(
    r"\b(?:from_pretrained|load_dataset|hf_hub_download|snapshot_download)\(\s*"
    r"(?:repo_id\s*=\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*[,)]"
)
_HF_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_.-]+)?"


def _hf_var_call(text: str) -> bool:
    for var in set(_HF_CALL_VAR_RE.findall(text)):
        if re.search(rf"^\s*{re.escape(var)}\s*=\s*[\"']{_HF_ID}[\"']\s*$", text, re.MULTILINE):
            return True
    return False


#: an S3 object a script copies with the AWS CLI (`aws s3 cp s3://bucket/key ...`)
_S3_CP_RE = re.compile(r"\baws\s+s3\s+(?:cp|sync|ls)\b[^\n]*?\bs3://([a-z0-9][a-z0-9.-]+)")


def implicit_hosts(text: str) -> list[str]:
    """Hosts a script fetches from without writing them: the Hugging Face Hub
    (`from_pretrained("org/name")`, `load_dataset("org/name")`, ..., or such a call given a
    variable the script sets to a repository id: huggingface.co) and an
    S3 bucket the AWS CLI copies from (`aws s3 cp s3://bucket/...`: bucket.s3.amazonaws.com,
    the address the CLI reports when it cannot connect)."""
    hosts = {f"{b}.s3.amazonaws.com" for b in _S3_CP_RE.findall(text)}
    if _HF_CALL_RE.search(text) or _hf_var_call(text):
        hosts.add("huggingface.co")
    return sorted(hosts)


def referenced_unreachable_hosts(task_dir: Path) -> dict[str, list[str]]:
    """Static scan: file (relative) -> unreachable hosts its text names. Only a hint: naming a
    host is not needing it; the report's reasons come from what actually failed."""
    found: dict[str, list[str]] = {}
    for f in sorted(task_dir.rglob("*")):
        if not f.is_file() or f.is_symlink() or f.stat().st_size > 512_000:
            continue
        if f.suffix not in {"", ".sh", ".py", ".toml", ".yaml", ".yml", ".txt", ".md", ".cfg"}:
            if f.name != "Dockerfile":
                continue
        if f.name == "instruction.md":
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        hosts = sorted({*(h for h in unreachable_hosts(text) if "." in h), *implicit_hosts(text)})
        if hosts:
            found[str(f.relative_to(task_dir))] = hosts
    return found


def describe() -> dict[str, Any]:
    return {"substitutions": SUBSTITUTIONS, "reachable_hosts": list(REACHABLE_HOSTS)}
