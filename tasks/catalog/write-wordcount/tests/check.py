"""Verifier checks for write-wordcount: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


cases = {"a.txt": "one two three\nfour\n", "b.txt": "no newline at end", "c.txt": "",
         "d.txt": "héllo wörld\n\n  spaced   out  \n"}
os.makedirs("/tmp/wc-check", exist_ok=True)
for name, content in cases.items():
    path = "/tmp/wc-check/" + name
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
    want = f"{content.count(chr(10))} {len(content.split())} {len(content)}"
    r = subprocess.run([sys.executable, "/app/wc.py", path], capture_output=True, text=True, timeout=20)
    if r.returncode != 0 or r.stdout.strip() != want:
        fail(f"{name}: expected {want!r}, found {r.stdout.strip()!r} {r.stderr[-300:]!r}")

print("PASS")
