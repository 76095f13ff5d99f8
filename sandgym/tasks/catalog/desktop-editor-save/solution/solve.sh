#!/bin/bash
# Oracle: clicks into the editor, types the two lines and presses Ctrl+S, all with xdotool.
set -euo pipefail
export DISPLAY="${DISPLAY:-:99}"
win=$(timeout 30 xdotool search --sync --onlyvisible --name '^Notes' | head -n1)
read -r X0 Y0 < <(xwininfo -id "$win" | awk '/Absolute upper-left X/ {x=$NF} /Absolute upper-left Y/ {y=$NF} END {print x, y}')
xdotool mousemove $((X0 + 300)) $((Y0 + 150)) click 1
sleep 0.1
xdotool type --delay 10 $'Meeting at 10:30\nBring the quarterly report'
xdotool key ctrl+s
for _ in $(seq 50); do [ -s /app/notes.txt ] && exit 0; sleep 0.1; done
echo "the editor never saved /app/notes.txt" >&2
exit 1
