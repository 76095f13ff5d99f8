"""Verifier checks for serve-script: exit 0 when the task is solved, 10 (with the reason) when it is not.

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


import signal, time, urllib.request
port = 18000 + os.getpid() % 1000
try:
    os.remove("/app/server.pid")
except FileNotFoundError:
    pass
try:
    r = subprocess.run(["bash", "/app/start.sh"], env={**os.environ, "PORT": str(port)},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15)
except subprocess.TimeoutExpired:
    fail("start.sh did not return")
if r.returncode != 0:
    fail(f"start.sh exited {r.returncode}")
body = None
for _ in range(50):
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=2).read().decode()
        break
    except OSError:
        time.sleep(0.1)
try:
    pid = int(read("/app/server.pid").strip())
except ValueError:
    fail("server.pid does not hold a process id")
alive = os.path.exists(f"/proc/{pid}")
try:
    os.kill(pid, signal.SIGTERM)
except OSError:
    pass
if body is None or "sandgym-ok" not in body:
    fail(f"no page served on port {port}")
if not alive:
    fail("the pid in server.pid is not a running process")

print("PASS")
