"""The gateway's errors: a flat tree under `GatewayError`."""

from __future__ import annotations


class GatewayError(RuntimeError):
    """The gateway could not serve or convert a call."""


class UnknownSessionError(GatewayError, KeyError):
    """No calls are recorded for this session id."""


class MissingTokensError(GatewayError):
    """A recorded call lacks the token ids (or logprobs) a training step needs."""


class TokenAlignmentError(GatewayError):
    """A call that keeps the conversation's history does not extend the previous prompt +
    completion token for token."""
