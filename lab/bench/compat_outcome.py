"""The one outcome of a task checked by `sandgym bench harbor_compat`, decided when it runs.

Each checked task falls into one category of the per-set table, with one reason a maintainer can
act on, and (where the task leaves the denominator of the reachable figures) the evidence that
was seen at run time:

- `clean`: the oracle scored 1.0 (where one is shipped) and the no-op 0.0, no error;
- `failing`: it fell short here and nothing recorded shows a cause outside sandgym. This
  includes bit-rot: a pinned package version that the reachable registry itself no longer has
  fails the same way with full internet, so it is a failure, never an exclusion; and tests
  that look for the agent's processes (`pgrep`, psutil), which sandgym's private verifier does
  not see (by design: the action says so);
- `unreachable_host`: a host unreachable from here, with positive evidence: an output line of
  the failing phase that reports a failed fetch names the host, AND one of that phase's own
  task files (the build's Dockerfile and context, the solution, the tests) names that host too,
  not counting a name a listed substitution replaced there. A lookup that names no host, or a
  host only some other phase's files name, is not evidence: such a task stays `failing`. A
  base image no registry here serves and no stand-in replaces counts too (the Dockerfile names
  it, the build's output says it is missing). So does a lookup seen at run time
  (`dns_evidence`, lines of a `--dns-log` run): the failing episode's sandbox looked the host up
  and got no address here, and that episode's output reports a failed lookup or fetch;
- `stand_in_limit`: the task needs the real image a local stand-in only approximates (the
  Ubuntu stand-ins are Debian: an Ubuntu-only package or version, Ubuntu's CPython, Ubuntu's
  python3-pip with the setuptools it depends on);
- `dataset_incomplete`: the public copy of the task lacks some of its files.

Lines written before this module existed have no `outcome`: the report keeps the reasons they
recorded when they ran (`recorded_category`), never classifies them again with these rules, and
says which code commit classified every line (`classified_by`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandgym.tasks.check import CheckError

Category = Literal["clean", "failing", "unreachable_host", "stand_in_limit", "dataset_incomplete"]
Phase = Literal["build", "oracle", "verifier"]

#: the table's columns, in order, and what each means (the document carries this)
CATEGORIES: dict[str, str] = {
    "clean": "oracle 1.0 (where a solution is shipped) and no-op 0.0, without an error",
    "failing": "fell short in sandgym with no recorded cause outside it (bit-rot, and tests "
    "looking for the agent's processes, included)",
    "unreachable_host": "a failed fetch in the failing phase names a host that phase's own "
    "files fetch, and that host is unreachable here; or (a --dns-log run) the failing "
    "episode's sandbox looked up a host that got no address here and its output reports a "
    "failed lookup or fetch",
    "stand_in_limit": "needs the real image a local stand-in only approximates (e.g. a real "
    "Ubuntu image: the Ubuntu stand-ins are Debian)",
    "dataset_incomplete": "the public copy of the task lacks some of its files",
}
#: categories that leave the denominator of the reachable figures
NOT_REACHABLE: tuple[str, ...] = ("unreachable_host", "stand_in_limit", "dataset_incomplete")
#: the reason code each excluding category puts first in a line's `reasons`
CATEGORY_REASON = {
    "unreachable_host": "needs_unreachable_host",
    "stand_in_limit": "stand_in_limit",
    "dataset_incomplete": "dataset_incomplete",
}


class Evidence(BaseModel):
    """What was seen at run time that puts a task outside the reachable figures."""

    model_config = ConfigDict(frozen=True)

    needs: str = Field(description="the host (or real image) the task needs")
    phase: Phase = Field(description="the phase that failed")
    file: str = Field(description="the task file of that phase that names what it needs")
    output_line: str = Field(description="the failing output line (cut to 300 characters)")


class Outcome(BaseModel):
    """A task's category in the per-set table, its one actionable reason, and its evidence."""

    model_config = ConfigDict(frozen=True)

    category: Category
    reason: str = Field(description="the reason code (lab.bench.harbor_compat.REASONS)")
    action: str = Field(description="one sentence a maintainer can act on")
    evidence: Evidence | None = None


_ANSI_RE = re.compile(r"\x1b?\[[0-9;]*m")
#: a line that reports a failed fetch or lookup
FETCH_FAILED_RE = re.compile(
    r"Could not resolve|Temporary failure in name resolution|Temporary failure resolving|"
    r"Name or service not known|"
    r"Network is unreachable|Connection refused|Connection timed out|Failed to connect|"
    r"curl: \(\d+\)|unable to resolve host|Failed to establish a new connection|"
    r"ConnectTimeout|Max retries exceeded|failed: Temporary failure|Failed to fetch|"
    r"fatal: unable to access|couldn't connect to|Could not connect to|Failed to resolve|"
    r"Download_fail.*exited with code [67]\b|unable to access index for repository",
    re.IGNORECASE,
)
#: pip's retry line names only the path it asked for (`...Failed to establish a new connection:
#: [Errno -2] Name or service not known')': /whl/cpu/torch/`); its host is the one of the index
#: pip said it looks in (`Looking in indexes: https://download.pytorch.org/whl/cpu`) whose path
#: that path extends
_PIP_RETRY_PATH_RE = re.compile(r"Failed to establish a new connection.*': (/\S*)\s*$")
PIP_INDEX_RE = re.compile(r"Looking in indexes: (.+)$")
_FAILED_STEP_RE = re.compile(r"The command '(.*?)' returned a non-zero code", re.DOTALL)
_STEP_RE = re.compile(r"Step \d+/\d+ : (.*)")
_APT_VERSION_RE = re.compile(r"E: Version '([^']+)' for '([^']+)' was not found")
_APT_MISSING_RE = re.compile(
    r"E: Unable to locate package (\S+)|Package '?([^' ]+)'? has no installation candidate|"
    r"Depends: (\S+) but it is not installable"
)
_NO_PYTHON_RE = re.compile(r"No interpreter found for Python (\d+\.\d+)")
#: pip running a package's setup.py where `setuptools` is only a namespace package: on the
#: Ubuntu 24.04 stand-in (Debian trixie) `apt install python3-pip` brings no python3-setuptools
#: (Debian dropped that dependency in pip 24.0+dfsg-2; Ubuntu 24.04's 24.0+dfsg-1ubuntu1 keeps
#: it), while python3-pkg-resources leaves a bare `setuptools/_vendor` directory, so pip takes
#: the legacy `setup.py egg_info` path and `import setuptools` finds no `setup`
_NO_SETUPTOOLS_RE = re.compile(r"AttributeError: module 'setuptools' has no attribute 'setup'")
#: the Ubuntu releases whose python3-pip depends on python3-setuptools while the Debian release
#: of their stand-in does not
UBUNTU_PIP_SETUPTOOLS = ("24.04",)
#: what each Ubuntu release ships that its Debian stand-in lacks (named in the action)
UBUNTU_PYTHON = {"24.04": "3.12", "22.04": "3.10"}
_UBUNTU_BASE_RE = re.compile(
    r"^(?:ubuntu|ghcr\.io/laude-institute/t-bench/ubuntu)[:-](\d\d)[.-](\d\d)"
)
_DEBIAN_BASE_RE = re.compile(r"^debian:(?:1[123]|bookworm|trixie|bullseye)|^python:3\.\d+")


def _lines(value: Any) -> list[str]:
    if isinstance(value, list):
        text = "\n".join(str(v) for v in value)
    else:
        text = value or ""
    return _ANSI_RE.sub("", text).splitlines()


def phase_of_file(rel: str) -> Phase:
    """Which phase runs a task file: the solution's, the tests', or (the rest) the build's."""
    if rel.startswith("solution"):
        return "oracle"
    if rel.startswith("tests/") or rel == "run-tests.sh":
        return "verifier"
    return "build"


def phase_outputs(entry: Mapping[str, Any]) -> list[tuple[Phase, list[str]]]:
    """The recorded output lines of each phase of a check (typed `phase_errors` where the line
    has them; a verifier's error is the verifier's, a sandbox build's the build's)."""
    out: list[tuple[Phase, list[str]]] = [
        ("build", _lines(entry.get("build_error"))),
        ("oracle", _lines(entry.get("oracle_output")) + _lines(entry.get("oracle_network_lines"))),
        (
            "verifier",
            _lines(entry.get("oracle_verifier_output")) + _lines(entry.get("noop_verifier_output")),
        ),
    ]
    for pe in entry.get("phase_errors") or ():
        err = CheckError.model_validate(pe)
        phase: Phase = (
            "verifier"
            if err.error_type == "VerifierError"
            else "build"
            if err.error_type == "SandboxCreateError"
            else "oracle"
        )
        out.append((phase, _lines(err.message)))
    return out


def _phase_file_hosts(entry: Mapping[str, Any], phase: Phase) -> dict[str, list[str]]:
    """The unreachable hosts each task file of `phase` names, less those a listed substitution
    replaced in that very file."""
    from lab.bench.substitutions import unreachable_hosts

    replaced: dict[str, set[str]] = {}
    for sub in entry.get("substitutions") or ():
        replaced.setdefault(sub.get("file", ""), set()).update(
            unreachable_hosts(sub.get("original", ""))
        )
    out: dict[str, list[str]] = {}
    for rel, hosts in sorted((entry.get("referenced_unreachable_hosts") or {}).items()):
        if phase_of_file(rel) == phase:
            kept = [h for h in hosts if h not in replaced.get(rel, set())]
            if kept:
                out[rel] = kept
    return out


def host_evidence(entry: Mapping[str, Any]) -> Evidence | None:
    """The first failed fetch whose output line names a host that the failing phase's own
    files name (see the module docstring), or None."""
    from lab.bench.substitutions import unreachable_hosts

    for phase, lines in phase_outputs(entry):
        files = _phase_file_hosts(entry, phase)
        if not files:
            continue
        candidates = [ln for ln in lines if FETCH_FAILED_RE.search(ln)]
        if phase == "build":
            # a quiet download (wget -q, curl -s) prints nothing: the failed step is the line
            text = "\n".join(lines)
            failed = _FAILED_STEP_RE.search(text)
            steps = _STEP_RE.findall(text)
            if failed or steps:
                candidates.append(failed.group(1) if failed else steps[-1])
        for line in candidates:
            for host in unreachable_hosts(line):
                for rel, hosts in files.items():
                    if host in hosts:
                        return Evidence(
                            needs=host, phase=phase, file=rel, output_line=line.strip()[:300]
                        )
        ev = _pip_index_evidence(phase, lines, files)
        if ev is not None:
            return ev
    return None


def _pip_index_evidence(
    phase: Phase, lines: list[str], files: dict[str, list[str]]
) -> Evidence | None:
    """pip could not connect for a path under an index it named (`_PIP_RETRY_PATH_RE`): that
    index's host, where one of the phase's files names it."""
    from urllib.parse import urlsplit

    indexes: list[tuple[str, str]] = []  # (the "Looking in indexes" line, one index URL)
    for line in lines:
        m = PIP_INDEX_RE.search(line)
        if m:
            indexes += [(line.strip(), u.strip()) for u in m.group(1).split(",") if u.strip()]
    if not indexes:
        return None
    for line in lines:
        m = _PIP_RETRY_PATH_RE.search(line)
        if not m:
            continue
        for said, url in indexes:
            parts = urlsplit(url)
            if not parts.hostname or not m.group(1).startswith(parts.path.rstrip("/") + "/"):
                continue
            for rel, hosts in files.items():
                if parts.hostname in hosts:
                    return Evidence(
                        needs=parts.hostname,
                        phase=phase,
                        file=rel,
                        output_line=f"{said[:120]} ... {line.strip()[-170:]}",
                    )
    return None


_BASE_MISSING_RE = re.compile(
    r"pull access denied|manifest unknown|repository does not exist|failed to resolve "
    r"reference|not found: manifest|no such image|registry-1\.docker\.io",
    re.IGNORECASE,
)


def image_registry(image: str) -> str:
    """The registry host an image reference pulls from: its first path part when that names a
    host (has a dot and is followed by a path), else Docker Hub's."""
    first = image.split("/")[0]
    return first if "." in first and "/" in image else "registry-1.docker.io"


#: the classic builder's refusal of a `COPY --from=IMAGE` whose image it could not pull
_COPY_FROM_MISSING_RE = re.compile(r"invalid from flag value (\S+?):? Get \"https?://")


def _missing_image(image: str, which: str, file: str, line: str) -> Evidence:
    """A build-phase image no registry here serves: the evidence names its registry, then
    `which` image it is (its own words, e.g. `the base image X; no local stand-in`)."""
    return Evidence(
        needs=f"{image_registry(image)} ({which})",
        phase="build",
        file=file,
        output_line=line.strip()[:300],
    )


def base_image_evidence(entry: Mapping[str, Any], reason: str) -> Evidence | None:
    """The Dockerfile's FROM names an image that is not in the local engine, has no stand-in,
    and whose registry is unreachable; the build's output says so. Where the image the build
    could not pull is a `COPY --from=IMAGE` (the builder says `invalid from flag value IMAGE`),
    that image and its registry are the evidence, not the FROM image."""
    base = entry.get("base_image")
    if reason != "base_image_unavailable" or not base:
        return None
    for line in _lines(entry.get("build_error")):
        m = _COPY_FROM_MISSING_RE.search(line)
        if m:
            image = m.group(1)
            which = f"the image {image} of a COPY --from; no local copy"
            return _missing_image(image, which, "Dockerfile", line)
        if _BASE_MISSING_RE.search(line):
            which = f"the base image {base}; no local stand-in"
            return _missing_image(base, which, "Dockerfile", line)
    return None


#: the docker backend's SandboxCreateError (cause `image_missing`) for a compose service's image
_SERVICE_IMAGE_RE = re.compile(
    r"service '([^']+)': image '([^']+)' is not present in the local Docker engine"
)


def service_image_evidence(entry: Mapping[str, Any], reason: str) -> Evidence | None:
    """A compose service names an image (`image:`, no build) that the local engine lacks; no
    registry is used here, and the sandbox's creation failed on it (its typed error's cause
    `image_missing`, recorded as `service_image_unavailable`)."""
    if reason != "service_image_unavailable":
        return None
    for pe in entry.get("phase_errors") or ():
        err = CheckError.model_validate(pe)
        m = _SERVICE_IMAGE_RE.search(err.message) if err.cause == "image_missing" else None
        if m:
            image = m.group(2)
            which = f"the image {image} of service {m.group(1)!r}; no local copy"
            return _missing_image(image, which, "docker-compose.yaml", err.message)
    return None


def _first(
    lines_by_phase: list[tuple[Phase, list[str]]], rx: re.Pattern[str]
) -> tuple[Phase, str, re.Match[str]] | None:
    for phase, lines in lines_by_phase:
        for line in lines:
            m = rx.search(line)
            if m:
                return phase, line.strip()[:300], m
    return None


def stand_in_evidence(entry: Mapping[str, Any]) -> Evidence | None:
    """On an Ubuntu stand-in (Debian), a failure that only a real Ubuntu image avoids: a
    package or pinned version only Ubuntu's archive has, Ubuntu's own CPython, or the
    setuptools Ubuntu's python3-pip depends on (`_NO_SETUPTOOLS_RE`)."""
    base = entry.get("base_image") or ""
    m = _UBUNTU_BASE_RE.match(base)
    if not m:
        return None
    release = f"{m.group(1)}.{m.group(2)}"
    needs = f"a real Ubuntu {release} image ({base}); its stand-in is Debian"
    outputs = phase_outputs(entry)
    pkg = _first(outputs, _APT_VERSION_RE) or _first(outputs, _APT_MISSING_RE)
    if pkg is not None:
        phase, line, _ = pkg
        return Evidence(needs=needs, phase=phase, file=_phase_file(phase), output_line=line)
    py = _first(outputs, _NO_PYTHON_RE)
    if py is not None and UBUNTU_PYTHON.get(release) == py[2].group(1):
        phase, line, _ = py
        return Evidence(needs=needs, phase=phase, file=_phase_file(phase), output_line=line)
    tools = _first(outputs, _NO_SETUPTOOLS_RE)
    if tools is not None and release in UBUNTU_PIP_SETUPTOOLS:
        phase, line, _ = tools
        return Evidence(
            needs=f"a real Ubuntu {release} image ({base}), whose python3-pip brings "
            "python3-setuptools; its stand-in is Debian, whose python3-pip does not",
            phase=phase,
            file=_phase_file(phase),
            output_line=line,
        )
    return None


def _phase_file(phase: Phase) -> str:
    return {"build": "Dockerfile", "oracle": "solution", "verifier": "tests"}[phase]


def bit_rot(entry: Mapping[str, Any]) -> str | None:
    """A pinned apt version that the Debian mirror of the very release the task names no
    longer has: the action sentence, or None."""
    base = entry.get("base_image") or ""
    if not _DEBIAN_BASE_RE.match(base):
        return None
    hit = _first(phase_outputs(entry), _APT_VERSION_RE)
    if hit is None:
        return None
    _, _, m = hit
    return (
        f"bit-rot: the task pins {m.group(2)}={m.group(1)}, which the Debian mirror no longer "
        "has; it fails the same way with full internet (update the pin)"
    )


#: a name a sandbox might look up that is no internet host: a single label, a local domain, or
#: a service name (`_http._tcp.deb.debian.org`: apt asks for SRV records first, and a mirror
#: without them is still reached by its address)
_LOCAL_NAME_RE = re.compile(
    r"^[^.]+$|\.(local|localdomain|internal|lan|home\.arpa)$|(^|\.)_[^.]*\."
)


#: the phase of a `dns_unanswered` key (the no-op episode fails in its verifier)
_DNS_PHASE: dict[str, Phase] = {"build": "build", "oracle": "oracle", "noop": "verifier"}


def _episode_failed(entry: Mapping[str, Any], episode: str) -> bool:
    """The image build (`build`: it failed), or the oracle (`oracle`) or no-op (`noop`)
    episode of a line fell short: an error of that phase, or (oracle) a reward below 1.0."""
    if episode == "build":
        return bool(entry.get("build_error")) and not entry.get("env_builds")
    errs = [CheckError.model_validate(pe) for pe in entry.get("phase_errors") or ()]
    if any(e.phase.split(" ")[0] == episode for e in errs):
        return True
    reward = entry.get(f"{episode}_reward")
    return episode == "oracle" and reward is not None and reward != 1.0


def _episode_lines(entry: Mapping[str, Any], episode: str) -> list[str]:
    """Every recorded output line of one episode: the build's, or the solution's and the
    verifier's, and the messages of that phase's errors."""
    if episode == "build":
        return _lines(entry.get("build_error"))
    keys = (
        ("oracle_output", "oracle_network_lines", "oracle_verifier_output")
        if episode == "oracle"
        else ("noop_verifier_output",)
    )
    lines = [ln for k in keys for ln in _lines(entry.get(k))]
    for pe in entry.get("phase_errors") or ():
        err = CheckError.model_validate(pe)
        if err.phase.split(" ")[0] == episode:
            lines += _lines(err.message)
    return lines


def dns_evidence(entry: Mapping[str, Any]) -> Evidence | None:
    """Run-time evidence from a `--dns-log` line (lab/bench/dns_log.py): in a build that failed or
    an episode that fell short, the build or the sandbox looked up a host that got no address
    here (`dns_unanswered`), and that phase's recorded output has a line reporting a failed
    lookup or fetch. The host is the one
    that line names where it names one of them, else the first one looked up that the task's
    files fetch (`referenced_unreachable_hosts`), else the first one looked up. Service names
    (`_http._tcp.…`) and local names are no hosts. None otherwise (a lookup with no failure in
    the output, or a failure with no unanswered lookup)."""
    looked_up = entry.get("dns_unanswered") or {}
    for episode in ("build", "oracle", "noop"):
        names = [n for n in looked_up.get(episode) or () if not _LOCAL_NAME_RE.search(n)]
        if not names or not _episode_failed(entry, episode):
            continue
        failures = [ln for ln in _episode_lines(entry, episode) if FETCH_FAILED_RE.search(ln)]
        if not failures:
            continue
        named = [(n, ln) for ln in failures for n in names if n in ln.lower()]
        # no failure line names one: a looked-up host the task's own files fetch comes first
        refs = {
            h for hosts in (entry.get("referenced_unreachable_hosts") or {}).values() for h in hosts
        }
        fetched = [n for n in names if n in refs]
        host, line = named[0] if named else ((fetched or names)[0], failures[0])
        what = "image build" if episode == "build" else f"{episode} episode"
        return Evidence(
            needs=host,
            phase=_DNS_PHASE[episode],
            file=f"the DNS log of the {what}: {host} looked up, no address here",
            output_line=line.strip()[:300],
        )
    return None


def decide(entry: Mapping[str, Any], reasons: list[str]) -> Outcome:
    """The outcome of a line from what it recorded at run time and its failing `reasons`
    (lab.bench.harbor_compat.verdict, without any exclusion reason)."""
    failing = [r for r in reasons if r not in ("oracle_not_shipped",)]
    if not failing:
        return Outcome(category="clean", reason="clean", action="nothing to do")
    first = failing[0]
    if entry.get("absent_files"):
        files = ", ".join(entry["absent_files"][:3])
        return Outcome(
            category="dataset_incomplete",
            reason="dataset_incomplete",
            action=f"bring the files the public copy lacks ({files}) from the task's source",
        )
    if first not in ("infra", "task_timeout", "loader_error", "disk_full"):
        ev = stand_in_evidence(entry)
        if ev is not None:
            return Outcome(
                category="stand_in_limit",
                reason="stand_in_limit",
                action=f"needs {ev.needs}: run it where that image can be pulled",
                evidence=ev,
            )
        ev = (
            host_evidence(entry)
            or base_image_evidence(entry, first)
            or service_image_evidence(entry, first)
            or dns_evidence(entry)
        )
        if ev is not None:
            return Outcome(
                category="unreachable_host",
                reason="needs_unreachable_host",
                action=f"needs {ev.needs} ({ev.file}, {ev.phase}): run it with that host "
                "reachable, or add a substitution from a registry",
                evidence=ev,
            )
        rot = bit_rot(entry)
        if rot is not None:
            return Outcome(category="failing", reason=first, action=rot)
    return Outcome(category="failing", reason=first, action=failing_action(entry, first))


def failing_action(entry: Mapping[str, Any], reason: str) -> str:
    """One sentence for a failure in sandgym, from the line's typed fields."""
    if reason == "disk_full":
        return (
            "a write found no space (No space left on device): free space on the engine's disk "
            "(or raise the task's storage limit) and run the task again"
        )
    shortfall = entry.get("shortfall")
    if isinstance(shortfall, str) and shortfall:
        return shortfall
    if reason.startswith("build_"):
        return f"the image does not build ({reason}): {build_error_line(entry)[:200]}"
    return f"{reason}: see the task's recorded outputs"


def build_error_line(entry: Mapping[str, Any]) -> str:
    """The line of a failed build's log that says what failed: the last one naming an error,
    else the last line (the engine's own `Removing intermediate container` lines say nothing)."""
    lines = [
        ln.strip()
        for ln in _lines(entry.get("build_error"))
        if ln.strip() and not ln.strip().startswith("Removing intermediate container")
    ]
    errors = [ln for ln in lines if re.search(r"error|returned a non-zero code", ln, re.I)]
    return (errors or lines or ["?"])[-1]


#: what a line recorded before `outcome` existed says, by its own recorded reasons
def recorded_category(entry: Mapping[str, Any]) -> tuple[str, str]:
    """(category, reason) of a line from the `reasons` and `unreachable_hosts` it recorded when
    it ran: a line with an `outcome` keeps it; an older line is read as its code wrote it (its
    exclusion reasons were `needs_unreachable_host`/`base_image_unavailable`; where its first
    recorded host was the public copy's missing files, that is `dataset_incomplete`)."""
    outcome = entry.get("outcome")
    if isinstance(outcome, Mapping):
        return str(outcome["category"]), str(outcome["reason"])
    reasons = [r for r in entry.get("reasons") or [] if r != "oracle_not_shipped"]
    if not reasons:
        return "clean", "clean"
    if "needs_unreachable_host" in reasons or "base_image_unavailable" in reasons:
        hosts = entry.get("unreachable_hosts") or []
        if hosts and "files absent from the public copy" in str(hosts[0]):
            return "dataset_incomplete", "dataset_incomplete"
        return "unreachable_host", (
            "needs_unreachable_host"
            if "needs_unreachable_host" in reasons
            else "base_image_unavailable"
        )
    return "failing", reasons[0]


def classified_by(entry: Mapping[str, Any]) -> str:
    """The code commit that classified this line (recorded on it when it ran)."""
    return str(entry.get("code_commit") or "not recorded (first run, before per-line commits)")
