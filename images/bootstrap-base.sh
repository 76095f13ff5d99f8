#!/usr/bin/env bash
# Build sandgym's images without any container registry.
#
#   images/bootstrap-base.sh [--force] [--no-terminal] [--envserver] [--desktop]
#
# 1. sandgym/base:bookworm  - a Debian bookworm minbase rootfs made with debootstrap from the
#    mirror in apt's own sources, with the host's CA bundle copied in (pip and curl inside
#    containers need it to reach PyPI over TLS here), imported with `docker import`.
# 2. sandgym/terminal:latest - images/terminal/Dockerfile built on top of the base, plus alias
#    tags so Terminal-Bench-style task Dockerfiles (FROM ghcr.io/laude-institute/t-bench/...,
#    FROM python:3.x-slim-bookworm, FROM ubuntu:...) resolve to a local image.
# 3. (--envserver) sandgym/envserver:latest - images/envserver/Dockerfile, context = repo root.
# 4. (--desktop) sandgym/desktop:latest - images/desktop/Dockerfile on top of the terminal image
#    (Xvfb, openbox, xdotool, scrot, ImageMagick, Tk: the image of the desktop-* tasks).
#
# Idempotent: an image that already exists is kept unless --force is given.
# Environment: SANDGYM_BASE_IMAGE, SANDGYM_TERMINAL_IMAGE, SANDGYM_ENVSERVER_IMAGE (tags),
# SANDGYM_CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt), SANDGYM_SKIP_ALIASES=1.
set -euo pipefail

FORCE=0
TERMINAL=1
ENVSERVER=0
DESKTOP=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        --no-terminal) TERMINAL=0 ;;
        --envserver) ENVSERVER=1 ;;
        --desktop) DESKTOP=1 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "bootstrap-base.sh: unknown argument $arg (expected --force, --no-terminal, --envserver, --desktop)" >&2; exit 2 ;;
    esac
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
BASE_IMAGE="${SANDGYM_BASE_IMAGE:-sandgym/base:bookworm}"
TERMINAL_IMAGE="${SANDGYM_TERMINAL_IMAGE:-sandgym/terminal:latest}"
ENVSERVER_IMAGE="${SANDGYM_ENVSERVER_IMAGE:-sandgym/envserver:latest}"
DESKTOP_IMAGE="${SANDGYM_DESKTOP_IMAGE:-sandgym/desktop:latest}"
SUITE=bookworm
CA_BUNDLE="${SANDGYM_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

log() { echo "[bootstrap $(date +%H:%M:%S)] $*" >&2; }

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

docker info >/dev/null 2>&1 || { echo "bootstrap-base.sh: no Docker engine answers (docker info failed); start dockerd first" >&2; exit 1; }

# The mirror apt itself uses on this host: deb822 sources first, then the classic list.
find_mirror() {
    local m=""
    if [ -r /etc/apt/sources.list.d/debian.sources ]; then
        m="$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' /etc/apt/sources.list.d/debian.sources)"
    fi
    if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
        m="$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' /etc/apt/sources.list)"
    fi
    echo "${m:-http://deb.debian.org/debian}"
}

build_base() {
    if image_exists "$BASE_IMAGE" && [ "$FORCE" = 0 ]; then
        log "$BASE_IMAGE exists; keeping it (use --force to rebuild)"
        return
    fi
    command -v debootstrap >/dev/null || { echo "bootstrap-base.sh: debootstrap is not installed (apt-get install -y debootstrap)" >&2; exit 1; }
    [ -r "$CA_BUNDLE" ] || { echo "bootstrap-base.sh: CA bundle $CA_BUNDLE not readable" >&2; exit 1; }
    local mirror rootfs t0
    mirror="$(find_mirror)"
    rootfs="$(mktemp -d /tmp/sandgym-rootfs.XXXXXX)"
    # debootstrap leaves mounts (proc, sys) behind when it dies half-way; umount before rm.
    trap 'umount -R "$rootfs"/proc "$rootfs"/sys "$rootfs"/dev 2>/dev/null || true; rm -rf --one-file-system "$rootfs"' EXIT
    t0=$(date +%s.%N)
    log "debootstrap --variant=minbase $SUITE $rootfs $mirror"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" "$mirror" >/tmp/sandgym-debootstrap.log 2>&1 \
        || { tail -n 30 /tmp/sandgym-debootstrap.log >&2; echo "bootstrap-base.sh: debootstrap failed (log: /tmp/sandgym-debootstrap.log)" >&2; exit 1; }
    # The host's bundle contains whatever extra roots this network needs for TLS to PyPI.
    install -m 0644 "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    mkdir -p "$rootfs/etc/pip"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
    # Same mirror and suites as the host so `apt-get` in docker build hits a reachable mirror.
    cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
EOF
    # Small images: no docs, no man pages, no recommends.
    cat >"$rootfs/etc/apt/apt.conf.d/90sandgym" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
EOF
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/90sandgym-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
EOF
    rm -rf --one-file-system "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    # mktemp made the directory 0700, and the tar's "./" carries that mode: overlay2 hides it,
    # the btrfs driver does not (then / is 0700 and no other user can run anything).
    chmod 0755 "$rootfs"
    log "debootstrap done in $(echo "$(date +%s.%N) - $t0" | bc) s; importing"
    t0=$(date +%s.%N)
    tar --numeric-owner -C "$rootfs" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
        -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        -c 'CMD ["/bin/bash"]' \
        - "$BASE_IMAGE" >/dev/null
    log "imported $BASE_IMAGE in $(echo "$(date +%s.%N) - $t0" | bc) s"
    umount -R "$rootfs"/proc "$rootfs"/sys "$rootfs"/dev 2>/dev/null || true
    # Deleting ~200 MB of small files takes 5-20 s; nothing waits for it.
    (rm -rf --one-file-system "$rootfs" &)
    trap - EXIT
}

# Names Terminal-Bench / Harbor task Dockerfiles commonly start FROM; with no registry they
# would fail to build, so they point at the local terminal image (bookworm, python3, tmux).
ALIASES=(
    "ghcr.io/laude-institute/t-bench/python-3-13:latest"
    "ghcr.io/laude-institute/t-bench/python-3-13:20250620"
    "ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest"
    "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624"
    "python:3.11-slim-bookworm"
    "python:3.11-slim"
    "python:3.12-slim-bookworm"
    "python:3.13-slim-bookworm"
    "debian:bookworm"
    "debian:bookworm-slim"
    "ubuntu:22.04"
    "ubuntu:24.04"
)

build_terminal() {
    if image_exists "$TERMINAL_IMAGE" && [ "$FORCE" = 0 ]; then
        log "$TERMINAL_IMAGE exists; keeping it"
    else
        local t0
        t0=$(date +%s.%N)
        log "building $TERMINAL_IMAGE"
        docker build -q --build-arg "BASE=$BASE_IMAGE" -t "$TERMINAL_IMAGE" "$HERE/terminal" >/dev/null
        log "built $TERMINAL_IMAGE in $(echo "$(date +%s.%N) - $t0" | bc) s"
    fi
    if [ -n "${SANDGYM_SKIP_ALIASES:-}" ]; then return; fi
    for a in "${ALIASES[@]}"; do
        # Never shadow a real image someone loaded by hand under that name.
        if ! image_exists "$a" || [ "$FORCE" = 1 ]; then
            docker tag "$TERMINAL_IMAGE" "$a"
        fi
    done
    log "alias tags: ${ALIASES[*]}"
}

build_envserver() {
    if image_exists "$ENVSERVER_IMAGE" && [ "$FORCE" = 0 ]; then
        log "$ENVSERVER_IMAGE exists; keeping it"
        return
    fi
    local t0
    t0=$(date +%s.%N)
    log "building $ENVSERVER_IMAGE (context $REPO)"
    docker build -q -f "$HERE/envserver/Dockerfile" -t "$ENVSERVER_IMAGE" "$REPO" >/dev/null
    log "built $ENVSERVER_IMAGE in $(echo "$(date +%s.%N) - $t0" | bc) s"
}

build_desktop() {
    if image_exists "$DESKTOP_IMAGE" && [ "$FORCE" = 0 ]; then
        log "$DESKTOP_IMAGE exists; keeping it"
        return
    fi
    local t0
    t0=$(date +%s.%N)
    log "building $DESKTOP_IMAGE"
    docker build -q --build-arg "BASE=$TERMINAL_IMAGE" -t "$DESKTOP_IMAGE" "$HERE/desktop" >/dev/null
    log "built $DESKTOP_IMAGE in $(echo "$(date +%s.%N) - $t0" | bc) s"
}

build_base
if [ "$TERMINAL" = 1 ] || [ "$ENVSERVER" = 1 ] || [ "$DESKTOP" = 1 ]; then build_terminal; fi
if [ "$ENVSERVER" = 1 ]; then build_envserver; fi
if [ "$DESKTOP" = 1 ]; then build_desktop; fi
log "done"
