"""Verifier checks for json-merge-config: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


try:
    got = json.loads(read("/app/config.json"))
except json.JSONDecodeError as exc:
    fail(f"config.json is not JSON: {exc}")
want = json.loads('{"server": {"host": "0.0.0.0", "port": 9090, "tls": {"enabled": true, "cert": null}}, "log": {"level": "info", "targets": ["file"]}, "features": {"beta": false}, "name": "prod"}')
if got != want:
    fail(f"expected {want}, found {got}")

print("PASS")
