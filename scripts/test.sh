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
if [ $# -gt 0 ]; then exec .venv/bin/pytest -q -rs "$@"; fi
# verl's door runs in verl's own environment, .venv-verl (verl 0.9.1 requires transformers<5.11;
# .venv keeps the newest): scripts/setup.sh --train builds it, docs/integrations.md says why.
rc=0
.venv/bin/pytest -q -rs --ignore=tests/e2e/test_integration_verl.py || rc=$?
echo "== pytest (verl's door, in .venv-verl)" >&2
.venv-verl/bin/pytest -q -rs tests/e2e/test_integration_verl.py || rc=$?
exit "$rc"
