"""Verifier checks for git-merge-feature: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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

clean()
code, head = git("symbolic-ref", "--short", "HEAD")
if head != "main":
    fail(f"expected main checked out, found {head!r}")
code, _ = git("merge-base", "--is-ancestor", "feature", "main")
if code != 0:
    fail("feature is not merged into main")
for path in ("feature.py", "app.py", "NOTES.md"):
    if not os.path.exists("/app/repo/" + path):
        fail(f"{path} missing on main")

print("PASS")
