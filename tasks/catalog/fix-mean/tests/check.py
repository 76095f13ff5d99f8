"""Verifier checks for fix-mean: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


cases = {"1\n2\n3\n4\n": "2.50", "10\n\n-2.5\n\n": "3.75", "7\n": "7.00", "\n\n": "nan"}
os.makedirs("/tmp/mean-check", exist_ok=True)
for i, (content, want) in enumerate(cases.items()):
    path = f"/tmp/mean-check/{i}.txt"
    with open(path, "w") as f:
        f.write(content)
    r = subprocess.run([sys.executable, "/app/stats.py", path], capture_output=True, text=True, timeout=20)
    if r.returncode != 0 or r.stdout.strip() != want:
        fail(f"input {content!r}: expected {want}, found {r.stdout.strip()!r} {r.stderr[-300:]!r}")

print("PASS")
