#!/bin/bash
# Oracle solution.
set -euo pipefail
chmod 700 /app/secrets && chmod 600 /app/secrets/*
