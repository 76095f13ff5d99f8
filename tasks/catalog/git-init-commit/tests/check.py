"""Verifier checks for git-init-commit: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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
    r = subprocess.run(["git", "-C", "/app/project", *args], capture_output=True, text=True)
    return r.returncode, r.stdout.strip()
code, log = git("log", "--format=%s", "main")
if code != 0 or log.splitlines() != ["initial commit"]:
    fail(f"expected one commit 'initial commit' on main, found {log!r}")
_, files = git("ls-tree", "-r", "--name-only", "main")
files = set(files.splitlines())
want = {".gitignore", "README.md", "main.py", "lib/util.py"}
if files != want:
    fail(f"expected committed files {sorted(want)}, found {sorted(files)}")
code, out = git("status", "--porcelain", "--ignored")
if any(not l.startswith("!!") for l in out.splitlines()):
    fail(f"working tree not clean: {out}")
if "build/" not in out:
    fail("build/ is not ignored")

print("PASS")
