"""Verifier checks for top-ips: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


got = read("/app/top.txt").split()
if got != ['10.0.5.243', '10.0.2.102', '10.0.0.19']:
    fail(f"expected ['10.0.5.243', '10.0.2.102', '10.0.0.19'], found {got}")

print("PASS")
