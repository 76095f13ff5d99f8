#!/usr/bin/env bash
# A second Docker engine beside this host's, for the Terminal-Bench 1 harness's trials that
# this host's engine cannot build (lab/bench/tb1_own_harness.sh, DOCKER_SOCK=$D2/docker.sock):
# Docker 20.10's built-in BuildKit (0.8) cannot parse Dockerfile heredocs (`COPY <<EOT`,
# syntax 1.4); Debian trixie's docker.io 26.1.5 builds them in. Its dockerd is unpacked from
# Debian's mirror (nothing installed) and runs with its own data-root, exec-root (and so its
# own containerd), bridge and address pool:
#   bash lab/bench/tb1_second_engine.sh start IMAGE ...   # starts it, loads IMAGEs from this host's
#   bash lab/bench/tb1_second_engine.sh stop              # stops it, removes its bridge and rules
# Its bridge is its own (d2br0, 10.124.0.0/24), never `--bridge none`: a dockerd started with
# the default bridge disabled deletes the interface docker0, which this host's engine uses.
# It leaves iptables to this script (`--iptables=false`), which adds only NAT and forwarding for
# its own two ranges, so this host's engine's chains are untouched.
set -euo pipefail
D2="${D2:-/tmp/d2}"
BR=d2br0 BR_NET=10.124.0.0/24 BR_IP=10.124.0.1/24 POOL=10.123.0.0/16
deb=docker.io_26.1.5+dfsg1-9+deb13u1+b1_amd64.deb
rules=(
  "-t nat POSTROUTING -s $BR_NET ! -o $BR -j MASQUERADE"
  "-t nat POSTROUTING -s $POOL -j MASQUERADE"
  "FORWARD -i $BR -j ACCEPT"
  "FORWARD -o $BR -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
  "FORWARD -s $POOL -j ACCEPT"
  "FORWARD -d $POOL -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
)
rule() {  # rule -A|-D|-C "[-t TABLE] CHAIN SPEC..."
  local op=$1; set -- $2
  if [ "$1" = -t ]; then iptables -t "$2" "$op" "${@:3}"; else iptables "$op" "$@"; fi
}
case "${1:?usage: tb1_second_engine.sh start IMAGE ... | stop}" in
start)
  shift
  mkdir -p "$D2/data" "$D2/exec"
  [ -s "$D2/$deb" ] || curl -fsSL -o "$D2/$deb" "http://deb.debian.org/debian/pool/main/d/docker.io/$deb"
  [ -x "$D2/x/usr/sbin/dockerd" ] || dpkg-deb -x "$D2/$deb" "$D2/x"
  ip link show "$BR" >/dev/null 2>&1 || {
    ip link add "$BR" type bridge; ip addr add "$BR_IP" dev "$BR"; ip link set "$BR" up; }
  for r in "${rules[@]}"; do rule -C "$r" 2>/dev/null || rule -A "$r"; done
  PATH="$D2/x/usr/sbin:$D2/x/usr/bin:$PATH" nohup "$D2/x/usr/sbin/dockerd" \
    -H "unix://$D2/docker.sock" --data-root "$D2/data" --exec-root "$D2/exec" \
    --pidfile "$D2/docker.pid" --bridge "$BR" --iptables=false --ip-masq=false \
    --default-address-pool "base=$POOL,size=24" --storage-driver overlay2 \
    >"$D2/dockerd.log" 2>&1 &
  for _ in $(seq 30); do docker -H "unix://$D2/docker.sock" info >/dev/null 2>&1 && break; sleep 1; done
  docker -H "unix://$D2/docker.sock" version --format 'second engine: {{.Server.Version}}'
  for img in "$@"; do docker save "$img" | docker -H "unix://$D2/docker.sock" load; done
  ip link show docker0 >/dev/null  # this host's engine's bridge is still there
  echo "DOCKER_SOCK=$D2/docker.sock"
  ;;
stop)
  if [ -s "$D2/docker.pid" ]; then kill "$(cat "$D2/docker.pid")" 2>/dev/null || true; fi
  for _ in $(seq 30); do [ -S "$D2/docker.sock" ] || break; sleep 1; done
  for r in "${rules[@]}"; do if rule -C "$r" 2>/dev/null; then rule -D "$r"; fi; done
  if ip link show "$BR" >/dev/null 2>&1; then ip link del "$BR"; fi
  echo "second engine stopped"
  ;;
*) echo "usage: tb1_second_engine.sh start IMAGE ... | stop" >&2; exit 2 ;;
esac
