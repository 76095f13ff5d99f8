"""The capped output buffer every backend collects command output in.

A stream keeps at most `limit` bytes and counts the rest, so a 10 MB flood costs at most the cap
in memory; its text then ends with `TRUNCATION_MARKER` saying how much was dropped.
"""

from __future__ import annotations

#: Output beyond this many bytes per stream is cut and marked with `TRUNCATION_MARKER`.
DEFAULT_MAX_OUTPUT_BYTES = 1_000_000
TRUNCATION_MARKER = "\n[sandgym: output truncated: {dropped} bytes dropped]\n"


class CappedBuffer:
    """Collects one output stream up to `limit` bytes and counts what it drops.

    >>> buf = CappedBuffer(3)
    >>> buf.add(b"hello")
    >>> buf.text()
    ('hel\\n[sandgym: output truncated: 2 bytes dropped]\\n', True)
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes | str) -> None:
        """Keep what fits of `chunk` (text is counted as its UTF-8 bytes), count the rest."""
        raw = chunk.encode() if isinstance(chunk, str) else chunk
        room = self.limit - len(self.data)
        if room > 0:
            self.data += raw[:room]
        self.dropped += max(0, len(raw) - max(room, 0))

    def clear(self) -> None:
        self.data.clear()
        self.dropped = 0

    def text(self) -> tuple[str, bool]:
        """(the kept bytes decoded, with the marker when anything was dropped; whether it was)."""
        return mark_truncated(self.data.decode("utf-8", errors="replace"), self.dropped)


def mark_truncated(text: str, dropped: int) -> tuple[str, bool]:
    """`text`, with the truncation marker appended when `dropped` bytes were cut from it."""
    if dropped:
        return text + TRUNCATION_MARKER.format(dropped=dropped), True
    return text, False


def truncate_output(data: bytes, limit: int = DEFAULT_MAX_OUTPUT_BYTES) -> tuple[str, bool]:
    """Decode `data`, keeping at most `limit` bytes plus a marker that says how much was cut."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace"), False
    return mark_truncated(data[:limit].decode("utf-8", errors="replace"), len(data) - limit)
