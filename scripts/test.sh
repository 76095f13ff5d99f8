#!/usr/bin/env bash
# Quickstart 2: install everything the tests need (apt packages, a Docker engine, the offline
# base images, the virtualenv), then lint, type-check and run the whole test suite.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --docker --train --e2b
echo "== ruff" >&2
.venv/bin/ruff check sandgym lab tests
echo "== mypy (every package)" >&2
.venv/bin/mypy sandgym lab
echo "== pytest" >&2
.venv/bin/pytest -q -rs "$@"
