"""Verifier checks for first-line: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


if read("/app/first.txt").strip() != secret().strip():
    fail("first.txt does not hold the first line of data.txt")

print("PASS")
