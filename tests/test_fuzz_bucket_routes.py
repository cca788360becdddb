"""Property-based fuzzing (hypothesis) of the bucket server's routes over a real socket: whatever a client sends,
the answer is a response below 500, and nothing accepted breaks a later listing or read of the bucket.

Covers the batch route's fields (types, huge and negative numbers, numbers of any length, dates past year 9999,
content types) and the JSON bodies of every route that reads one (batch, paths-info, create, settings, move), their
strings holding lone surrogates and other unpaired code points, written both as JSON escapes and as raw bytes; paths
and listing prefixes in URLs (NUL, control characters, lone surrogates, the top of Unicode); query parameters
(cursors, searches, the proof's nonce, the signed xorb route's expiry and signature) of any length, numbers of
thousands of digits included; Range headers of any length on a stored file, a reconstruction and a signed xorb URL.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from huggingface_hub import HfApi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import WRITE_TOKEN

AUTH = {"authorization": f"Bearer {WRITE_TOKEN}"}
BUCKET = "lab/fuzz"
STORED = "stored/ten.bin"  # a file of the fuzzed bucket, so Range headers reach the code that reads them
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Strings that are no text (lone surrogates: high, low, a pair reversed, one at the end) beside code points that are
# text but rare (noncharacters, the last code point), alone or inside other text.
unpaired = st.sampled_from(["\ud800", "\udfff", "\udc00\ud800", "x\ud83d", "\ud83d\ude00", "\ufffe", "\U0010ffff"])
any_code_point = st.characters(exclude_categories=())  # surrogates included (hypothesis leaves them out by default)
odd_texts = st.builds(lambda a, u, b: a + u + b, st.text(max_size=5), unpaired, st.text(max_size=5)) | st.text(
    any_code_point, max_size=10
)
# Numbers as a client may write them: any sign and length, past int()'s 4,300 digits too.
lengths = st.integers(0, 40) | st.sampled_from([4300, 4301, 5000, 12_000])  # hypothesis draws small integers first
long_digits = st.builds(lambda first, n: first + "9" * n, st.sampled_from("0123456789"), lengths)
numeric_texts = (
    long_digits
    | st.integers(min_value=-(10**30), max_value=10**30).map(str)
    | st.from_regex(r"\A-?[0-9]{0,25}(\.[0-9]{0,10})?(e-?[0-9]{1,6})?\Z")
    | st.sampled_from(["-0", "nan", "inf", "1e99999", "0x10", "١٢٣", "²"])
)
texts = (
    st.text(max_size=40)
    | odd_texts
    | st.sampled_from(["\x00", "a\r\nb", "é/ü", "..", "a//b", "f:x", "d:", STORED, f"f:{STORED}"])
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
numbers = st.integers(min_value=-(10**20), max_value=10**20) | st.floats(allow_nan=True, allow_infinity=True)
field = json_values | numbers | texts
kinds = st.sampled_from(["addFile", "copyFile", "deleteFile"])
operations = st.fixed_dictionaries(
    {"type": kinds | field},
    optional={
        "path": texts | field,
        "xetHash": field,
        "size": numbers | field,
        "mtime": numbers | field,
        "contentType": texts | field,
        "sourceRepoType": field,
        "sourceRepoId": field,
    },
) | st.fixed_dictionaries(  # well-formed but for their strings: these reach the store's checks and its answer
    {"type": kinds, "path": texts, "xetHash": st.sampled_from(["ab" * 32, "x"]) | texts},
    optional={"sourceRepoType": st.just("bucket"), "sourceRepoId": st.just(BUCKET) | texts, "size": numbers},
)
positions = st.just("") | long_digits | st.integers(0, 20).map(str)
ranges = (
    st.none()
    | st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=20)
    | st.builds(lambda a, b: f"bytes={a}-{b}", positions, positions)
)


def _json(value, escaped: bool) -> bytes:
    """`value` as JSON, a lone surrogate written as its escape ("\\ud800") or as the raw bytes Python would read."""
    return json.dumps(value, ensure_ascii=escaped).encode("utf-8", "surrogatepass")


def _q(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")  # NUL, control bytes, lone surrogates: escaped


@pytest.fixture(scope="module")
def hub(bucket_server) -> str:
    httpx.post(f"{bucket_server.endpoint}/api/buckets/{BUCKET}", json={"private": True}, headers=AUTH)
    HfApi(endpoint=bucket_server.endpoint, token=WRITE_TOKEN).batch_bucket_files(BUCKET, add=[(b"0123456789", STORED)])
    return bucket_server.endpoint


def _listing_still_works(hub: str) -> None:
    r = httpx.get(f"{hub}/api/buckets/{BUCKET}/tree", params={"recursive": "true"}, headers=AUTH)
    assert r.status_code == 200, r.text


@FUZZ
@given(lines=st.lists(operations, min_size=1, max_size=3), escaped=st.booleans(), number=long_digits)
def test_any_batch_is_answered_below_500_and_leaves_the_bucket_listable(hub, lines, escaped, number):
    body = b"".join(_json(line, escaped) + b"\n" for line in lines)
    if lines[0].get("size") == 0:  # a number json.dumps cannot write (over 4,300 digits): spliced in as text
        body = body.replace(b'"size": 0', f'"size": {number}'.encode(), 1)
    r = httpx.post(f"{hub}/api/buckets/{BUCKET}/batch", content=body, headers=AUTH)
    assert r.status_code < 500, r.text
    _listing_still_works(hub)


@FUZZ
@given(data=st.data(), escaped=st.booleans())
def test_any_json_body_is_answered_below_500(hub, data, escaped):
    method, route, shape = data.draw(
        st.sampled_from(
            [
                ("POST", f"/api/buckets/{BUCKET}/paths-info", {"paths": st.lists(texts, max_size=4)}),
                ("POST", "/api/buckets/lab/fuzz-created", {"private": field}),
                ("PUT", f"/api/buckets/{BUCKET}/settings", {"private": field}),
                ("POST", "/api/repos/move", {"type": st.just("bucket") | field, "fromRepo": texts, "toRepo": texts}),
            ]
        )
    )
    body = data.draw(st.fixed_dictionaries({}, optional=shape) | json_values)
    r = httpx.request(method, f"{hub}{route}", content=_json(body, escaped), headers=AUTH)
    assert r.status_code < 500, (route, r.text)
    _listing_still_works(hub)


@FUZZ
@given(path=texts, range_header=ranges)
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
@given(range_header=ranges)
def test_any_range_on_a_stored_file_is_answered_below_500(hub, range_header):
    headers = {**AUTH, **({"range": range_header} if range_header else {})}
    r = httpx.get(f"{hub}/buckets/{BUCKET}/resolve/{STORED}", headers=headers)
    assert r.status_code < 500, r.text
    if r.status_code in (200, 206):
        assert r.content and b"0123456789".find(r.content) >= 0, r.content


@FUZZ
@given(query=st.dictionaries(st.sampled_from(["cursor", "search", "recursive", "nonce"]), texts | numeric_texts))
def test_any_query_is_answered_below_500(hub, query):
    raw = "&".join(f"{key}={_q(value)}" for key, value in query.items())
    for url in (f"{hub}/api/buckets/lab", f"{hub}/api/buckets/{BUCKET}/tree", f"{hub}/api/robotloop/proof"):
        r = httpx.get(f"{url}?{raw}", headers=AUTH)
        assert r.status_code < 500, (url, r.text)


@FUZZ
@given(exp=texts | numeric_texts, sig=texts, xorb=st.text(alphabet="0123456789abcdef", min_size=0, max_size=70))
def test_any_signed_xorb_url_is_answered_below_500(hub, exp, sig, xorb):
    r = httpx.get(f"{hub}/v1/xorb-data/{xorb or 'x'}?exp={_q(exp)}&sig={_q(sig)}")
    assert r.status_code < 500, r.text


@pytest.fixture(scope="module")
def reconstruction(hub) -> tuple[str, dict[str, str], str]:
    """The stored file's reconstruction route, a CAS read token for it, and one of its signed xorb URLs."""
    # Stored again: the fuzzed batches draw deleteFile of it too, and hypothesis may have drawn one before this runs.
    HfApi(endpoint=hub, token=WRITE_TOKEN).batch_bucket_files(BUCKET, add=[(b"0123456789", STORED)])
    (entry,) = httpx.post(f"{hub}/api/buckets/{BUCKET}/paths-info", json={"paths": [STORED]}, headers=AUTH).json()
    token = httpx.get(f"{hub}/api/buckets/{BUCKET}/xet-read-token", headers=AUTH).json()["accessToken"]
    read = {"authorization": f"Bearer {token}"}
    route = f"{hub}/v1/reconstructions/{entry['xetHash']}"
    fetch = httpx.get(route, headers=read).json()["fetch_info"]
    return route, read, next(iter(fetch.values()))[0]["url"]


@FUZZ
@given(range_header=ranges)
def test_any_range_on_a_reconstruction_or_a_xorb_is_answered_below_500(reconstruction, range_header):
    route, read, xorb_url = reconstruction
    headers = {"range": range_header} if range_header else {}
    for url, auth in ((route, read), (xorb_url, {})):
        r = httpx.get(url, headers={**auth, **headers})
        assert r.status_code < 500, (url, r.text)
