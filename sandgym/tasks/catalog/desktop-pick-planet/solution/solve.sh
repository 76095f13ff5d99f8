#!/bin/bash
# Oracle: scrolls the list with the mouse wheel, clicks its first row, walks down to Neptune
# with the arrow keys (the list scrolls to keep it visible) and opens it with Enter.
set -euo pipefail
export DISPLAY="${DISPLAY:-:99}"
win=$(timeout 30 xdotool search --sync --onlyvisible --name '^Planets$' | head -n1)
read -r X0 Y0 < <(xwininfo -id "$win" | awk '/Absolute upper-left X/ {x=$NF} /Absolute upper-left Y/ {y=$NF} END {print x, y}')
xdotool mousemove $((X0 + 120)) $((Y0 + 80)) click --repeat 10 --delay 30 5   # wheel down
xdotool click --repeat 10 --delay 30 4                                         # and back up
xdotool mousemove $((X0 + 120)) $((Y0 + 32)) click 1                          # first row
sleep 0.1
xdotool key Home
for _ in $(seq 7); do xdotool key Down; done                                  # Mercury -> Neptune
xdotool key Return
for _ in $(seq 50); do [ -s /app/choice.txt ] && exit 0; sleep 0.1; done
echo "no planet was opened" >&2
exit 1
