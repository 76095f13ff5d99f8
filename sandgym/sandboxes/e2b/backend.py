"""`E2BBackend`: templates, creating and killing E2B sandboxes, and reaping them
by their metadata labels."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shlex
import time
import uuid
from typing import Any

from sandgym.sandboxes.base import SandboxBackend
from sandgym.sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES
from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.common.users import is_root_user
from sandgym.sandboxes.e2b.api import E2BApi, e2b_timeout_s
from sandgym.sandboxes.e2b.sandbox import E2BSandbox
from sandgym.sandboxes.errors import (
    BackendUnavailableError,
    SandboxCreateError,
    SandboxError,
    SandboxLostError,
)
from sandgym.sandboxes.health import ensure_healthy
from sandgym.sandboxes.labels import LABEL_MANAGED, should_reap
from sandgym.sandboxes.lifetime import first_deadline
from sandgym.sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)


DEFAULT_TEMPLATE = "sandgym-terminal"
#: Metadata key holding sandgym's own id of a sandbox: lets a cancelled create find its VM.
LABEL_SANDBOX_ID = "sandgym.sandbox_id"
_TEMPLATE_CHARS = re.compile(r"[^a-z0-9_-]+")


def template_for_image(image: str) -> str:
    """The E2B template name an image reference maps to (see the module docstring).

    >>> template_for_image("sandgym/terminal:latest")
    'sandgym-terminal'
    >>> template_for_image("ghcr.io/acme/py:3.11")
    'acme-py-3-11'
    """
    ref = image.strip().lower()
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        ref = rest  # drop a registry host: templates live in one E2B namespace
    if ref.endswith(":latest"):
        ref = ref[: -len(":latest")]
    name = _TEMPLATE_CHARS.sub("-", ref).strip("-")
    if not name:
        raise SandboxCreateError(f"expected an image name that maps to a template, got {image!r}")
    return name


class E2BBackend(SandboxBackend):
    """Sandboxes as E2B cloud micro-VMs (see the module docstring).

    `sdk` is the module-like object providing `AsyncSandbox`, `SandboxQuery`, `PtySize` and the
    exception classes; None imports the real `e2b` package on first use.
    """

    name = "e2b"

    def __init__(
        self,
        owner_id: str | None = None,
        lease_s: float = 3600,
        api_key: str | None = None,
        default_template: str | None = None,
        template_map: dict[str, str] | None = None,
        request_timeout_s: float = 30.0,
        create_timeout_s: float = 120.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        sdk: Any = None,
    ) -> None:
        super().__init__(owner_id, lease_s)
        self.api = E2BApi(api_key, request_timeout_s, sdk)
        self.default_template = (
            default_template or os.environ.get("SANDGYM_E2B_TEMPLATE") or DEFAULT_TEMPLATE
        )
        self.template_map = dict(template_map or {})
        self.create_timeout_s = create_timeout_s
        self.max_output_bytes = max_output_bytes

    # -- availability ------------------------------------------------------------------------
    @property
    def sdk(self) -> Any:
        return self.api.sdk

    @property
    def api_key(self) -> str:
        return self.api.api_key

    @property
    def request_timeout_s(self) -> float:
        return self.api.request_timeout_s

    async def ensure_available(self) -> None:
        """Raise BackendUnavailableError unless the SDK is installed and a key is set."""
        _ = self.api.sdk, self.api.api_key

    # -- templates ---------------------------------------------------------------------------
    def template_for(self, spec: SandboxSpec) -> str:
        """The E2B template a sandbox of `spec` starts from."""
        if spec.image is None:
            if spec.build_context is not None:
                log.debug(
                    "e2b: %s: no image build on E2B; default template %s, the task layer "
                    "applies the Dockerfile",
                    spec.build_context,
                    self.default_template,
                )
            return self.default_template
        if spec.image in self.template_map:
            return self.template_map[spec.image]
        return template_for_image(spec.image)

    # -- create / kill -----------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        self.check_network(spec)  # public or no-network, for the sandbox's whole life
        self.check_services(spec)
        sdk, api = self.api.sdk, self.api.auth()
        template = self.template_for(spec)
        sandbox_id = "sg-" + uuid.uuid4().hex[:12]
        metadata = await asyncio.to_thread(self.labels_for, spec)
        metadata[LABEL_SANDBOX_ID] = sandbox_id
        # E2B's own timeout is the sandbox's hard lifetime: the pool's first deadline
        # (`sandgym.sandboxes.lifetime`, moved on with set_timeout while the server lives), else the lease.
        deadline = first_deadline()
        life_s = self.lease_s if deadline is None else deadline - time.time()
        e2b_timeout = e2b_timeout_s(life_s)
        try:
            sbx = await asyncio.wait_for(
                sdk.AsyncSandbox.create(
                    template=template,
                    timeout=e2b_timeout,
                    metadata=metadata,
                    envs=dict(spec.env),
                    allow_internet_access=spec.network.mode == "public",
                    **api,
                ),
                self.create_timeout_s,
            )
        except TimeoutError as exc:
            await asyncio.shield(self._kill_by_sandbox_id(sandbox_id))
            raise SandboxCreateError(
                f"e2b: creating a sandbox from template {template!r} took longer than "
                f"{self.create_timeout_s:.0f} s"
            ) from exc
        except asyncio.CancelledError:
            await asyncio.shield(self._kill_by_sandbox_id(sandbox_id))
            raise
        except Exception as exc:
            raise self._create_error(template, exc) from exc
        sb = E2BSandbox(spec, self.api, sbx, sandbox_id, template, self.max_output_bytes)
        sb.deadline = deadline
        try:
            made = " ".join(shlex.quote(d) for d in spec.make_dirs)
            await sb._raw_run(
                f"mkdir -p {shlex.quote(spec.workdir)} {made}"
                + (f" && chmod 777 {made}" if made else "")
            )
            if spec.user is not None and not is_root_user(spec.user):
                await sb._raw_run(f"chown {shlex.quote(spec.user)} {shlex.quote(spec.workdir)}")
        except BaseException as exc:
            await asyncio.shield(sb.close())
            if isinstance(exc, SandboxError) and not isinstance(exc, SandboxLostError):
                raise SandboxCreateError(
                    f"e2b: sandbox from template {template!r} could not be prepared: {exc}"
                ) from exc
            raise
        await ensure_healthy(sb)
        return sb

    def _create_error(self, template: str, exc: Exception) -> SandboxError:
        sdk = self.api.sdk
        unavailable = self.api.unavailable(exc)
        if unavailable is not None:
            return unavailable
        if isinstance(exc, sdk.NotFoundException) or "not found" in str(exc).lower():
            return SandboxCreateError(
                f"e2b: template {template!r} was not found: build it "
                "(`e2b template build`, see docs/e2b.md) or map the image to an existing "
                f"template; E2B said: {exc}"
            )
        return SandboxCreateError(f"e2b: creating a sandbox from {template!r} failed: {exc}")

    async def _kill_by_sandbox_id(self, sandbox_id: str) -> None:
        """Kill the VM a failed or cancelled create may have left (found by its metadata)."""
        try:
            for info in await self.list_managed({LABEL_SANDBOX_ID: sandbox_id}):
                await self.api.kill(info.sandbox_id)
        except Exception as exc:  # the create's own error is what the caller sees
            tolerate("e2b.kill_by_sandbox_id", exc, log, logging.WARNING)

    # -- reaping -----------------------------------------------------------------------------
    async def list_managed(self, extra: dict[str, str] | None = None) -> list[Any]:
        """Every E2B sandbox (running or paused) whose metadata says sandgym manages it."""
        sdk, api = self.api.sdk, self.api.auth()
        query = sdk.SandboxQuery(metadata={LABEL_MANAGED: "1", **(extra or {})})
        found: list[Any] = []
        try:
            paginator = sdk.AsyncSandbox.list(query=query, **api)
            while paginator.has_next:
                page = await asyncio.wait_for(paginator.next_items(), self.request_timeout_s + 5)
                found.extend(page)
        except TimeoutError as exc:
            raise BackendUnavailableError(
                f"e2b: listing sandboxes got no answer within {self.request_timeout_s:.0f} s"
            ) from exc
        except Exception as exc:
            unavailable = self.api.unavailable(exc)
            if unavailable is not None:
                raise unavailable from exc
            raise SandboxError(f"e2b: listing sandboxes failed: {exc}") from exc
        return found

    async def reap_matching(
        self, *, everything: bool = False, owner_id: str | None = None, images: bool = False
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Kill the managed sandboxes `labels.should_reap` selects (E2B keeps no images of
        ours: `images` changes nothing).

        Returns (killed sandgym ids, [(id, error)]); ids are sandgym's, else E2B's.
        """
        removed: list[str] = []
        errors: list[tuple[str, str]] = []
        for info in await self.list_managed():
            labels = dict(info.metadata or {})
            name = labels.get(LABEL_SANDBOX_ID) or info.sandbox_id
            if not should_reap(labels, owner_id=owner_id, everything=everything):
                continue
            try:
                await asyncio.wait_for(
                    self.api.sdk.AsyncSandbox.kill(info.sandbox_id, **self.api.auth()),
                    self.request_timeout_s + 5,
                )
            except Exception as exc:
                errors.append((name, str(exc) or type(exc).__name__))
            else:
                removed.append(name)
        return removed, errors
