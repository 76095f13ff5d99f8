#!/bin/bash
# Oracle: opens the Theme menu and then the File menu with the keyboard (Alt+underlined
# letter, arrows, Enter), like a user without a mouse; all through xdotool.
set -euo pipefail
export DISPLAY="${DISPLAY:-:99}"
win=$(timeout 30 xdotool search --sync --onlyvisible --name '^Preferences$' | head -n1)
read -r X0 Y0 < <(xwininfo -id "$win" | awk '/Absolute upper-left X/ {x=$NF} /Absolute upper-left Y/ {y=$NF} END {print x, y}')
xdotool mousemove $((X0 + 260)) $((Y0 + 150)) click 1   # focus the window
sleep 0.1
xdotool key alt+t
sleep 0.3
xdotool key Down Return               # Light (active on opening) -> Dark
sleep 0.3
xdotool key alt+f
sleep 0.3
xdotool key Down Return               # Save settings
for _ in $(seq 50); do [ -s /app/settings.json ] && exit 0; sleep 0.1; done
echo "the settings were not saved" >&2
exit 1
