"""Verifier checks for git-tag-release: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


def git(*args):
    r = subprocess.run(["git", "-C", "/app/repo", *args], capture_output=True, text=True)
    return r.returncode, r.stdout.strip()
def clean():
    code, out = git("status", "--porcelain")
    if code != 0:
        fail("/app/repo is not a git repository")
    if out:
        fail(f"working tree is not clean: {out[:200]}")

want = json.loads(secret())["release"]
code, kind = git("cat-file", "-t", "v1.0")
if code != 0 or kind != "tag":
    fail(f"v1.0 must be an annotated tag, found {kind!r}")
_, target = git("rev-parse", "v1.0^{commit}")
if target != want:
    fail("v1.0 points at the wrong commit")
_, msg = git("tag", "-l", "--format=%(contents)", "v1.0")
if msg.strip() != "Version 1.0":
    fail(f"tag message is {msg.strip()!r}")

print("PASS")
