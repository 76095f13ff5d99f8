#!/bin/bash
# Oracle: drives the Registration window with xdotool through the X display, as an agent would
# (pointer clicks and keystrokes); it never writes the result file itself.
set -euo pipefail
export DISPLAY="${DISPLAY:-:99}"
win=$(timeout 30 xdotool search --sync --onlyvisible --name '^Registration$' | head -n1)
# xwininfo gives the client area's screen origin (xdotool's own geometry counts the frame twice).
read -r X0 Y0 < <(xwininfo -id "$win" | awk '/Absolute upper-left X/ {x=$NF} /Absolute upper-left Y/ {y=$NF} END {print x, y}')
click() { xdotool mousemove $((X0 + $1)) $((Y0 + $2)) click 1; sleep 0.15; }

click 280 44                      # Name field
xdotool type --delay 10 "Ada Lovelace"
click 280 94                      # Email field
xdotool type --delay 10 "ada@example.org"
click 140 144                     # Subscribe checkbox
click 240 208                     # Submit
for _ in $(seq 50); do [ -s /app/registration.json ] && exit 0; sleep 0.1; done
echo "the app never saved /app/registration.json" >&2
exit 1
