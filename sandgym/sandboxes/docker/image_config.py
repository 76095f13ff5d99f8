"""The image's own configuration is the truth on docker: a sandbox's environment and working
directory come from `docker image inspect`'s Config (`Env`, `WorkingDir`) of the image it runs,
built from the task's Dockerfile or named, and not from sandgym's parse of that Dockerfile (which
serves only backends that build no image). The spec's own variables (`SandboxSpec.own_env`: a
task's `[environment].env`) are laid over the image's; its user is the image's `User` unless the
spec names one (the engine's rule for a container and an exec created without a user)."""

from __future__ import annotations

from typing import Any

from sandgym.sandboxes.spec import SandboxSpec


def image_env(config: dict[str, Any]) -> dict[str, str]:
    """An image Config's `Env` (`["K=V", ...]`) as a dict."""
    out: dict[str, str] = {}
    for item in config.get("Env") or []:
        key, _, value = str(item).partition("=")
        out[key] = value
    return out


def needs_image_config(spec: SandboxSpec) -> bool:
    """Whether `spec_over_image` would read the image's config (else the spec is all its own)."""
    return spec.own_env is not None or not spec.own_workdir


def spec_over_image(
    spec: SandboxSpec, config: dict[str, Any], between: dict[str, str] | None = None
) -> SandboxSpec:
    """The spec a sandbox of `spec` runs under on an image whose Config is `config`: its `env`
    the image's environment, then `between` (sandgym's own: the egress proxy's variables), then
    `own_env` (a Dockerfile's ENV as sandgym parsed it is dropped: the built image has the real
    one), its `workdir` the image's `WorkingDir` unless the spec names its own (`own_workdir`)
    or the image has none."""
    if not needs_image_config(spec):
        return spec
    update: dict[str, Any] = {}
    if spec.own_env is not None:
        update["env"] = {**image_env(config), **(between or {}), **spec.own_env}
    working_dir = str(config.get("WorkingDir") or "")
    if not spec.own_workdir and working_dir.startswith("/"):
        update["workdir"] = working_dir
    return spec.model_copy(update=update)
