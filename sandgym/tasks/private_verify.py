"""The verifier in a private mount namespace, out of reach of anything the agent left running.

The agent acts as root of its sandbox and may leave processes behind (a service a task asks
for, or a loop that keeps writing `1` into /logs/verifier/reward.txt). When the backend can
(`Sandbox.supports_private_exec`: the local backend), the verifier runs like this:

1. the server sends, on the verifier's stdin, a random nonce line and a tar of the tests (and
   the episode's secret files): they never pass through the agent's file system;
2. inside a new mount namespace the wrapper mounts a fresh tmpfs over /tests and over
   /logs/verifier (fixed mount points the agent cannot remove or rename), unpacks the tests and
   runs the test script there, its stderr merged into its stdout;
3. after the script the wrapper prints, on its own stderr, a block framed by the nonce with the
   reward files (and pytest's JUnit report, `JUNIT_FILE`, which the runtime asks pytest to write
   there for Terminal-Bench and SETA tasks, and the CTRF report Harbor's test scripts write,
   `CTRF_FILE`, read only to name failing tests) base64-encoded, read from its private
   /logs/verifier.

On the docker backend the wrapper runs instead in a container of its own, started from a
snapshot of the sandbox (`DockerSandbox.exec_private`), sharing the sandbox's network and
process namespaces but not its files, so step 2 needs no mounts; the backend sets
`SANDGYM_VERIFIER_OWN_CONTAINER=1`
(`OWN_CONTAINER_ENV`, from sandgym/sandboxes/private_exec.py: the task layer names no backend) and the
wrapper just replaces /tests and /logs/verifier by fresh, empty directories.

A process the agent started sees its own, empty /tests and /logs/verifier: what it writes there
is never read. It sees the verifier's processes (the tests may look for the agent's), but lacks
a capability they hold (local: it holds none; docker: not `CAP_SYS_PTRACE`), so it can neither
join the verifier's namespace nor reach the verifier's files, descriptors or memory through
/proc/PID; killing the verifier gives no reward block, hence a verifier error. What this does
not stop: code of the agent's that the tests run themselves (it runs as the verifier), and, on
backends without a private exec (e2b), anything at all; see sandgym/tasks/verifier/run.py.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import secrets
import tarfile
from dataclasses import dataclass
from pathlib import Path

from sandgym.sandboxes.private_exec import OWN_CONTAINER_ENV
from sandgym.tasks.errors import VerifierError

log = logging.getLogger(__name__)

#: exit codes of the wrapper's own failures (before the test script ran)
NO_PAYLOAD, SETUP_FAILED = 97, 98
MAX_REWARD_FILE_BYTES = 1_000_000
#: pytest's JUnit report, written by pytest itself into the private /logs/verifier
JUNIT_FILE = "sandgym-pytest-junit.xml"
#: the files that score, reported up to MAX_REWARD_FILE_BYTES each
SCORED_FILES = ("reward.txt", "reward.json", JUNIT_FILE)
#: the CTRF report Harbor's test scripts write (`pytest --ctrf /logs/verifier/ctrf.json`); it
#: names failing tests and never scores (sandgym/tasks/verifier/ctrf.py), so it is reported only when
#: it is at most CTRF_MAX_BYTES: a larger one (long tracebacks) is left out whole, never cut
#: into invalid JSON or allowed to push the report past the backend's stderr cap
CTRF_FILE = "ctrf.json"
CTRF_MAX_BYTES = 256 * 1024
REPORTED_FILES = (*SCORED_FILES, CTRF_FILE)

#: the wrapper (its @NAME@s, the backend's variable and the reported files, are filled in below)
WRAPPER = r"""
IFS= read -r nonce || { echo "sandgym: expected a nonce line on stdin, got nothing" >&2; exit 97; }
if [ "${@OWN_CONTAINER_ENV@:-}" = 1 ]; then
  unset @OWN_CONTAINER_ENV@
  rm -rf /tests /logs/verifier; [ -d /logs ] || rm -f /logs
  mkdir -p /tests /logs/verifier && chmod 0755 /tests && chmod 0777 /logs/verifier || exit 98
else
  mount -t tmpfs -o mode=0755 sandgym-tests /tests || exit 98
  mount -t tmpfs -o mode=0777 sandgym-verifier /logs/verifier || exit 98
fi
tar -x -o -C /tests -f - || { echo "sandgym: the tests did not unpack" >&2; exit 98; }
exec 3>&2 2>&1
"$@" 3>&-
rc=$?
{
  printf '\n%s begin\n' "$nonce"
  for f in @SCORED_FILES@; do
    if [ -f "/logs/verifier/$f" ]; then
      printf '%s ' "$f"; head -c @MAX_BYTES@ "/logs/verifier/$f" | base64 -w0; printf '\n'
    fi
  done
  f=/logs/verifier/@CTRF_FILE@
  if [ -f "$f" ] && [ "$(($(wc -c < "$f")))" -le @CTRF_MAX_BYTES@ ]; then
    printf '%s ' @CTRF_FILE@; base64 -w0 < "$f"; printf '\n'
  fi
  printf '%s end %s\n' "$nonce" "$rc"
} >&3
exit "$rc"
"""
for _name, _value in {
    "OWN_CONTAINER_ENV": OWN_CONTAINER_ENV,
    "SCORED_FILES": " ".join(SCORED_FILES),
    "MAX_BYTES": str(MAX_REWARD_FILE_BYTES),
    "CTRF_FILE": CTRF_FILE,
    "CTRF_MAX_BYTES": str(CTRF_MAX_BYTES),
}.items():
    WRAPPER = WRAPPER.replace(f"@{_name}@", _value)


@dataclass
class PrivateRun:
    """What the wrapper reported: the test script's exit code and the reward files it wrote."""

    exit_code: int
    files: dict[str, str]


def build_payload(
    nonce: str,
    tests_dir: Path | None,
    extra_files: dict[str, tuple[bytes, int]],
) -> bytes:
    """The verifier's stdin: the nonce line, then a tar of `tests_dir`'s contents plus
    `extra_files` (path inside /tests -> (content, mode)). Symlinks are followed only when
    they stay inside `tests_dir`; others are skipped (a task directory cannot smuggle host
    files into the sandbox)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if tests_dir is not None and tests_dir.is_dir():
            root = os.path.realpath(tests_dir)
            for dirpath, dirnames, filenames in os.walk(tests_dir):
                dirnames.sort()
                for name in sorted(dirnames) + sorted(filenames):
                    path = os.path.join(dirpath, name)
                    real = os.path.realpath(path)
                    if real != root and not real.startswith(root + os.sep):
                        log.warning("verifier: %s points outside the tests; not copied", path)
                        continue
                    arc = os.path.relpath(path, tests_dir)
                    if os.path.isdir(real):
                        if name in dirnames:
                            tar.add(real, arcname=arc, recursive=False)
                    elif os.path.isfile(real):
                        tar.add(real, arcname=arc, recursive=False)
        for rel, (data, mode) in sorted(extra_files.items()):
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return nonce.encode() + b"\n" + buf.getvalue()


def new_nonce() -> str:
    return "sandgym-verifier-" + secrets.token_hex(16)


def parse_report(stderr: str, nonce: str, output: str) -> PrivateRun:
    """Find the nonce-framed block in the wrapper's stderr (the last one wins)."""
    begin = stderr.rfind(f"{nonce} begin\n")
    end = stderr.find(f"{nonce} end ", begin) if begin >= 0 else -1
    if begin < 0 or end < 0:
        raise VerifierError(
            "the verifier ended without its report (expected a block framed by its nonce on "
            "stderr; was the verifier killed?)",
            output + ("\n" + stderr if stderr else ""),
        )
    body = stderr[begin + len(nonce) + len(" begin\n") : end]
    tail = stderr[end + len(nonce) + len(" end ") :].split("\n", 1)[0].strip()
    files: dict[str, str] = {}
    for line in body.splitlines():
        if not line.strip():
            continue
        name, _, b64 = line.partition(" ")
        if name not in REPORTED_FILES:
            raise VerifierError(f"verifier report names an unexpected file {name!r}", output)
        try:
            files[name] = base64.b64decode(b64, validate=True).decode("utf-8", "replace")
        except ValueError as exc:
            raise VerifierError(
                f"verifier report: {name} is not valid base64: {exc}", output
            ) from None
    try:
        code = int(tail)
    except ValueError:
        raise VerifierError(
            f"verifier report ends with {tail!r}, not an exit code", output
        ) from None
    return PrivateRun(exit_code=code, files=files)


def wrapper_argv(script_argv: list[str]) -> list[str]:
    """argv running `script_argv` under the wrapper (the local backend adds `unshare -m`; the
    docker backend runs it in a container of its own with `OWN_CONTAINER_ENV` set)."""
    return ["sh", "-c", WRAPPER, "sandgym-verifier", *script_argv]
