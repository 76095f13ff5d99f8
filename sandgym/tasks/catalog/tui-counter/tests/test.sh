#!/bin/bash
# sandgym catalog verifier (tasks/catalog/README.md): check.py exits 0 (solved) or 10 (not
# solved, with the reason). Any other exit (a traceback in the checker, a missing secret, no
# python3, killed) means the checker could not run: no reward is written and this script fails,
# so the episode is a verifier_error (scored 0, recorded), never a silent 0 the agent "earned".
mkdir -p /logs/verifier
python3 /tests/check.py
rc=$?
case $rc in
  0) echo 1 > /logs/verifier/reward.txt ;;
  10) echo 0 > /logs/verifier/reward.txt ;;
  *)
    echo "sandgym: check.py could not run (exit $rc); no reward written" >&2
    exit 3
    ;;
esac
