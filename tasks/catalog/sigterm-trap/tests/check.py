"""Verifier checks for sigterm-trap: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


import signal, time
if not os.path.exists("/app/worker.sh"):
    fail("/app/worker.sh does not exist")
try:
    os.remove("/app/worker.log")
except FileNotFoundError:
    pass
proc = subprocess.Popen(["bash", "/app/worker.sh"], stdin=subprocess.DEVNULL)
time.sleep(1.0)  # let bash install its trap
if proc.poll() is not None:
    fail(f"worker.sh exited on its own with {proc.returncode}")
proc.send_signal(signal.SIGTERM)
try:
    code = proc.wait(timeout=10)
except subprocess.TimeoutExpired:
    proc.kill()
    fail("worker.sh ignored SIGTERM")
if code != 0:
    fail(f"worker.sh exited {code} on SIGTERM, expected 0")
if "clean shutdown" not in read("/app/worker.log").splitlines():
    fail("worker.log lacks the line 'clean shutdown'")

print("PASS")
