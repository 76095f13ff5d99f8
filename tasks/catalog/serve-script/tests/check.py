"""Verifier checks for serve-script: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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
