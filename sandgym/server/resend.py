"""The resend cache of a step: a step whose request_id equals the last one handled returns the
cached reply (or waits for the in-flight one) instead of running again, so a client may safely
resend a step whose reply was lost with its connection. One request of a session at a time: a
different request while one is in flight is refused (`BusyError`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from sandgym.server.episode_table import Session
from sandgym.server.errors import BusyError
from sandgym.wire.protocol import StepResultReply


def cached_reply(s: Session | None, request_id: str) -> StepResultReply | None:
    """The reply already sent for `request_id`, if it was the session's last."""
    if s is not None and request_id == s.last_id and s.last_reply is not None:
        return s.last_reply
    return None


async def run_once(
    s: Session, request_id: str, run: Callable[[], Awaitable[StepResultReply]]
) -> StepResultReply:
    """`run()` as the session's one request in flight, its reply kept as the last; a resend of
    the request in flight waits for that same reply."""
    if s.inflight is not None:
        if request_id == s.inflight_id:
            return await asyncio.shield(s.inflight)
        raise BusyError(
            f"request {s.inflight_id!r} of this session is still being handled; "
            "send one request at a time"
        )
    fut: asyncio.Future[StepResultReply] = asyncio.get_running_loop().create_future()
    s.inflight, s.inflight_id = fut, request_id
    try:
        reply = await run()
    except asyncio.CancelledError:
        fut.cancel()
        raise
    except Exception as exc:
        fut.set_exception(exc)
        fut.exception()  # mark retrieved: a resend may never come
        raise
    else:
        fut.set_result(reply)
        s.last_id, s.last_reply = request_id, reply
        return reply
    finally:
        s.inflight, s.inflight_id = None, None
        s.last_active = time.monotonic()
