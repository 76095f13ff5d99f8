"""Everything sandgym does with a task's Dockerfile, one module a job:

- `parse`: Dockerfile text -> `Dockerfile` (steps: WORKDIR, COPY/ADD, RUN; ENV, USER, base image);
- `heredoc`: heredoc instructions rewritten as one-line ones for builders without BuildKit;
- `images`: `FROM`/`COPY --from` image mapping, and the rewritten build context a builder gets;
- `load`: a task's Dockerfile read and parsed (cached), strictly or as far as a spec needs;
- `apply`: the Dockerfile applied to a running sandbox on backends that build no image.

Nothing here runs a task's code except `apply`'s RUN lines, and only when the spec opts in.
"""

from sandgym.tasks.dockerfile.apply import apply_dockerfile
from sandgym.tasks.dockerfile.heredoc import has_heredoc, rewrite_heredocs
from sandgym.tasks.dockerfile.images import map_images, needs_rewrite, rewritten_context
from sandgym.tasks.dockerfile.load import spec_dockerfile, task_dockerfile
from sandgym.tasks.dockerfile.parse import (
    CopyStep,
    Dockerfile,
    MkdirStep,
    RunStep,
    Step,
    parse_dockerfile,
)

__all__ = [
    "CopyStep",
    "Dockerfile",
    "MkdirStep",
    "RunStep",
    "Step",
    "apply_dockerfile",
    "has_heredoc",
    "map_images",
    "needs_rewrite",
    "parse_dockerfile",
    "rewrite_heredocs",
    "rewritten_context",
    "spec_dockerfile",
    "task_dockerfile",
]
