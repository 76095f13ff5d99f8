#!/usr/bin/env bash
# Build sandgym's own images without any container registry.
#
#   images/bootstrap-base.sh [--force] [--suite bookworm|trixie|bullseye] [--no-terminal] [--envserver] [--desktop]
#
# 1. sandgym/base:SUITE (default bookworm) - a Debian minbase rootfs made with debootstrap from
#    the mirror in apt's own sources, with the host's CA bundle copied in (pip and curl inside
#    containers need it to reach PyPI over TLS here), imported with `docker import`. apt keeps
#    Debian's defaults (recommends on), as in the official debian images.
# 2. sandgym/terminal:latest - images/terminal/Dockerfile on top of sandgym/base:bookworm.
# 3. (--envserver) sandgym/envserver:latest - images/envserver/Dockerfile, context = repo root.
# 4. (--desktop) sandgym/desktop:latest - images/desktop/Dockerfile on top of the terminal image
#    (Xvfb, openbox, xdotool, scrot, ImageMagick, Tk: the image of the desktop-* tasks).
# With --suite trixie or bullseye only the base is made (sandgym/base:SUITE; bullseye, Debian 11,
# for tasks FROM debian:bullseye-slim; the mirror still serves it). The stand-ins for public
# images (python:3.X-slim, debian:*, ubuntu:*, Terminal-Bench's) and their alias tags are made
# by `sandgym images build` (lab/images.py), which calls this script first.
#
# Idempotent: an image that exists is kept unless --force is given, or it was made by an
# older recipe (label sandgym.base-version), or built on another id of its base image than the
# present one (label sandgym.built-from).
# Environment: SANDGYM_BASE_IMAGE (the bookworm base), SANDGYM_TERMINAL_IMAGE,
# SANDGYM_ENVSERVER_IMAGE, SANDGYM_DESKTOP_IMAGE (tags), SANDGYM_CA_BUNDLE (default
# /etc/ssl/certs/ca-certificates.crt).
set -euo pipefail

FORCE=0
TERMINAL=1
ENVSERVER=0
DESKTOP=0
SUITE=bookworm
want_suite=0
for arg in "$@"; do
    if [ "$want_suite" = 1 ]; then SUITE="$arg"; want_suite=0; continue; fi
    case "$arg" in
        --force) FORCE=1 ;;
        --suite) want_suite=1 ;;
        --suite=*) SUITE="${arg#--suite=}" ;;
        --no-terminal) TERMINAL=0 ;;
        --envserver) ENVSERVER=1 ;;
        --desktop) DESKTOP=1 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "bootstrap-base.sh: unknown argument $arg (expected --force, --suite S, --no-terminal, --envserver, --desktop)" >&2; exit 2 ;;
    esac
done
case "$SUITE" in
    bookworm|trixie|bullseye) ;;
    *) echo "bootstrap-base.sh: --suite $SUITE (expected bookworm, trixie or bullseye)" >&2; exit 2 ;;
esac
# The terminal, envserver and desktop images are built on bookworm only.
if [ "$SUITE" != bookworm ]; then TERMINAL=0; ENVSERVER=0; DESKTOP=0; fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
BOOKWORM_BASE="${SANDGYM_BASE_IMAGE:-sandgym/base:bookworm}"
if [ "$SUITE" = bookworm ]; then BASE_IMAGE="$BOOKWORM_BASE"; else BASE_IMAGE="sandgym/base:$SUITE"; fi
TERMINAL_IMAGE="${SANDGYM_TERMINAL_IMAGE:-sandgym/terminal:latest}"
ENVSERVER_IMAGE="${SANDGYM_ENVSERVER_IMAGE:-sandgym/envserver:latest}"
DESKTOP_IMAGE="${SANDGYM_DESKTOP_IMAGE:-sandgym/desktop:latest}"
CA_BUNDLE="${SANDGYM_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
# Bumped when the base recipe changes, so an engine that keeps its images rebuilds the base.
# 2: apt's defaults left as Debian's (1 turned recommends off globally); host CA files kept.
# 3: the SUITE-security suite in apt's sources, as the official debian images have it.
BASE_VERSION=3

log() { echo "[bootstrap $(date +%H:%M:%S)] $*" >&2; }

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }
image_label() { docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }
# An image built FROM another is current while it was built on that image's present id.
built_on_current() { [ "$(image_label "$1" sandgym.built-from)" = "$(image_id "$2")" ]; }

docker info >/dev/null 2>&1 || { echo "bootstrap-base.sh: no Docker engine answers (docker info failed); start dockerd first" >&2; exit 1; }

# An archive apt itself uses on this host, deb822 sources first, then the classic list:
# `apt_uri 0 DEFAULT` the mirror, `apt_uri 1 DEFAULT` the security archive (the official images
# list it beside the mirror: a package's security update is there until the next point release
# folds it in). DEFAULT where the host's sources name none.
apt_uri() {
    local security="$1" m=""
    if [ -r /etc/apt/sources.list.d/debian.sources ]; then
        m="$(awk -v sec="$security" '/^URIs:/ { for (i = 2; i <= NF; i++) if (($i ~ /security/) == sec) { print $i; exit } }' /etc/apt/sources.list.d/debian.sources)"
    fi
    if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
        m="$(awk -v sec="$security" '$1 == "deb" && ($0 ~ /security/) == sec { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' /etc/apt/sources.list)"
    fi
    echo "${m:-$2}"
}

build_base() {
    if image_exists "$BASE_IMAGE" && [ "$FORCE" = 0 ]; then
        if [ "$(image_label "$BASE_IMAGE" sandgym.base-version)" = "$BASE_VERSION" ]; then
            log "$BASE_IMAGE exists; keeping it (use --force to rebuild)"
            return
        fi
        log "$BASE_IMAGE was made by an older recipe; rebuilding it"
    fi
    command -v debootstrap >/dev/null || { echo "bootstrap-base.sh: debootstrap is not installed (apt-get install -y debootstrap)" >&2; exit 1; }
    [ -r "$CA_BUNDLE" ] || { echo "bootstrap-base.sh: CA bundle $CA_BUNDLE not readable" >&2; exit 1; }
    local mirror rootfs t0 dlog
    mirror="$(apt_uri 0 http://deb.debian.org/debian)"
    rootfs="$(mktemp -d /tmp/sandgym-rootfs.XXXXXX)"
    dlog="/tmp/sandgym-debootstrap-$SUITE.log"
    # debootstrap leaves mounts (proc, sys) behind when it dies half-way; umount before rm.
    trap 'umount -R "$rootfs"/proc "$rootfs"/sys "$rootfs"/dev 2>/dev/null || true; rm -rf --one-file-system "$rootfs"' EXIT
    t0=$(date +%s.%N)
    log "debootstrap --variant=minbase $SUITE $rootfs $mirror"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" "$mirror" >"$dlog" 2>&1 \
        || { tail -n 30 "$dlog" >&2; echo "bootstrap-base.sh: debootstrap failed (log: $dlog)" >&2; exit 1; }
    # The host's bundle contains whatever extra roots this network needs for TLS to PyPI.
    install -m 0644 "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    # The host's local roots as files too: a later update-ca-certificates (run by a package's
    # trigger inside a task) rebuilds the bundle from them and keeps them.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        install -m 0644 /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    fi
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
    # Same mirror as the host, so `apt-get` in docker build hits a reachable mirror; the
    # suites of the official image (release, -updates, -security).
    cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb $(apt_uri 1 http://deb.debian.org/debian-security) $SUITE-security main
EOF
    # Small images, as Debian's own -slim images: no docs, no man pages. apt's defaults stay
    # Debian's (recommends on): `apt-get install -y gcc` brings libc6-dev, as on the official images.
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
        -c "LABEL sandgym.base-version=$BASE_VERSION sandgym.suite=$SUITE" \
        - "$BASE_IMAGE" >/dev/null
    log "imported $BASE_IMAGE in $(echo "$(date +%s.%N) - $t0" | bc) s"
    umount -R "$rootfs"/proc "$rootfs"/sys "$rootfs"/dev 2>/dev/null || true
    # Deleting ~200 MB of small files takes 5-20 s; nothing waits for it.
    (rm -rf --one-file-system "$rootfs" &)
    trap - EXIT
}

# build_on TAG BASE DOCKERFILE_DIR [CONTEXT]: docker build, labelled with the base's id.
build_on() {
    local tag="$1" base="$2" dir="$3" ctx="${4:-$3}" t0
    if image_exists "$tag" && [ "$FORCE" = 0 ] && built_on_current "$tag" "$base"; then
        log "$tag exists; keeping it"
        return
    fi
    t0=$(date +%s.%N)
    log "building $tag on $base"
    docker build -q --build-arg "BASE=$base" --label "sandgym.built-from=$(image_id "$base")" \
        -f "$dir/Dockerfile" -t "$tag" "$ctx" >/dev/null
    log "built $tag in $(echo "$(date +%s.%N) - $t0" | bc) s"
}

build_base
if [ "$TERMINAL" = 1 ] || [ "$ENVSERVER" = 1 ] || [ "$DESKTOP" = 1 ]; then
    build_on "$TERMINAL_IMAGE" "$BOOKWORM_BASE" "$HERE/terminal"
fi
if [ "$ENVSERVER" = 1 ]; then build_on "$ENVSERVER_IMAGE" "$TERMINAL_IMAGE" "$HERE/envserver" "$REPO"; fi
if [ "$DESKTOP" = 1 ]; then build_on "$DESKTOP_IMAGE" "$TERMINAL_IMAGE" "$HERE/desktop"; fi
log "done"
