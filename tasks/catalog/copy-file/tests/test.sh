#!/bin/bash
# sandgym verifier: runs /tests/check.py and records 1 (pass) or 0 (fail) in reward.txt.
mkdir -p /logs/verifier
if python3 /tests/check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
