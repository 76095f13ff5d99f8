"""Base-image mapping in a Dockerfile, for backends that build it: every stage's `FROM IMAGE` and
every `COPY --from=IMAGE` named in an image map (FROM -> TO) replaced by a local image, and the
build context copied with that Dockerfile (and its heredocs and multi-source `COPY`s rewritten for
the classic builder, `sandgym.tasks.dockerfile.heredoc` and `.copy_dest`), cached by content."""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from sandgym.sandboxes.common.hashing import hash_directory
from sandgym.tasks.cache import cached_tree
from sandgym.tasks.dockerfile.copy_dest import copy_destinations
from sandgym.tasks.dockerfile.heredoc import has_heredoc, rewrite_heredocs
from sandgym.tasks.models import TaskSpec

log = logging.getLogger(__name__)

_COPY_FROM = re.compile(r"(--from=)(\S+)")
#: where a rewritten context holds the task files a compose bind mount names
MOUNTS_DIR = ".sandgym-mounts"


def map_images(text: str, image_map: Mapping[str, str]) -> str:
    """Every stage's `FROM IMAGE` and every `COPY --from=IMAGE` named in `image_map`, replaced
    (stage names, `AS` aliases and flags are kept)."""
    out = []
    for line in text.splitlines():
        tokens = line.split()
        if tokens and tokens[0].upper() == "FROM":
            for j in range(1, len(tokens)):
                if not tokens[j].startswith("--"):
                    if tokens[j] in image_map:
                        tokens[j] = image_map[tokens[j]]
                        line = " ".join(tokens)
                    break
        elif tokens and tokens[0].upper() in ("COPY", "ADD") and "--from=" in line:
            line = _COPY_FROM.sub(
                lambda m: m.group(1) + image_map.get(m.group(2), m.group(2)), line
            )
        out.append(line)
    return "\n".join(out) + "\n"


def needs_rewrite(text: str, image_map: Mapping[str, str], context: Path | None = None) -> bool:
    """Whether the Dockerfile text has a heredoc, an image `image_map` maps, or a `COPY` of
    several sources into a destination without its slash (`sandgym.tasks.dockerfile.copy_dest`)."""
    return (
        has_heredoc(text)
        or map_images(text, image_map) != "\n".join(text.splitlines()) + "\n"
        or bool(copy_destinations(text, context)[1])
    )


def rewritten_context(task: TaskSpec, image_map: Mapping[str, str]) -> Path:
    """A copy of the build context whose Dockerfile has its images mapped (`map_images`) and
    its heredocs rewritten for the classic builder (`sandgym.tasks.dockerfile.heredoc`); cached by
    content."""
    env = task.environment
    assert env.build_context is not None
    context = env.build_context
    text = (context / env.dockerfile).read_text(encoding="utf-8")
    new_text = copy_destinations(rewrite_heredocs(map_images(text, image_map)), context)[0]

    mounted = ""
    for i, (src, target) in enumerate(env.bind_mounts):
        # a compose bind mount of the task's own files: what the container sees at start
        where = f"{MOUNTS_DIR}/{i}/" + ("" if src.is_dir() else src.name)
        new_text = new_text.rstrip("\n") + f"\nCOPY {where} {target}\n"
        mounted += (
            hash_directory(src) if src.is_dir() else hashlib.sha256(src.read_bytes()).hexdigest()
        )
    digest = hashlib.sha256((hash_directory(context) + mounted + new_text).encode()).hexdigest()[
        :16
    ]

    def fill(tmp: Path) -> None:
        shutil.copytree(context, tmp, symlinks=True)
        (tmp / env.dockerfile).write_text(new_text, encoding="utf-8")
        for i, (src, _) in enumerate(env.bind_mounts):
            dst = tmp / MOUNTS_DIR / str(i)
            if src.is_dir():
                shutil.copytree(src, dst, symlinks=True)
            else:
                dst.mkdir(parents=True)
                shutil.copy2(src, dst / src.name)

    dest = cached_tree("contexts", task.id, digest, fill)
    log.debug("task %s: build context rewritten (images mapped, heredocs) at %s", task.id, dest)
    return dest
