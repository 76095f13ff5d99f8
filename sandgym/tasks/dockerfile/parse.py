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

import functools
import json
import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from sandgym.tasks.dockerfile.base_env import BaseEnv, base_image_env
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
    #: lines left out because they use a variable sandgym cannot expand without building the
    #: image (each names the variable, the line and the base image): refused where no image is
    #: built, harmless where one is (the image's own configuration is used there)
    unresolved: list[str] = field(default_factory=list)

    @property
    def run_steps(self) -> list[RunStep]:
        return [s for s in self.steps if isinstance(s, RunStep)]


_VAR = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])([^}]*))?\}"  # ${V} ${V:-w} ${V-w} ${V:+w} ${V+w}
    r"|\{([^}]*)\}"  # ${...} with a modifier Docker's builders do not share (${V:?w}, ${V#p})
    r"|([A-Za-z_][A-Za-z0-9_]*))"  # $V
)


class UnknownVariableError(Exception):
    """A `$VAR` the parser cannot expand: neither an earlier ARG or ENV line nor the base
    image's known environment (`sandgym.tasks.dockerfile.base_env`) sets it."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(name)
        self.name = name
        self.why = why


@dataclass
class _Scope:
    """The variables a line can use: the base image's known environment, then the Dockerfile's
    ARG (None: declared without a value, so unset) and ENV lines so far."""

    base: BaseEnv | None = None
    image: str | None = None  # the FROM line's image
    args: dict[str, str | None] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    #: variables whose ARG or ENV line could not be expanded: using one is refused in turn
    poisoned: dict[str, str] = field(default_factory=dict)

    def lookup(self, name: str) -> str | None:
        """The value of `name` (None: known to be unset); raises UnknownVariableError."""
        if name in self.poisoned:
            raise UnknownVariableError(name, self.poisoned[name])
        if name in self.env:
            return self.env[name]
        if name in self.args:
            return self.args[name]
        if self.base is None:
            raise UnknownVariableError(
                name,
                f"no ARG or ENV line before it sets it, and base image {self.image!r} is not one "
                "sandgym knows the environment of",
            )
        if name in self.base.unknowable:
            raise UnknownVariableError(
                name,
                f"base image {self.image!r} sets it, but its value is not in the image's name "
                "(and no ARG or ENV line before it sets it)",
            )
        return self.base.env.get(name)  # one the image does not set: unset, as docker build has


def _substitute(text: str, scope: _Scope) -> str:
    """`text` with `$VAR`, `${VAR}`, `${VAR:-word}`, `${VAR-word}`, `${VAR:+word}` and
    `${VAR+word}` expanded by Docker's rules (with the colon an empty value counts as unset;
    `word` is expanded in turn). Raises UnknownVariableError for what it cannot know."""

    def repl(m: re.Match[str]) -> str:
        if m.group(4) is not None:
            raise UnknownVariableError(
                m.group(0),
                "a substitution form the classic builder and BuildKit do not share (expected "
                "$V, ${V}, ${V:-word}, ${V-word}, ${V:+word} or ${V+word})",
            )
        name = m.group(1) or m.group(5)
        op, word = m.group(2), m.group(3)
        if op is None:
            return scope.lookup(name) or ""
        # `${V:-w}` needs V only where it is set; an unknowable V is still refused
        value = scope.lookup(name)
        is_set = value is not None and (value != "" or not op.startswith(":"))
        if op.endswith("-"):
            return value if is_set and value is not None else _substitute(word, scope)
        return _substitute(word, scope) if is_set else ""

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
    """Parse Dockerfile text. Raises `TaskUnsupportedError` for multi-stage builds. A variable
    it cannot expand (`_Scope.lookup`) leaves its line out and is named in
    `Dockerfile.unresolved`, which backends that build no image refuse."""
    df = Dockerfile()
    scope = _Scope()
    workdir = "/"
    from_count = 0

    def expand(value: str, line: int, keyword: str, record: bool = True) -> str | None:
        try:
            return _substitute(value, scope)
        except UnknownVariableError as exc:
            var = exc.name if exc.name.startswith("$") else f"${exc.name}"
            why = (
                f"Dockerfile line {line}: {keyword} uses {var}, which sandgym cannot expand "
                f"without building the image: {exc.why}"
            )
            if record:
                df.unresolved.append(why)
            last_error[0] = why
            return None

    last_error = [""]

    for line, instr in _logical_lines(text):
        keyword, _, rest = instr.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "ARG":
            pairs = _parse_kv(rest, line).items() if "=" in rest else [(rest, None)]
            for k, v in pairs:
                if k in scope.args and scope.args[k] is not None:
                    continue  # a redeclared ARG keeps its value (a global one in its stage)
                value = None if v is None else expand(v, line, keyword, record=False)
                if v is not None and value is None:  # refused where it is used, if it is
                    scope.poisoned[k] = last_error[0]
                else:
                    scope.poisoned.pop(k, None)
                    scope.args[k] = value
        elif keyword == "FROM":
            from_count += 1
            if from_count > 1:
                raise TaskUnsupportedError(
                    f"Dockerfile line {line}: multi-stage builds need a real image build; "
                    "use the docker backend"
                )
            tokens = [t for t in rest.split() if not t.startswith("--")]
            df.base_image = expand(tokens[0], line, keyword) if tokens else None
            scope.image, scope.base = df.base_image, base_image_env(df.base_image)
        elif keyword == "WORKDIR":
            path = expand(rest, line, keyword)
            if path is None:
                continue
            workdir = posixpath.normpath(posixpath.join(workdir, path.strip().strip('"')))
            df.workdir = workdir
            df.steps.append(MkdirStep(workdir, line))
        elif keyword == "ENV":
            for k, v in _parse_kv(rest, line).items():
                value = expand(v, line, keyword)
                if value is None:  # left out of the environment, and refused where it is used
                    scope.poisoned[k] = last_error[0]
                    df.env.pop(k, None)
                    scope.env.pop(k, None)
                else:
                    scope.poisoned.pop(k, None)
                    df.env[k] = scope.env[k] = value
        elif keyword == "USER":
            user = expand(rest, line, keyword)
            if user is not None:
                df.user = user.strip() or None
        elif keyword in ("COPY", "ADD"):
            step = _parse_copy(
                keyword, rest, line, workdir, functools.partial(expand, line=line, keyword=keyword)
            )
            if step is not None:
                df.steps.append(step)
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
    keyword: str, rest: str, line: int, workdir: str, expand: Callable[[str], str | None]
) -> CopyStep | None:
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
    expanded = expand(body)
    if expanded is None:
        return None
    body = expanded
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
