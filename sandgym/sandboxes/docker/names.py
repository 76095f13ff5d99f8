"""Names the docker backend gives things: images, repositories, labels, mount points."""

from sandgym.sandboxes.private_exec import OWN_CONTAINER_ENV

DEFAULT_IMAGE = "sandgym/terminal:latest"
CTX_REPO = "sandgym/ctx"
#: where the per-container bridge directory appears inside the container
BRIDGE_MOUNT = "/run/sandgym"
DEFAULT_BRIDGE_ROOT = "/tmp/sandgym-bridge"
#: label naming a container's host bridge directory (so any reaper can remove it)
LABEL_BRIDGE_DIR = "sandgym.bridge_dir"
#: label on a verifier's container and its snapshot image: the id of the sandbox it scores
LABEL_VERIFIER_OF = "sandgym.verifier_of"
#: repository of the snapshot images verifiers run from (tag: the verifier container's name)
SNAPSHOT_REPO = "sandgym/verifier-snapshot"
#: a group's prepared sandbox, committed once (`DockerSandbox.snapshot`); its members start from it
GROUP_SNAPSHOT_REPO = "sandgym/group-snapshot"
LABEL_SNAPSHOT_OF = "sandgym.snapshot_of"
#: set in a verifier's own container, for sandgym/tasks/private_verify.py's wrapper (no mounts needed);
#: the name is the backend-neutral contract of `exec_private` (sandgym/sandboxes/private_exec.py)
VERIFIER_OWN_CONTAINER_ENV = OWN_CONTAINER_ENV
