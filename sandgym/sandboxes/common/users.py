"""Who a command runs as: whether a user name means root, and the argv that runs a command as
another user inside a sandbox."""

from __future__ import annotations

#: the user names that mean root: none given (the image's default, root in every image sandgym
#: runs), an empty one (the engine's default too), and root by name or uid
ROOT_USERS = (None, "", "root", "0")

#: run "$@" as the user "$0": that uid and its primary group as the sandbox's own user database
#: has them (`id -g`, as the engine's `docker exec -u` does; a uid with no entry keeps its number
#: as its group), no supplementary groups
_SWITCH = (
    'g=$(id -g -- "$0" 2>/dev/null) || g=$0; '
    'exec setpriv --reuid="$0" --regid="$g" --clear-groups -- "$@"'
)


def is_root_user(user: str | None) -> bool:
    """Whether a command or verifier `user` runs as root (no switch of user needed)."""
    return user in ROOT_USERS


def as_user_argv(user: str, argv: list[str]) -> list[str]:
    """`argv` run as `user` (a name or a uid) by setpriv inside the sandbox; the caller needs the
    capabilities to switch (the new uid holds none after it)."""
    return ["sh", "-c", _SWITCH, user, *argv]
