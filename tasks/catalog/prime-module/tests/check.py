"""Verifier checks for prime-module: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


sys.path.insert(0, "/app")
try:
    import mathutil
except Exception as exc:
    fail(f"cannot import /app/mathutil.py: {exc!r}")
def ref(n):
    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))
for n in list(range(-3, 200)) + [7919, 7917, 104729]:
    if bool(mathutil.is_prime(n)) != ref(n):
        fail(f"is_prime({n}) is wrong")
for n in (-5, 0, 1, 2, 30, 100):
    if list(mathutil.primes_up_to(n)) != [k for k in range(n + 1) if ref(k)]:
        fail(f"primes_up_to({n}) is wrong")

print("PASS")
