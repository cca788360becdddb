"""Storage pieces that need no server: URLs and the read cache."""

import os

import pytest

from robotloop.storage import BadBucketUrl, BucketUrl
from robotloop.storage.cache import ReadCache


def test_bucket_url_round_trip():
    url = BucketUrl.parse("hf://buckets/lab/demos/datasets/cube/")
    assert (url.namespace, url.bucket, url.path) == ("lab", "demos", "datasets/cube")
    assert str(url / "meta/info.json") == "hf://buckets/lab/demos/datasets/cube/meta/info.json"
    assert str(BucketUrl.parse("hf://buckets/lab/demos")) == "hf://buckets/lab/demos"


@pytest.mark.parametrize(
    "bad, message",
    [
        ("hf://buckets/lab", "namespace/name"),
        ("s3://lab/demos", "hf://"),
        ("hf://datasets/lab/demos", "dataset URL"),
        ("hf://buckets/lab/demos/a/../../etc", "'..'"),
    ],
)
def test_bad_bucket_urls_are_explained(bad, message):
    with pytest.raises(BadBucketUrl, match=message):
        BucketUrl.parse(bad)


def test_joining_cannot_climb_out():
    with pytest.raises(BadBucketUrl):
        BucketUrl.parse("hf://buckets/lab/demos/a") / "../../x"


def _hash(i: int) -> str:
    return f"{i:064x}"


def test_read_cache_is_bounded_lru(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"x" * 100)
    cache = ReadCache(tmp_path / "cache", max_bytes=250)
    for i in range(2):
        cache.put(_hash(i), src)
        os.utime(cache.get(_hash(i)), (i, i))  # deterministic access order: 0 oldest
    cache.get(_hash(0))  # touch 0: now 1 is least recently used
    cache.put(_hash(2), src)
    assert cache.get(_hash(1)) is None
    assert cache.get(_hash(0)) is not None and cache.get(_hash(2)) is not None
    assert cache.size() <= 250


def test_read_cache_rejects_non_hash_keys(tmp_path):
    cache = ReadCache(tmp_path, max_bytes=10)
    with pytest.raises(ValueError, match="not a Xet hash"):
        cache.get("../../etc/passwd")
