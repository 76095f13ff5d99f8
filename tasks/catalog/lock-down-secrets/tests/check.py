"""Verifier checks for lock-down-secrets: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


d = os.stat("/app/secrets").st_mode & 0o7777
if d != 0o700:
    fail(f"/app/secrets: expected 700, found {d:o}")
names = sorted(os.listdir("/app/secrets"))
if names != ["api.key", "id_ed25519", "tls.pem"]:
    fail(f"unexpected files {names}")
for n in names:
    m = os.stat("/app/secrets/" + n).st_mode & 0o7777
    if m != 0o600:
        fail(f"{n}: expected 600, found {m:o}")

print("PASS")
