"""A small Dockerfile parser, for backends that build no image (local, null, E2B w/o template).

It understands what DESIGN.md says such backends honour: `FROM`, `WORKDIR`, `ENV`, `ARG`,
`USER`, and `COPY`/`ADD` of build-context files, plus `RUN` (reported, executed only when the
user opts in). Nothing here executes anything: parsing a task never runs its code.

Example:
    >>> df = parse_dockerfile("FROM img\\nWORKDIR /app\\nENV A=1 B=2\\nCOPY data/ ./data/\\n")
    >>> (df.base_image, df.workdir, df.env)
    ('img', '/app', {'A': '1', 'B': '2'})
    >>> df.steps[-1]
    CopyStep(sources=['data/'], dest='/app/data/', chown=None, chmod=None, line=4)
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field

from sandgym.tasks.errors import TaskLoadError, TaskUnsupportedError


@dataclass(frozen=True)
class CopyStep:
    """COPY/ADD of build-context files; `dest` is absolute (resolved against WORKDIR)."""

    sources: list[str]
    dest: str
    chown: str | None = None
    chmod: str | None = None
    line: int = 0


@dataclass(frozen=True)
class RunStep:
    """A RUN line: shell text, its WORKDIR, ENV and USER at that point."""

    command: str
    workdir: str
    env: dict[str, str]
    user: str | None
    line: int = 0


@dataclass(frozen=True)
class MkdirStep:
    """WORKDIR creates its directory, as `docker build` does."""

    path: str
    line: int = 0


Step = CopyStep | RunStep | MkdirStep


@dataclass
class Dockerfile:
    """What a Dockerfile says, in order."""

    base_image: str | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    steps: list[Step] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # instructions with no effect here

    @property
    def run_steps(self) -> list[RunStep]:
        return [s for s in self.steps if isinstance(s, RunStep)]


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _substitute(text: str, variables: dict[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name in variables and variables[name] != "":
            return variables[name]
        return default if default is not None else ""

    return _VAR.sub(repl, text)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash continuations; drop comments and blank lines. Returns (lineno, text)."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for no, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continuation are skipped by docker too
        if not buf:
            start = no
        if stripped.endswith("\\"):
            buf.append(stripped[:-1])
            continue
        buf.append(stripped)
        out.append((start, " ".join(b.strip() for b in buf if b.strip())))
        buf = []
    if buf:
        out.append((start, " ".join(buf)))
    return out


def _parse_kv(args: str, line: int) -> dict[str, str]:
    """ENV/ARG/LABEL arguments: `K=V K2="v 2"` or legacy `K value with spaces`."""
    try:
        parts = shlex.split(args)
    except ValueError as exc:
        raise TaskLoadError(f"Dockerfile line {line}: cannot parse {args!r}: {exc}") from None
    if not parts:
        return {}
    if "=" not in parts[0]:
        key, _, value = args.strip().partition(" ")
        return {key: value.strip()}
    result: dict[str, str] = {}
    for p in parts:
        key, eq, value = p.partition("=")
        if not eq:
            raise TaskLoadError(f"Dockerfile line {line}: expected KEY=VALUE, found {p!r}")
        result[key] = value
    return result


def parse_dockerfile(text: str) -> Dockerfile:
    """Parse Dockerfile text. Raises `TaskUnsupportedError` for multi-stage builds."""
    df = Dockerfile()
    args: dict[str, str] = {}
    workdir = "/"
    from_count = 0
    for line, instr in _logical_lines(text):
        keyword, _, rest = instr.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        variables = {**args, **df.env}
        if keyword == "ARG":
            for k, v in _parse_kv(rest, line).items() if "=" in rest else [(rest, "")]:
                args.setdefault(k, _substitute(v, variables))
        elif keyword == "FROM":
            from_count += 1
            if from_count > 1:
                raise TaskUnsupportedError(
                    f"Dockerfile line {line}: multi-stage builds need a real image build; "
                    "use the docker backend"
                )
            tokens = [t for t in rest.split() if not t.startswith("--")]
            df.base_image = _substitute(tokens[0], args) if tokens else None
        elif keyword == "WORKDIR":
            path = _substitute(rest, variables).strip().strip('"')
            workdir = posixpath.normpath(posixpath.join(workdir, path))
            df.workdir = workdir
            df.steps.append(MkdirStep(workdir, line))
        elif keyword == "ENV":
            for k, v in _parse_kv(rest, line).items():
                df.env[k] = _substitute(v, {**args, **df.env})
        elif keyword == "USER":
            df.user = _substitute(rest, variables).strip() or None
        elif keyword in ("COPY", "ADD"):
            df.steps.append(_parse_copy(keyword, rest, line, workdir, variables))
        elif keyword == "RUN":
            command = rest
            if rest.startswith("["):
                try:
                    command = shlex.join(json.loads(rest))
                except (ValueError, TypeError):
                    pass
            df.steps.append(RunStep(command, workdir, dict(df.env), df.user, line))
        else:
            df.ignored.append(f"line {line}: {keyword}")
    if from_count == 0:
        raise TaskLoadError("Dockerfile has no FROM line")
    return df


def _parse_copy(
    keyword: str, rest: str, line: int, workdir: str, variables: dict[str, str]
) -> CopyStep:
    chown = chmod = None
    body = rest
    flags: list[str] = []
    while body.startswith("--"):
        flag, _, body = body.partition(" ")
        flags.append(flag)
        body = body.strip()
    for flag in flags:
        name, _, value = flag[2:].partition("=")
        if name == "from":
            raise TaskUnsupportedError(
                f"Dockerfile line {line}: {keyword} --from copies from another image; "
                "use the docker backend"
            )
        if name == "chown":
            chown = value
        elif name == "chmod":
            chmod = value
    body = _substitute(body, variables)
    if body.startswith("["):
        try:
            items = [str(x) for x in json.loads(body)]
        except ValueError as exc:
            raise TaskLoadError(f"Dockerfile line {line}: bad JSON form: {exc}") from None
    else:
        items = shlex.split(body)
    if len(items) < 2:
        raise TaskLoadError(f"Dockerfile line {line}: {keyword} needs a source and a destination")
    *sources, dest = items
    for src in sources:
        if "://" in src:
            raise TaskUnsupportedError(
                f"Dockerfile line {line}: {keyword} of a URL ({src}) needs the network at build"
            )
    trailing = dest.endswith("/")
    dest_abs = posixpath.normpath(posixpath.join(workdir, dest))
    if trailing and dest_abs != "/":
        dest_abs += "/"
    return CopyStep(sources, dest_abs, chown, chmod, line)
