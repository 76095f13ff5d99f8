"""Verifier checks for copy-file: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


if read("/app/backup.txt") != secret():
    fail("backup.txt is missing or is not an exact copy of input.txt as it was created")

print("PASS")
