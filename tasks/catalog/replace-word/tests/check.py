"""Verifier checks for replace-word: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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


if read("/app/story.txt") != 'The dog sat on the mat.\nA category of cats is not a dog.\nMy dog, the best dog, sleeps.\nConcatenate nothing; scatter nothing.\n':
    fail("story.txt does not have exactly the whole words 'cat' replaced by 'dog'")

print("PASS")
