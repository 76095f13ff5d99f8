"""Verifier checks for proc-info: exit 0 when the task is solved, 1 (with a reason) otherwise."""
import json
import os
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        fail(f"{path} does not exist")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {path}: {exc}")


def secret():
    with open("/tests/secret/expected", encoding="utf-8") as f:
        return f.read()


child = subprocess.Popen(["sleep", "30"])
try:
    r = subprocess.run(["bash", "/app/procinfo.sh", str(child.pid)], capture_output=True, text=True, timeout=10)
    if r.stdout.strip() != f"sleep {os.getpid()}":
        fail(f"expected 'sleep {os.getpid()}', found {r.stdout.strip()!r} {r.stderr[-200:]!r}")
finally:
    child.kill()
r = subprocess.run(["bash", "/app/procinfo.sh", "999999999"], capture_output=True, text=True, timeout=10)
if r.returncode != 1 or r.stdout.strip():
    fail(f"missing pid: expected exit 1 and no output, found {r.returncode} {r.stdout!r}")

print("PASS")
