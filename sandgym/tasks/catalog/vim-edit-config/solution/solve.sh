#!/bin/bash
# Oracle solution.
set -euo pipefail
# tmux helpers: a private server (-L) so concurrent episodes never share one.
S="sandgym-oracle-$$"
tm() { tmux -L "$S" "$@"; }
wait_screen() {  # wait until the pane shows $1
  for _ in $(seq 100); do tm capture-pane -p -t ed 2>/dev/null | grep -qF -- "$1" && return 0; sleep 0.1; done
  echo "screen never showed: $1" >&2; tm capture-pane -p -t ed >&2; return 1
}
wait_exit() {  # wait until the program in the session has exited
  for _ in $(seq 100); do tm has-session -t ed 2>/dev/null || return 0; sleep 0.1; done
  echo "program did not exit" >&2; return 1
}

     tm new-session -d -s ed -x 100 -y 30 "vi /app/app.ini"
     wait_screen "debug = false"
     tm send-keys -t ed Escape
     tm send-keys -t ed -l ':%s/debug = false/debug = true/'
     tm send-keys -t ed Enter
     tm send-keys -t ed -l ':%s/port = 8080/port = 9090/'
     tm send-keys -t ed Enter
     tm send-keys -t ed -l ':wq'
     tm send-keys -t ed Enter
     wait_exit
