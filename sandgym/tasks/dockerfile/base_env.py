"""What the base images a task's Dockerfile starts `FROM` put in the environment, as far as
sandgym knows it without pulling them: the table `$VAR` / `${VAR}` in a Dockerfile's `ENV`,
`WORKDIR`, `USER` and `COPY` lines are expanded from on backends that build no image (local; E2B
without a template). On a backend that builds the image the image's own configuration is the
truth and none of this is used (`SandboxSpec.own_env`).

Each family lists the whole environment its public image sets (`docker image inspect`'s
`Config.Env`, from the families' released Dockerfiles, and what `lab/images.py`'s stand-ins
reproduce), so a variable it does not set is "" as `docker build` makes it; a variable the
image sets but sandgym cannot know from its name alone (`PYTHON_VERSION` of `python:3.13-slim`,
which follows the newest patch release; `GPG_KEY`, `PYTHON_SHA256`) is `unknowable`: a line using
it is refused by name, as is any variable of a base image not in the table."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: the PATH Docker gives an image that sets none, and what Debian's and Ubuntu's images set
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: the official python images: `ENV PATH /usr/local/bin:$PATH` over Debian's
PYTHON_PATH = "/usr/local/bin:" + DEFAULT_PATH


@dataclass(frozen=True)
class BaseEnv:
    """A base image's environment as far as sandgym knows it."""

    image: str
    env: dict[str, str]
    #: variables the image sets whose value its name does not tell
    unknowable: frozenset[str] = field(default_factory=frozenset)


#: sandgym's own images (images/terminal, images/desktop): their Dockerfiles' ENV over the base
_SANDGYM_TERMINAL = {
    "PATH": DEFAULT_PATH,
    "LANG": "C.UTF-8",
    "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
    "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt",
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "TERM": "xterm-256color",
}

_PYTHON_TAG = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:[-.].*)?$")


def _repository(image: str) -> tuple[str, str]:
    """`(repository, tag)` of an image reference, Docker Hub's `library/` prefixes dropped."""
    ref = image.split("@", 1)[0]
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    for prefix in ("docker.io/library/", "index.docker.io/library/", "library/", "docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name, tag or "latest"


def _python_env(image: str, tag: str) -> BaseEnv:
    env = {"PATH": PYTHON_PATH, "LANG": "C.UTF-8"}
    unknowable = {"GPG_KEY", "PYTHON_SHA256"}
    m = _PYTHON_TAG.match(tag)
    if m is not None and m.group(3) is not None:
        env["PYTHON_VERSION"] = f"{m.group(1)}.{m.group(2)}.{m.group(3)}"
    else:  # `python:3.13-slim` follows the newest 3.13 release: its patch is not in the name
        unknowable.add("PYTHON_VERSION")
    return BaseEnv(image, env, frozenset(unknowable))


def base_image_env(image: str | None) -> BaseEnv | None:
    """The known environment of base image `image` (as a `FROM` line names it), or None when
    sandgym does not know the image."""
    if not image:
        return None
    name, tag = _repository(image)
    if name in ("debian", "ubuntu"):
        return BaseEnv(image, {"PATH": DEFAULT_PATH})
    if name == "python":
        return _python_env(image, tag)
    if name == "ghcr.io/laude-institute/t-bench/ubuntu-24-04":
        return BaseEnv(image, {"PATH": DEFAULT_PATH})
    if name == "ghcr.io/laude-institute/t-bench/python-3-13":
        return _python_env(image, "3.13-slim-bookworm")
    if name == "sandgym/terminal":
        return BaseEnv(image, dict(_SANDGYM_TERMINAL))
    if name == "sandgym/base":  # images/bootstrap-base.sh: Debian minbase and the CA bundle
        keep = ("PATH", "LANG", "SSL_CERT_FILE", "PIP_CERT")
        return BaseEnv(image, {k: _SANDGYM_TERMINAL[k] for k in keep})
    if name == "sandgym/desktop":
        return BaseEnv(image, {**_SANDGYM_TERMINAL, "DISPLAY": ":99"})
    return None
