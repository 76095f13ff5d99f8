"""Tamper reports: which of the paths an episode's agent changed can the verifier execute or
import before it writes its reward.

The verifier of a Harbor task runs in the environment the agent just used: a program it calls,
a module it imports, a startup file its interpreter reads or a tool it installs from a cache can
be the agent's. The sandbox backend says which paths changed (`Sandbox.changed_paths`, read by
the engine or the host, never by a program in the sandbox); `mark_baseline` records them when the
episode's set-up is done, so that what the task itself wrote is not the agent's; `tamper_report`
then keeps the agent's changes that fall in one of `CATEGORIES` (`classify`), or are links into
what only the verifier has (`LINK_TARGETS`: `verifier_links`), and are not among the
paths the task says its solution changes (`metadata.expected_changes` in task.toml, glob
patterns). A task that declares its outputs (`metadata.outputs`) also has its other files under
the working directory watched: a modified or deleted one there is `task_inputs`.

Where a backend has no change set (e2b), the report says `checked: false` and why.

What a report cannot see: a process the agent left running that changes a path after the report
was taken (the report is taken just before the verifier starts); a change to what a task's own
set-up wrote that keeps the same fingerprint (docker: a file over 4 MiB rewritten with its old
size and mtime); and anything outside the categories (a test that reads a file of the agent's
whose content it trusts). The last is what `sandgym.tasks.tamper_trace` adds after the verifier's
run: each changed file the run opened (`verifier_opened`), or, where the run cannot be traced,
the changes `FALLBACK_CATEGORIES` and the sandbox's PATH name (`TamperReport.trace` says which).
See docs/verification.md.
"""

from __future__ import annotations

import fnmatch
import posixpath
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from sandgym.sandboxes import Sandbox
from sandgym.sandboxes.errors import ChangesUnsupportedError
from sandgym.sandboxes.spec import PathChanges
from sandgym.tasks.errors import TaskError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.paths import AGENT_LOGS, ARTIFACTS_DIR

Change = Literal["created", "modified", "deleted"]
Category = Literal[
    "verifier_mounts",
    "python_startup",
    "loader",
    "executables",
    "python_import_path",
    "runtime_modules",
    "test_tools",
    "package_manager",
    "environment_files",
    "task_inputs",
    "verifier_links",
    "verifier_opened",
    "search_path",
    "tool_stores",
    "name_resolution",
    "git_files",
    "certificates",
]

#: the home directories whose dotfiles, caches and user site-packages a verifier reads
_HOMES = ("/root", "/home/*")


def _in_homes(*rels: str) -> tuple[str, ...]:
    return tuple(f"{h}/{r}" for h in _HOMES for r in rels)


#: (category, glob patterns): `*` matches within one path component, `**` any number of them.
#: The first category that matches a path is its category.
CATEGORIES: tuple[tuple[Category, tuple[str, ...]], ...] = (
    # where the tests are copied and the reward is written
    ("verifier_mounts", ("/tests", "/tests/**", "/logs", "/logs/verifier", "/logs/verifier/**")),
    # files every Python process reads at start-up, wherever they are put
    (
        "python_startup",
        (
            "**/*.pth",
            "**/sitecustomize.py",
            "**/usercustomize.py",
            "**/__pycache__/sitecustomize.*.pyc",
            "**/__pycache__/usercustomize.*.pyc",
            *_in_homes(".local/lib/**", ".pythonrc", ".pythonrc.py", ".pythonstartup"),
        ),
    ),
    # the dynamic loader's settings and the shared libraries it loads
    (
        "loader",
        (
            "/etc/ld.so.preload",
            "/etc/ld.so.conf",
            "/etc/ld.so.conf.d/**",
            "/etc/ld.so.cache",
            "/etc/nsswitch.conf",
            "/lib/**",
            "/lib32/**",
            "/lib64/**",
            "/libx32/**",
            "/usr/lib/*-linux-gnu/**",
            "/usr/lib/*.so*",
            "/usr/local/lib/*.so*",
            "/usr/local/lib/**/*.so*",
        ),
    ),
    # every program on PATH, interpreters included, and what selects them
    (
        "executables",
        (
            "/usr/local/sbin/**",
            "/usr/local/bin/**",
            "/usr/sbin/**",
            "/usr/bin/**",
            "/sbin/**",
            "/bin/**",
            "/etc/alternatives/**",
            "/usr/libexec/**",
            "/usr/lib/git-core/**",
            *_in_homes(".local/bin/**", "bin/**", ".cargo/bin/**"),
        ),
    ),
    # Python's import path: the standard library and every site-packages
    (
        "python_import_path",
        (
            "/usr/lib/python*/**",
            "/usr/local/lib/python*/**",
            "/usr/share/python*/**",
            "/opt/**/site-packages/**",
            "/opt/**/dist-packages/**",
            "**/conftest.py",
            "**/pytest.ini",
            "/pyproject.toml",
            "/setup.cfg",
            "/tox.ini",
            "/setup.py",
        ),
    ),
    # other runtimes' module paths (node, perl, ruby, the JVM's), and the rest of /usr/lib
    (
        "runtime_modules",
        (
            "/usr/lib/**",
            "/usr/local/lib/**",
            "/usr/share/perl*/**",
            "/usr/local/share/perl*/**",
            "/etc/perl/**",
            "/usr/share/ruby*/**",
            "/usr/share/java/**",
            *_in_homes(".node_modules/**", ".node_libraries/**", ".gem/**", "perl5/**"),
        ),
    ),
    # the tools a verifier installs or runs from a cache, and their configuration
    (
        "test_tools",
        (
            *_in_homes(
                ".cache/**",
                ".config/pip/**",
                ".config/uv/**",
                ".pip/**",
                ".pydistutils.cfg",
                ".npmrc",
                ".npm/**",
                ".yarnrc",
                ".cargo/**",
                ".rustup/**",
                ".gitconfig",
                ".config/git/**",
                ".curlrc",
                ".wgetrc",
            ),
            "/etc/pip.conf",
            "/etc/xdg/pip/**",
            "/etc/uv/**",
            "/etc/gitconfig",
            "/usr/local/etc/**",
            "/etc/wgetrc",
            "/tmp/uv-*/**",
        ),
    ),
    # how the verifier installs packages (apt's sources, lists, cache; dpkg's database)
    (
        "package_manager",
        ("/etc/apt/**", "/var/lib/apt/**", "/var/cache/apt/**", "/var/lib/dpkg/**", "/etc/dpkg/**"),
    ),
    # environment, shell start-up and account files
    (
        "environment_files",
        (
            "/etc/environment",
            "/etc/profile",
            "/etc/profile.d/**",
            "/etc/bash.bashrc",
            "/etc/bashrc",
            "/etc/zsh/**",
            "/etc/security/pam_env.conf",
            "/etc/default/locale",
            "/etc/passwd",
            "/etc/group",
            "/etc/shadow",
            "/etc/sudoers",
            "/etc/sudoers.d/**",
            "/etc/shells",
            *_in_homes(
                ".bashrc",
                ".bash_profile",
                ".bash_login",
                ".profile",
                ".zshenv",
                ".zshrc",
                ".pam_environment",
                ".env",
            ),
        ),
    ),
)

#: what the verifier may run or read beyond `CATEGORIES`, named where its run cannot be traced
#: (`sandgym.tasks.tamper_trace`: inotify unavailable, or the pristine mode, whose verifier runs
#: apart from the agent's files); the sandbox's own PATH directories are added to these then
#: (category `search_path`)
FALLBACK_CATEGORIES: tuple[tuple[Category, tuple[str, ...]], ...] = (
    (
        "tool_stores",
        (
            *_in_homes(".local/share/uv/**", ".local/share/pipx/**", ".pyenv/**", ".nvm/**"),
            "/opt/conda/**",
            "/usr/local/cargo/**",
            "/usr/local/go/**",
            "/usr/local/rustup/**",
        ),
    ),
    (
        "name_resolution",
        ("/etc/hosts", "/etc/resolv.conf", "/etc/host.conf", "/etc/gai.conf", "/etc/hostname"),
    ),
    ("git_files", ("**/.git/hooks/**", "**/.git/config", "**/.gitattributes", "**/.git/info/**")),
    (
        "certificates",
        (
            "/etc/ssl/**",
            "/etc/ca-certificates/**",
            "/etc/ca-certificates.conf",
            "/usr/local/share/ca-certificates/**",
            "/usr/share/ca-certificates/**",
            "/etc/pki/**",
        ),
    ),
)
#: files the engine mounts into a container (not in its diff): fingerprinted at the baseline, so
#: that an agent's change to them enters its change set
ENGINE_MOUNTED_FILES = ("/etc/hosts", "/etc/resolv.conf", "/etc/hostname")

#: modules a `python -m pytest` (or any `python -m` / `-c`) run from the working directory would
#: import from there first: the standard library's and the test tools'
SHADOWED_MODULES = (frozenset(sys.stdlib_module_names) - {"test", "this", "antigravity"}) | {
    "pytest",
    "_pytest",
    "pluggy",
    "iniconfig",
    "packaging",
    "py",
}


def _shadows_module(rel: str) -> bool:
    """Whether `rel` (a path under the working directory) is a module that a Python started
    there would import instead of the standard library's or a test tool's: `json.py`,
    `pytest/__init__.py`, `json.cpython-311-x86_64-linux-gnu.so` (a directory without
    `__init__.py` shadows nothing: the regular package later on the path wins)."""
    parts = rel.split("/")
    if len(parts) == 2 and parts[1] in ("__init__.py", "__init__.pyc"):
        return parts[0] in SHADOWED_MODULES
    if len(parts) != 1:
        return False
    name = parts[0]
    for suffix in (".py", ".pyc", ".so"):
        if name.endswith(suffix):
            return name[: -len(suffix)].split(".", 1)[0] in SHADOWED_MODULES
    return False


def _match_parts(pattern: list[str], path: list[str]) -> bool:
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and _match_parts(rest, path[1:])


def path_matches(pattern: str, path: str) -> bool:
    """Whether `path` matches the glob `pattern` (`*` within a component, `**` across them; a
    pattern without a leading `/` matches at any depth)."""
    parts = [p for p in path.split("/") if p]
    pat = [p for p in pattern.split("/") if p]
    if not pattern.startswith("/"):
        pat = ["**", *pat]
    return _match_parts(pat, parts)


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def classify(
    path: str, change: Change, workdir: str, outputs: tuple[str, ...] = ()
) -> Category | None:
    """The category of an agent's change at `path`, or None when the verifier has no reason to
    run or import it. `outputs`: the task's declared outputs (then a modified or deleted file
    under `workdir` outside them is `task_inputs`)."""
    if _under(path, AGENT_LOGS) or _under(path, ARTIFACTS_DIR):
        return None
    for category, patterns in CATEGORIES:
        if any(path_matches(p, path) for p in patterns):
            return category
    if _under(path, workdir) and path != workdir.rstrip("/"):
        if _shadows_module(path[len(workdir.rstrip("/")) + 1 :]):
            return "python_import_path"  # `python -m pytest` in the working directory imports it
        if outputs and change != "created" and not any(_under(path, o) for o in outputs):
            return "task_inputs"
    return None


def classify_fallback(path: str, search_path: tuple[str, ...] = ()) -> Category | None:
    """The category of a change the list of `CATEGORIES` leaves out, for a report made without
    a trace of the verifier: `FALLBACK_CATEGORIES`, or a file in one of `search_path` (the
    sandbox's own PATH directories) or below it."""
    for category, patterns in FALLBACK_CATEGORIES:
        if any(path_matches(p, path) for p in patterns):
            return category
    if any(_under(path, d) and path != d.rstrip("/") for d in search_path if d.startswith("/")):
        return "search_path"
    return None


def _str_list(task: TaskSpec, key: str) -> tuple[str, ...]:
    raw = task.metadata.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(x, str) and x.startswith("/") for x in raw):
        raise TaskError(
            f"task {task.id}: metadata.{key} must be a list of absolute paths (globs allowed), "
            f"found {raw!r}"
        )
    return tuple(posixpath.normpath(x) for x in raw)


def expected_changes(task: TaskSpec) -> tuple[str, ...]:
    """`metadata.expected_changes`: glob patterns of sensitive paths the task's solution is
    expected to change (installing a package the task asks for); never reported."""
    return _str_list(task, "expected_changes")


def declared_outputs(task: TaskSpec) -> tuple[str, ...]:
    """`metadata.outputs`: the paths the agent's answer lives at (files or directories). The
    pristine verifier copies only these; empty: the agent's changes under the working directory."""
    return _str_list(task, "outputs")


class TamperedPath(BaseModel):
    """One path the agent changed that the verifier can execute or import."""

    model_config = ConfigDict(extra="forbid")

    path: str
    change: Change
    category: Category


class TraceSummary(BaseModel):
    """How the report knows what the verifier ran or read (`TamperReport.trace`)."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["inotify", "paths"] = Field(
        description="inotify: the verifier's run was traced (the agent's files it opened are "
        "`verifier_opened`); paths: it was not, and the agent's changes were classed by "
        "`FALLBACK_CATEGORIES` and the sandbox's PATH instead"
    )
    watched: int = Field(0, description="inotify: the agent's files watched during the run")
    opened: int = Field(0, description="inotify: how many of them the run opened")
    unwatched: int = Field(
        0, description="inotify: files that could not be watched (classed by paths)"
    )
    overflow: bool = Field(False, description="inotify: events were lost (all watched counted)")
    search_path: list[str] = Field(
        default_factory=list, description="paths: the sandbox's PATH directories used"
    )
    note: str | None = Field(None, description="why this method (when not inotify)")


class TamperReport(BaseModel):
    """The tamper report of one scored episode (`info.tamper` on the wire)."""

    model_config = ConfigDict(extra="forbid")

    checked: bool = Field(description="the backend listed the changed paths (else see `reason`)")
    tampered: bool = Field(False, description="some path below was changed by the agent")
    paths: list[TamperedPath] = Field(
        default_factory=list, description="the tampered paths (the first MAX_LISTED of them)"
    )
    count: int = Field(0, description="how many tampered paths there are in all")
    changed: int = Field(0, description="how many paths the agent changed in all")
    expected: int = Field(
        0, description="sensitive paths left out because the task declares them expected"
    )
    reason: str | None = Field(None, description="checked: false: why there is no report")
    trace: TraceSummary | None = Field(
        None,
        description="how the verifier's own reads were followed (absent: only `CATEGORIES`)",
    )
    #: the agent's changes the report was made from (not on the wire)
    _changes: dict[str, Change] = PrivateAttr(default_factory=dict)

    def summary(self, limit: int = 5) -> str:
        if not self.checked:
            return f"tamper report unavailable: {self.reason}"
        if not self.tampered:
            return "no tampering seen"
        shown = ", ".join(f"{p.path} ({p.change}, {p.category})" for p in self.paths[:limit])
        more = f" and {self.count - limit} more" if self.count > limit else ""
        return f"the agent changed {self.count} path(s) the verifier runs or reads: {shown}{more}"


#: where a link of the agent's must not lead: the tests and reward files the verifier brings, and
#: what is different in every process (a link to /proc/self/... reads the verifier's own files)
LINK_TARGETS = ("/tests", "/logs/verifier", "/proc", "/dev/fd", "/dev/stdin")
#: at most this many of the agent's new files are checked for links (`verifier_links`)
MAX_LINK_CHECKS = 500
#: a report lists at most this many paths (its `count` has them all)
MAX_LISTED = 100
#: a baseline fingerprints at most this many paths the set-up wrote (the sensitive ones first)
MAX_BASELINE_FINGERPRINTS = 500


class ChangeBaseline(BaseModel):
    """The sandbox's changed paths when the episode's set-up was done, and the fingerprints of
    the sensitive ones among them (so that a later change to them is still seen)."""

    kinds: dict[str, Change] = Field(default_factory=dict)
    fingerprints: dict[str, str | None] = Field(default_factory=dict)


def _sensitive(path: str, change: Change, workdir: str, outputs: tuple[str, ...]) -> bool:
    return classify(path, change, workdir, outputs) is not None


async def mark_baseline(task: TaskSpec, sandbox: Sandbox, workdir: str) -> ChangeBaseline | None:
    """What the sandbox changed so far (the task's set-up), or None when its backend cannot say."""
    try:
        kinds = (await sandbox.changed_paths()).kinds()
    except ChangesUnsupportedError:
        return None
    outputs = declared_outputs(task)
    # a later change to any of these would be reported: fingerprint them now
    watch = [p for p in kinds if _sensitive(p, "modified", workdir, outputs)]
    # and any other file the set-up wrote outside the answers (a COPY on an image-less backend):
    # the trace names what the verifier opened only among the agent's changes
    answers = outputs or (workdir,)
    watch += [
        p
        for p, k in kinds.items()
        if k != "deleted" and p not in watch and not any(_under(p, a) for a in answers)
    ]
    watch = [*ENGINE_MOUNTED_FILES, *watch[:MAX_BASELINE_FINGERPRINTS]]
    fps = await sandbox.path_fingerprints(watch) if watch else {}
    return ChangeBaseline(kinds=kinds, fingerprints=fps)  # type: ignore[arg-type]


async def engine_baseline(sandbox: Sandbox) -> ChangeBaseline:
    """The baseline of a sandbox nothing was written to since its image: no changed paths, and
    the fingerprints of the files the engine mounts into it (`ENGINE_MOUNTED_FILES`)."""
    fps = await sandbox.path_fingerprints(list(ENGINE_MOUNTED_FILES))
    return ChangeBaseline(fingerprints=fps)


def _has_below(path: str, parents: set[str]) -> bool:
    return any(p == path or p.startswith(path + "/") for p in parents)


def _agent_changes(base: ChangeBaseline, now: PathChanges) -> dict[str, Change]:
    """The changes since the baseline, but for the baseline's fingerprinted paths (compared by
    `tamper_report`)."""
    out: dict[str, Change] = {}
    for path, kind in now.kinds().items():
        if path not in base.kinds:
            out[path] = kind  # type: ignore[assignment]
        elif base.kinds[path] != kind and path not in base.fingerprints:
            out[path] = kind  # type: ignore[assignment]
    return out


async def tamper_report(
    task: TaskSpec,
    sandbox: Sandbox,
    baseline: ChangeBaseline | None,
    workdir: str,
    now: PathChanges | None = None,
) -> TamperReport:
    """The episode's tamper report (see the module docstring); `now`: the sandbox's changed
    paths, when the caller already has them."""
    if baseline is None:
        return TamperReport(
            checked=False,
            reason=f"the {sandbox.backend_name} backend cannot list the paths a sandbox changed",
        )
    if now is None:
        try:
            now = await sandbox.changed_paths()
        except ChangesUnsupportedError as exc:
            return TamperReport(checked=False, reason=str(exc))
    outputs = declared_outputs(task)
    changes = _agent_changes(baseline, now)
    if baseline.fingerprints:  # what the set-up wrote there, changed again since
        again = await sandbox.path_fingerprints(list(baseline.fingerprints))
        for path, fp in again.items():
            if fp != baseline.fingerprints[path]:
                changes[path] = "deleted" if fp is None else "modified"
    expected = expected_changes(task)
    categories = {p: classify(p, changes[p], workdir, outputs) for p in changes}
    # a link of the agent's into what only the verifier has (an answer linked to the expected one)
    plain = [p for p, c in categories.items() if c is None and changes[p] != "deleted"]
    links = await sandbox.read_links(plain[:MAX_LINK_CHECKS]) if plain else {}
    for path, target in links.items():
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if any(_under(resolved, t) for t in LINK_TARGETS):
            categories[path] = "verifier_links"
    found: list[TamperedPath] = []
    skipped = 0
    for path in sorted(changes):
        category = categories[path]
        if category is None:
            continue
        if any(path_matches(p, path) for p in expected):
            skipped += 1
            continue
        found.append(TamperedPath(path=path, change=changes[path], category=category))
    # a directory the agent created is named by what it put in it
    below = {posixpath.dirname(t.path) for t in found}
    found = [t for t in found if not (t.change == "created" and _has_below(t.path, below))]
    report = TamperReport(
        checked=True,
        tampered=bool(found),
        paths=found[:MAX_LISTED],
        count=len(found),
        changed=len(changes),
        expected=skipped,
    )
    report._changes = changes
    return report
