"""Property-based fuzzing (hypothesis) of the bucket server's routes over a real socket: whatever a client sends,
the answer is a response below 500, and nothing accepted breaks a later listing or read of the bucket.

Covers the batch route's fields (types, huge and negative numbers, dates past year 9999, content types, lone
surrogates), paths and listing prefixes in URLs (NUL, control characters, the top of Unicode), Range headers and the
signed xorb route's query. The deploy, capture and training services are not fuzzed here yet.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import WRITE_TOKEN

AUTH = {"authorization": f"Bearer {WRITE_TOKEN}"}
BUCKET = "lab/fuzz"
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
numbers = st.integers(min_value=-(10**20), max_value=10**20) | st.floats(allow_nan=True, allow_infinity=True)
texts = st.text(max_size=40) | st.sampled_from(
    ["\x00", "a\r\nb", "\ud800", "\U0010ffff", "a\U0010ffff", "é/ü", "..", "a//b", "²", "١٢٣", "f:x", "d:"]
)
field = json_values | numbers | texts
operations = st.fixed_dictionaries(
    {"type": st.sampled_from(["addFile", "copyFile", "deleteFile"]) | field},
    optional={
        "path": texts | field,
        "xetHash": field,
        "size": numbers | field,
        "mtime": numbers | field,
        "contentType": texts | field,
        "sourceRepoType": field,
        "sourceRepoId": field,
    },
)


@pytest.fixture(scope="module")
def hub(bucket_server) -> str:
    httpx.post(f"{bucket_server.endpoint}/api/buckets/{BUCKET}", json={"private": True}, headers=AUTH)
    return bucket_server.endpoint


def _listing_still_works(hub: str) -> None:
    r = httpx.get(f"{hub}/api/buckets/{BUCKET}/tree", params={"recursive": "true"}, headers=AUTH)
    assert r.status_code == 200, r.text


@FUZZ
@given(lines=st.lists(operations, min_size=1, max_size=3))
def test_any_batch_is_answered_below_500_and_leaves_the_bucket_listable(hub, lines):
    body = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8", "surrogatepass")
    r = httpx.post(f"{hub}/api/buckets/{BUCKET}/batch", content=body, headers=AUTH)
    assert r.status_code < 500, r.text
    _listing_still_works(hub)


@FUZZ
@given(
    path=texts,
    range_header=st.none() | st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=20),
)
def test_any_path_or_range_is_answered_below_500(hub, path, range_header):
    raw = quote(path.encode("utf-8", "surrogatepass"), safe="/")  # NUL, control bytes, lone surrogates: escaped
    headers = {**AUTH, **({"range": range_header} if range_header else {})}
    for url in (
        f"{hub}/buckets/{BUCKET}/resolve/{raw}",
        f"{hub}/api/buckets/{BUCKET}/tree/{raw}",
        f"{hub}/api/buckets/{BUCKET}/tree/{raw}?recursive=true",
        f"{hub}/api/buckets/{BUCKET}/tree?cursor={raw}",
    ):
        r = httpx.get(url, headers=headers)
        assert r.status_code < 500, (url, r.text)


@FUZZ
@given(exp=texts, sig=texts, xorb=st.text(alphabet="0123456789abcdef", min_size=0, max_size=70))
def test_any_signed_xorb_url_is_answered_below_500(hub, exp, sig, xorb):
    raw = {k: quote(v.encode("utf-8", "surrogatepass"), safe="") for k, v in (("exp", exp), ("sig", sig))}
    r = httpx.get(f"{hub}/v1/xorb-data/{xorb or 'x'}?exp={raw['exp']}&sig={raw['sig']}")
    assert r.status_code < 500, r.text
