"""Verifier checks for prime-module: exit 0 when the task is solved, 10 (with the reason) when it is not.

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


def ref(n):
    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))
NS = list(range(-3, 200)) + [7919, 7917, 104729]
UPTO = [-5, 0, 1, 2, 30, 100]
# The agent's module runs in a child process, never in this checker: code it wrote must not be
# able to exit this process with 0 or patch fail() and ref(). The child prints its answers.
PROBE = f"""
import json, sys
sys.path.insert(0, "/app")
import mathutil
print(json.dumps({{"is_prime": [bool(mathutil.is_prime(n)) for n in {NS!r}],
                  "primes_up_to": [list(mathutil.primes_up_to(n)) for n in {UPTO!r}]}}))
"""
r = run_agent([sys.executable, "-c", PROBE], cwd="/tmp")
try:
    got = json.loads(r.stdout.strip().splitlines()[-1])
    is_prime, upto = list(got["is_prime"]), list(got["primes_up_to"])
except (ValueError, IndexError, KeyError, TypeError):
    fail(f"cannot use /app/mathutil.py: {r.stderr[-500:]!r}")
if len(is_prime) != len(NS) or len(upto) != len(UPTO):
    fail("mathutil answered for the wrong number of inputs")
for n, got_n in zip(NS, is_prime):
    if got_n != ref(n):
        fail(f"is_prime({n}) is wrong")
for n, got_n in zip(UPTO, upto):
    if got_n != [k for k in range(n + 1) if ref(k)]:
        fail(f"primes_up_to({n}) is wrong")

print("PASS")
