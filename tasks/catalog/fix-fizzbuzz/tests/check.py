"""Verifier checks for fix-fizzbuzz: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


def want(n):
    return "".join(("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)) + "\n" for i in range(1, n + 1))
for n in (1, 15, 31):
    r = subprocess.run([sys.executable, "/app/fizzbuzz.py", str(n)], capture_output=True, text=True, timeout=20)
    if r.returncode != 0 or r.stdout != want(n):
        fail(f"wrong output for N={n}: {r.stdout[-200:]!r} {r.stderr[-300:]!r}")

print("PASS")
