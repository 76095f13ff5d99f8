"""Errors a backend catches on purpose and does not raise: each one is logged and counted here,
so that none turns silently into a plausible value (a probe's "no", a default).

`TOLERATED` counts them by place (`"<backend>.<what>"`) for the life of the process; tests and
operators read it to see how often a tolerated failure happened.
"""

from __future__ import annotations

import collections
import logging

#: place -> how many errors were tolerated there
TOLERATED: collections.Counter[str] = collections.Counter()


def tolerate(
    where: str, exc: BaseException, logger: logging.Logger, level: int = logging.DEBUG
) -> None:
    """Record that `exc` was caught at `where` and not raised: counted, and logged at `level`."""
    TOLERATED[where] += 1
    logger.log(level, "%s: tolerated %s: %s", where, type(exc).__name__, exc)
