"""Storage pieces that need no server: URLs, the read cache, data roots' modes."""

import os
import stat

import pytest

from robotloop.deploy.store import ReleaseStore
from robotloop.storage import BadBucketUrl, BucketUrl, private_dir
from robotloop.storage.cache import ReadCache
from robotloop.train.jobs import JobManager
from services.bucket.app import create_app


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
        ("hf://buckets/la b/demos/x", "alphanumeric chars"),
        ("hf://buckets/lab/a--b", "Cannot have -- or .."),
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


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_data_roots_are_readable_by_their_user_only(tmp_path):
    # Token checks guard the server; its files, caches and release stores hold the same bytes on disk.
    old = os.umask(0o022)
    try:
        existing = tmp_path / "shared" / "cache"
        existing.mkdir(parents=True, mode=0o755)
        ReadCache(existing, max_bytes=1)
        create_app(tmp_path / "server")
        ReleaseStore(tmp_path / "robot" / "store")
        JobManager(tmp_path / "jobs").close()
    finally:
        os.umask(old)
    for root in (existing, tmp_path / "server", tmp_path / "robot" / "store", tmp_path / "jobs"):
        assert _mode(root) == 0o700, root
    assert _mode(tmp_path / "shared") == 0o755 and _mode(tmp_path / "robot") == 0o755  # parents keep their modes
    assert private_dir(existing) == existing and _mode(existing) == 0o700
