"""Dockerfile heredocs (`RUN <<EOF`, `RUN cmd <<'EOF'`, `COPY <<EOF /path`) for builders without
BuildKit.

Harbor builds task images with BuildKit, which reads a heredoc's body as part of the
instruction; the classic builder (what the Docker SDK's `build` drives, and the only one on a
host without buildx) reads each body line as a new instruction and fails. Many public Harbor
tasks write scripts and config files this way, so `rewrite_heredocs` turns each such
instruction into one plain line with the same effect:

- `RUN <shell text with heredocs>` -> `RUN eval "$(echo <base64 of the text> | base64 -d)"`: the
  same shell gets the same script, heredoc bodies and variable expansion rules included;
- `RUN <<EOF` (the body *is* the script) -> the body runs as the script; with a `#!` line it is
  written to a temporary file and executed by that interpreter, as BuildKit does;
- `COPY [--chmod=M] <<EOF /dest` -> a RUN writing the body to `/dest` (and chmod M).

A Dockerfile without heredocs comes back unchanged. What is not rewritten (several heredoc
sources in one COPY, the exec/JSON form) is left as it was, so the build reports it.

    >>> print(rewrite_heredocs("FROM x\\nCOPY <<EOF /a\\nhi\\nEOF\\n"))  # doctest: +ELLIPSIS
    FROM x
    RUN mkdir -p / && echo aGkK | base64 -d > /a
    <BLANKLINE>
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex

_MARKER = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_INSTR = re.compile(r"^\s*(RUN|COPY|ADD)\s+(.*)$", re.IGNORECASE | re.DOTALL)


def has_heredoc(text: str) -> bool:
    """True when the Dockerfile may open a heredoc (a `<<WORD` anywhere; the rewrite decides)."""
    return _MARKER.search(text) is not None


def _b64(data: str) -> str:
    return base64.b64encode(data.encode("utf-8")).decode("ascii")


def _read_bodies(
    lines: list[str], start: int, markers: list[re.Match[str]]
) -> tuple[list[list[str]], int] | None:
    """The body lines of each marker, in order, from `lines[start:]`; and the next index."""
    bodies: list[list[str]] = []
    i = start
    for m in markers:
        strip_tabs, delim = m.group(1) == "-", m.group(3)
        body: list[str] = []
        while True:
            if i >= len(lines):
                return None  # unterminated: leave the file to the builder's own error
            line = lines[i]
            i += 1
            check = line.lstrip("\t") if strip_tabs else line
            if check.rstrip("\r") == delim:
                break
            body.append(check if strip_tabs else line)
        bodies.append(body)
    return bodies, i


def _run_line(command: str, markers: list[re.Match[str]], bodies: list[list[str]]) -> str:
    rest = _MARKER.sub("", command).strip()
    if not rest and len(bodies) == 1:
        script = "\n".join(bodies[0]) + "\n"
        if script.startswith("#!"):
            # BuildKit runs a body with a shebang by that interpreter.
            tmp = "/tmp/.sandgym-heredoc-run"
            return (
                f"RUN echo {_b64(script)} | base64 -d > {tmp} && chmod +x {tmp} && {tmp}; "
                f"rc=$?; rm -f {tmp}; exit $rc"
            )
        return f'RUN eval "$(echo {_b64(script)} | base64 -d)"'
    parts = [command]
    for m, body in zip(markers, bodies, strict=True):
        parts.extend(body)
        parts.append(m.group(3))
    script = "\n".join(parts) + "\n"
    return f'RUN eval "$(echo {_b64(script)} | base64 -d)"'


def _copy_line(args: str, markers: list[re.Match[str]], bodies: list[list[str]]) -> str | None:
    if len(markers) != 1:
        return None
    tokens = shlex.split(_MARKER.sub(" ", args))
    chmod = None
    dest = None
    for tok in tokens:
        if tok.startswith("--chmod="):
            chmod = tok.split("=", 1)[1]
        elif tok.startswith("--"):
            continue  # --chown/--link: root-owned write is what the builder does without them
        else:
            dest = tok
    if dest is None or not dest.startswith("/"):
        return None  # relative to WORKDIR: rare; leave it to the builder
    content = "\n".join(bodies[0]) + "\n"
    if dest.endswith("/"):
        dest = dest + markers[0].group(3)
    qd = shlex.quote(dest)
    out = f"RUN mkdir -p {shlex.quote(posixpath.dirname(dest))} && echo {_b64(content)} | base64 -d > {qd}"
    if chmod:
        out += f" && chmod {shlex.quote(chmod)} {qd}"
    return out


def rewrite_heredocs(text: str) -> str:
    """The Dockerfile with every heredoc instruction rewritten as one classic-builder line."""
    if not has_heredoc(text):
        return text
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _INSTR.match(lines[i])
        if not m or m.group(2).lstrip().startswith("["):
            out.append(lines[i])
            i += 1
            continue
        # the instruction's own lines: it may continue with a backslash before its heredoc
        end = i
        while lines[end].rstrip().endswith("\\") and end + 1 < len(lines):
            end += 1
        head = "\n".join(lines[i : end + 1])
        markers = list(_MARKER.finditer(head))
        read = _read_bodies(lines, end + 1, markers) if markers else None
        new: str | None = None
        if read is not None:
            bodies, nxt = read
            kind, args = m.group(1).upper(), _INSTR.match(head).group(2)  # type: ignore[union-attr]
            if kind == "RUN":
                new = _run_line(args, markers, bodies)
            else:
                new = _copy_line(args, markers, bodies)
        if new is None:
            out.extend(lines[i : end + 1])
            i = end + 1
            continue
        out.append(new)
        i = nxt
    return "\n".join(out) + "\n"
