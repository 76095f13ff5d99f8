"""Scripts run *inside* a sandbox to kill processes: those of one exec (found by the unique
`SANDGYM_EXEC_ID` marker in their environment), the descendants of one pid (the shell's
command on timeout), or everything but init. They walk /proc, so no procps is needed."""

from __future__ import annotations

#: the environment variable that marks every process of one exec (value: a unique hex id)
EXEC_MARKER_ENV = "SANDGYM_EXEC_ID"


def kill_marked_script(marker: str) -> str:
    """A POSIX sh script that kills every process whose environment holds
    `SANDGYM_EXEC_ID=<marker>`. Processes are stopped as found (so none forks away during
    the walk), then killed; a few rounds catch children forked while the first walk ran."""
    return (
        "set +e; m='%s=%s'; for r in 1 2 3 4; do hit=''; "
        "for e in /proc/[0-9]*/environ; do p=${e#/proc/}; p=${p%%/environ}; "
        '[ "$p" = "$$" ] && continue; '
        "if tr '\\0' '\\n' < \"$e\" 2>/dev/null | grep -qxF \"$m\"; then "
        'kill -STOP "$p" 2>/dev/null; hit="$hit $p"; fi; done; '
        '[ -z "$hit" ] && break; kill -KILL $hit 2>/dev/null; done; exit 0'
    ) % (EXEC_MARKER_ENV, marker)


def kill_marked_bash_script(marker: str) -> str:
    """The same as `kill_marked_script` with bash builtins only: it forks nothing, so it still
    works when a fork bomb holds every pid the sandbox's pids limit allows (it needs one)."""
    return (
        "m='%s=%s'; for r in 1 2 3 4; do hit=(); "
        "for e in /proc/[0-9]*/environ; do p=${e#/proc/}; p=${p%%/environ}; "
        "[[ $p == $$ ]] && continue; "
        "while IFS= read -r -d '' v; do if [[ $v == \"$m\" ]]; then "
        'kill -STOP "$p" 2>/dev/null; hit+=("$p"); break; fi; done 2>/dev/null < "$e"; done; '
        '((${#hit[@]})) || break; kill -KILL "${hit[@]}" 2>/dev/null; done; exit 0'
    ) % (EXEC_MARKER_ENV, marker)


#: kills every process but pid 1, the oldest other process (a backend's helper) and itself
KILL_ALL_BUT_INIT_SCRIPT = r"""
keep=$(for p in /proc/[0-9]*; do
  st=$(sed 's/.*) //' "$p/stat" 2>/dev/null | cut -d' ' -f20)
  [ -n "$st" ] && [ "${p#/proc/}" != 1 ] && echo "$st ${p#/proc/}"
done | sort -n | head -n 1 | cut -d' ' -f2)
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = 1 ] || [ "$pid" = "$keep" ] || [ "$pid" = $$ ] || kill -9 "$pid" 2>/dev/null
done
exit 0
"""


def kill_tree_script(pid: int) -> str:
    """A POSIX sh script, run inside the sandbox, that SIGKILLs every descendant of `pid`.

    It walks /proc (no procps needed), stops each process first so none can fork away while
    the walk runs, then kills them all. `pid` itself survives.
    """
    return (
        "set +e; root=%d; kids() { for s in /proc/[0-9]*/stat; do "
        'read -r p rest < "$s" 2>/dev/null || continue; '
        'pp=$(echo "$rest" | sed "s/.*) [A-Za-z] \\([0-9]*\\).*/\\1/"); '
        '[ "$pp" = "$1" ] && echo "$p"; done; }; '
        "all=''; todo=$root; while [ -n \"$todo\" ]; do next=''; for t in $todo; do "
        'for c in $(kids "$t"); do kill -STOP "$c" 2>/dev/null; all="$all $c"; next="$next $c"; '
        "done; done; todo=$next; done; "
        '[ -n "$all" ] && kill -KILL $all 2>/dev/null; exit 0'
    ) % pid


def count_children_script(pid: int) -> str:
    """A sh script printing how many direct children `pid` has (inside the sandbox)."""
    return (
        'n=0; for s in /proc/[0-9]*/stat; do read -r p rest < "$s" 2>/dev/null || continue; '
        'pp=$(echo "$rest" | sed "s/.*) [A-Za-z] \\([0-9]*\\).*/\\1/"); '
        '[ "$pp" = "%d" ] && n=$((n+1)); done; echo $n'
    ) % pid
