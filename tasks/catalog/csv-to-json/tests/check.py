"""Verifier checks for csv-to-json: exit 0 when the task is solved, 1 (with a reason) otherwise."""
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
    got = json.loads(read("/app/inventory.json"))
except json.JSONDecodeError as exc:
    fail(f"inventory.json is not JSON: {exc}")
want = [{'sku': 'A-100', 'name': 'bolt, hex', 'qty': 250, 'price': 0.1}, {'sku': 'B-220', 'name': 'washer', 'qty': 1000, 'price': 0.02}, {'sku': 'C-7', 'name': 'nut', 'qty': 0, 'price': 0.05}, {'sku': 'D-900', 'name': 'pipe "1in"', 'qty': 12, 'price': 4.5}, {'sku': 'E-1', 'name': 'glue', 'qty': 3, 'price': 12.0}]
if got != want or any(type(g["qty"]) is not int for g in got):
    fail(f"expected {want}, found {got}")

print("PASS")
