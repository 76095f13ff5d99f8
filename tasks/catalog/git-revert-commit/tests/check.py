"""Verifier checks for git-revert-commit: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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

s = json.loads(secret())
clean()
if read("/app/repo/config.txt") != "timeout=30\nretries=3\n":
    fail("config.txt still has the broken change")
code, _ = git("merge-base", "--is-ancestor", s["tip"], "main")
if code != 0:
    fail("history was rewritten: the old tip of main is no longer in it")
_, head = git("rev-parse", "main")
if head == s["tip"]:
    fail("no new commit on main")
if not os.path.exists("/app/repo/CHANGELOG.md"):
    fail("a later commit's file (CHANGELOG.md) is gone")

print("PASS")
