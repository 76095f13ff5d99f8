"""Verifier checks for git-init-commit: exit 0 when the task is solved, 10 (with the reason) when it is not.

Convention (tasks/catalog/README.md): exit 0 = solved; exit FAIL (10) = not solved, with the
reason. Any other exit (a traceback here, a missing secret) means this checker could not run, and
tests/test.sh then writes no reward: a verifier_error, not the agent's failure. So whatever the
agent left (a missing file, a FIFO, a directory, a program that hangs or crashes) must end in
fail(), through the helpers below, never in an exception.
"""
import json
import os
import stat as _stat
import subprocess
import sys

FAIL = 10
MAX_READ = 50_000_000


def fail(msg):
    print("FAIL:", msg)
    sys.exit(FAIL)


def read(path):
    """The text of a regular file the agent left. Opened without blocking: a FIFO (which would
    hang the checker until its timeout), a device or a directory is the agent's failure."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        fail(f"{path} does not exist")
    except OSError as exc:
        fail(f"cannot open {path}: {exc}")
    if not _stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        fail(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_READ + 1)
        except OSError as exc:
            fail(f"cannot read {path}: {exc}")
    if len(data) > MAX_READ:
        fail(f"{path} is larger than {MAX_READ} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"{path} is not UTF-8 text: {exc}")


def stat(path):
    """os.stat of something the agent should have left; its absence is the agent's failure."""
    try:
        return os.stat(path)
    except OSError as exc:
        fail(f"cannot stat {path}: {exc}")


def listdir(path):
    try:
        return os.listdir(path)
    except OSError as exc:
        fail(f"cannot list {path}: {exc}")


def run_agent(argv, timeout=20, **kw):
    """Run a program the agent wrote: a hang, or a program that cannot start, is its failure."""
    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            **kw,
        )
    except subprocess.TimeoutExpired:
        fail(f"{' '.join(map(str, argv))} did not finish within {timeout} s")
    except OSError as exc:
        fail(f"cannot run {argv[0]}: {exc}")


def secret():
    """The episode's secret (copied in by the verifier): missing means the checker cannot run."""
    with open("/tests/secret/expected", encoding="utf-8") as f:
        return f.read()


def git(*args):
    r = subprocess.run(["git", "-C", "/app/project", *args], capture_output=True, text=True)
    return r.returncode, r.stdout.strip()
code, log = git("log", "--format=%s", "main")
if code != 0 or log.splitlines() != ["initial commit"]:
    fail(f"expected one commit 'initial commit' on main, found {log!r}")
_, files = git("ls-tree", "-r", "--name-only", "main")
files = set(files.splitlines())
want = {".gitignore", "README.md", "main.py", "lib/util.py"}
if files != want:
    fail(f"expected committed files {sorted(want)}, found {sorted(files)}")
code, out = git("status", "--porcelain", "--ignored")
if any(not l.startswith("!!") for l in out.splitlines()):
    fail(f"working tree not clean: {out}")
if "build/" not in out:
    fail("build/ is not ignored")

print("PASS")
