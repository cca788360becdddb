"""One reader of HTTP `Range` headers for every service that serves bytes: the bucket server's CAS routes (hf_xet
reads xorbs and reconstructions by range) and the dashboard's video route (a browser seeks in an episode's mp4).

One range per request, in the three forms of RFC 9110 (`bytes=a-b`, `bytes=a-`, `bytes=-n`); several ranges are
refused: neither hf_xet nor a video element asks for them.
"""

from __future__ import annotations

import re

from robotloop.storage.server.cas import RangeNotSatisfiable

_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
# Every byte position of 20 digits or more is past the end of anything served here, so all read as this one: never
# converted whole (int() refuses over 4,300 digits, and a few million would take it seconds).
BEYOND_ANY_SIZE = 10**19


def byte_position(digits: str) -> int:
    """The value of a Range header's position (ASCII digits), `BEYOND_ANY_SIZE` for one past any object's end."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) < len(str(BEYOND_ANY_SIZE)) else BEYOND_ANY_SIZE


def parse_range(header: str | None) -> tuple[int | None, int | None] | None:
    """`(first, last)` of a `Range` header, both inclusive, None for an open end: `bytes=-n` is `(None, n)` (the
    last n bytes), `bytes=a-` is `(a, None)`. None without a header.

    Raises:
        RangeNotSatisfiable: a header in another form, several ranges, or first > last (HTTP 416).
    """
    if header is None:
        return None
    m = _RANGE.match(header.strip())
    if not m or m.groups() == ("", ""):
        raise RangeNotSatisfiable(f"unsupported Range header {header[:100]!r}; use a single bytes=a-b")
    first, last = (byte_position(g) if g else None for g in m.groups())
    if first is not None and last is not None and first > last:
        raise RangeNotSatisfiable(f"Range start {first} > end {last}")
    return first, last


def span(byte_range: tuple[int | None, int | None], size: int, open_end_limit: int | None = None) -> tuple[int, int]:
    """`[start, end)` of a parsed range within an object of `size` bytes, clipped to its end; an open end reads at
    most `open_end_limit` bytes when given (a server's bound on one response).

    Raises:
        RangeNotSatisfiable: the range starts at or past the end, or selects nothing (HTTP 416).
    """
    first, last = byte_range
    if first is None:  # the last `last` bytes
        start, end = max(0, size - (last or 0)), size
    elif last is None:
        start = first
        end = size if open_end_limit is None else min(size, first + open_end_limit)
    else:
        start, end = first, min(size, last + 1)
    if start >= size or end <= start:
        raise RangeNotSatisfiable(f"range {first}-{last} is outside the object's {size} bytes")
    return start, end


__all__ = ["BEYOND_ANY_SIZE", "RangeNotSatisfiable", "byte_position", "parse_range", "span"]
