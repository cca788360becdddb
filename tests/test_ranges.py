"""`services.ranges`, the one reader of HTTP Range headers (bucket server's CAS routes, the dashboard's video)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.ranges import BEYOND_ANY_SIZE, RangeNotSatisfiable, parse_range, span


@given(size=st.integers(1, 10_000), first=st.integers(0, 12_000), length=st.integers(1, 12_000))
def test_a_range_selects_what_slicing_would(size: int, first: int, length: int) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    data = data[:size]
    last = first + length - 1
    if first >= size:
        with pytest.raises(RangeNotSatisfiable):
            span(parse_range(f"bytes={first}-{last}"), size)
        return
    start, end = span(parse_range(f"bytes={first}-{last}"), size)
    assert data[start:end] == data[first : last + 1]
    start, end = span(parse_range(f"bytes=-{length}"), size)  # the last `length` bytes
    assert data[start:end] == data[-length:]
    start, end = span(parse_range(f"bytes={first}-"), size, open_end_limit=length)
    assert data[start:end] == data[first : first + length]


@pytest.mark.parametrize("header", ["bytes=0-1,4-5", "bytes=-", "items=0-1", "bytes=5-2", "bytes=a-b", "0-1"])
def test_other_forms_are_refused_as_416(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header)


def test_no_header_is_no_range() -> None:
    assert parse_range(None) is None


@given(digits=st.integers(20, 20_000), zeros=st.integers(0, 5_000))
def test_positions_of_any_length_are_past_any_end_never_an_error(digits: int, zeros: int) -> None:
    huge = "0" * zeros + "9" * digits  # int() refuses strings over 4,300 digits
    assert parse_range(f"bytes=3-{huge}") == (3, BEYOND_ANY_SIZE)
    assert span(parse_range(f"bytes=3-{huge}"), 10) == (3, 10)  # a last position past the end: the rest
    assert span(parse_range(f"bytes=-{huge}"), 10) == (0, 10)
    with pytest.raises(RangeNotSatisfiable):
        span(parse_range(f"bytes={huge}-"), 10)
    assert parse_range(f"bytes={'0' * zeros}7-") == (7, None)  # leading zeros are the same number
