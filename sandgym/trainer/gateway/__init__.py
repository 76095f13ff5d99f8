"""Model gateway: an OpenAI-compatible chat endpoint in front of the rollout engines that records
every call with exact token ids, so a third-party harness (any program that speaks the OpenAI
API) can be trained on.

Each episode gets its own base URL, `.../sessions/<sid>/v1`, so the harness needs no change
beyond `OPENAI_BASE_URL`. Every call is recorded (`CallRecord`: prompt and completion token ids,
logprobs, weight version, latency) in memory (at most `max_sessions_in_memory` sessions, the
least recently used spill to SQLite only) and in SQLite under the run directory; `consume(sid)`
hands a session's calls over and deletes them.

- `records`: `CallRecord`, the `CallStore`, `calls_to_steps` (calls -> training `Step`s);
- `chat`: `ModelGateway`, a request -> prompt ids by the token rule -> a generation -> a reply
  with tool calls -> a record;
- `server`: the HTTP routes (JSON and SSE streaming) and `GatewayServer` (uvicorn);
- `errors`: `GatewayError` and its subclasses.
"""

from sandgym.trainer.gateway.chat import ModelGateway
from sandgym.trainer.gateway.errors import (
    GatewayError,
    MissingTokensError,
    TokenAlignmentError,
    UnknownSessionError,
)
from sandgym.trainer.gateway.records import CallRecord, CallStore, calls_to_steps
from sandgym.trainer.gateway.server import GatewayServer, gateway_app

__all__ = [
    "CallRecord",
    "CallStore",
    "GatewayError",
    "GatewayServer",
    "MissingTokensError",
    "ModelGateway",
    "TokenAlignmentError",
    "UnknownSessionError",
    "calls_to_steps",
    "gateway_app",
]
