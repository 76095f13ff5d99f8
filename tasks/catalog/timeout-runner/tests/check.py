"""Verifier checks for timeout-runner: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


def run(*args):
    try:
        return subprocess.run(["bash", "/app/with_timeout.sh", *args], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        fail(f"with_timeout.sh {' '.join(args)} never returned")
r = run("1", "sleep", "30")
if r.returncode != 124 or "TIMEOUT" not in r.stderr:
    fail(f"timeout case: exit {r.returncode}, stderr {r.stderr!r}")
r = run("5", "bash", "-c", "exit 3")
if r.returncode != 3:
    fail(f"exit status not passed through: {r.returncode}")
r = run("5", "echo", "hi", "there")
if r.returncode != 0 or r.stdout != "hi there\n" or "TIMEOUT" in r.stderr:
    fail(f"output not passed through: {r.stdout!r} {r.stderr!r}")

print("PASS")
