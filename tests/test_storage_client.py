"""robotloop.storage against the real bucket server, through the real huggingface_hub + hf_xet clients."""

import os

import pytest

from robotloop.config import load_settings
from robotloop.storage import BucketClient, BucketUrl, Entry, NotFound, StorageError, connect
from robotloop.storage.cache import ReadCache
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server

from .conftest import READ_TOKEN, WRITE_TOKEN


@pytest.fixture
def client(bucket_server, tmp_path):
    return BucketClient(bucket_server.endpoint, WRITE_TOKEN, ReadCache(tmp_path / "cache", 10**9))


def test_upload_reports_dedup_and_round_trips(client, bucket_server, tmp_path):
    url = BucketUrl.parse("hf://buckets/lab/storage-client/blob.bin")
    client.create_bucket(url)
    # 8 MB: Xet chunks are up to 128 KB, so a small change re-sends up to a few of them; on a 2 MB file
    # that was sometimes more than 10% (seen: 266 KB for a 10 KB change).
    data = bytearray(os.urandom(8_000_000))
    (tmp_path / "blob.bin").write_bytes(data)
    first = client.upload(tmp_path / "blob.bin", url)
    assert first.bytes_total == len(data) and first.bytes_new == len(data)

    data[1_000_000:1_010_000] = os.urandom(10_000)  # 0.125% changed in one region
    (tmp_path / "blob.bin").write_bytes(data)
    received_before = bucket_server.stats()["bytes_received"]
    second = client.upload(tmp_path / "blob.bin", url)
    received = bucket_server.stats()["bytes_received"] - received_before
    assert second.bytes_deduplicated > 0.9 * len(data)
    assert received < 0.2 * len(data), f"server received {received} bytes for a 10 KB change"
    assert second.files[0].xet_hash != first.files[0].xet_hash

    entry = client.stat(url)
    assert (entry.size, entry.xet_hash) == (len(data), second.files[0].xet_hash)
    assert client.read_range(url, 999_990, 1_010_010) == bytes(data[999_990:1_010_010])
    with client.open(url) as f:
        f.seek(1_500_000)
        assert f.read(100) == bytes(data[1_500_000:1_500_100])
    out = client.download(url, tmp_path / "out.bin")
    assert out.read_bytes() == bytes(data)
    assert client.cache.get(entry.xet_hash) is not None  # second download is served from the cache
    with open(out, "r+b") as f:  # edited in place (an editor, a writer growing its copy): the cache must not follow
        f.write(b"LOCAL EDIT")
    again = client.download(url, tmp_path / "again.bin")
    assert again.read_bytes() == bytes(data) and os.stat(again).st_nlink == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    # A listing that no longer matches the bucket (the file rewritten since: its old hash is no longer served), or
    # whose bytes do not hash to what it says (here its size is off, as a lying server's would be), fails the
    # download and leaves the shared read cache clean.
    stale = Entry(url, len(data), first.files[0].xet_hash)
    with pytest.raises(StorageError, match="cannot download"):
        client.download(stale, tmp_path / "stale.bin")
    assert client.cache.get(stale.xet_hash) is None and not (tmp_path / "stale.bin").exists()
    fresh = BucketClient(client.endpoint, WRITE_TOKEN, ReadCache(tmp_path / "fresh-cache", 10**9))
    with pytest.raises(StorageError, match="nothing was kept"):
        fresh.download(Entry(url, len(data) - 1, entry.xet_hash), tmp_path / "wrong.bin")
    assert fresh.cache.get(entry.xet_hash) is None and not (tmp_path / "wrong.bin").exists()


def test_folder_upload_listing_du_and_fetch(client, tmp_path):
    src = tmp_path / "ep"
    (src / "data").mkdir(parents=True)
    (src / "data" / "a.parquet").write_bytes(b"a" * 1000)
    (src / "meta.json").write_bytes(b"{}")
    url = BucketUrl.parse("hf://buckets/lab/storage-client/datasets/ds")
    client.create_bucket(url)
    report = client.upload(src, url)
    assert sorted(f.path for f in report.files) == ["datasets/ds/data/a.parquet", "datasets/ds/meta.json"]
    assert client.du(url) == 1002
    names = sorted(str(e.url.path if hasattr(e, "url") else e.path) for e in client.ls(url, recursive=True))
    assert names == ["datasets/ds/data/a.parquet", "datasets/ds/meta.json"]
    got = client.fetch(url, tmp_path / "back")
    assert sorted(p.relative_to(tmp_path / "back").as_posix() for p in got) == ["data/a.parquet", "meta.json"]
    assert (tmp_path / "back" / "data" / "a.parquet").read_bytes() == b"a" * 1000

    # As cp does: a file put to an existing folder goes into it; a folder never goes under a file.
    (tmp_path / "notes.txt").write_bytes(b"n")
    assert [f.path for f in client.upload(tmp_path / "notes.txt", url).files] == ["datasets/ds/notes.txt"]
    assert [f.path for f in client.upload(tmp_path / "notes.txt", url / "n2.txt").files] == ["datasets/ds/n2.txt"]
    with pytest.raises(StorageError, match="is a file: folder .* cannot be uploaded under it"):
        client.upload(src, url / "meta.json")
    assert client.du(url) == 1004


class Recorded:
    """A TransferProgress that keeps what it heard, as the CLI's bar would draw it."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.advances: list[int] = []

    def start(self, total_bytes: int) -> None:
        self.total = total_bytes

    def advance(self, nbytes: int) -> None:
        assert self.total is not None, "advanced before the transfer's size was given"
        self.advances.append(nbytes)


def test_transfers_report_progress_from_hf_xet(client, tmp_path):
    """Uploads and downloads (from the server, from the read cache, empty files) tell their size first, then
    advance by hf_xet's reports to exactly that size."""
    src = tmp_path / "run"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(6_000_000))
    (src / "empty.txt").write_bytes(b"")
    (src / "small.txt").write_bytes(b"x" * 10)
    url = BucketUrl.parse("hf://buckets/lab/storage-progress/run")
    client.create_bucket(url)
    up = Recorded()
    client.upload(src, url, up)
    assert up.total == sum(up.advances) == 6_000_010 and all(n > 0 for n in up.advances)
    down = Recorded()
    assert len(client.fetch(url, tmp_path / "back", down)) == 3
    assert down.total == sum(down.advances) == 6_000_010
    assert (tmp_path / "back" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert (tmp_path / "back" / "empty.txt").read_bytes() == b""
    cached = Recorded()  # the same files again: all from the read cache
    client.fetch(url / "big.bin", tmp_path / "again.bin", cached)
    assert cached.total == sum(cached.advances) == 6_000_000


def test_errors_name_bucket_path_and_remedy(bucket_server, tmp_path):
    writer = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    missing = BucketUrl.parse("hf://buckets/lab/no-such-bucket/x.bin")
    with pytest.raises(NotFound, match="no-such-bucket.*robotloop bucket create"):
        writer.ls(missing)
    url = BucketUrl.parse("hf://buckets/lab/storage-errors/x.bin")
    writer.create_bucket(url)
    with pytest.raises(NotFound, match="x.bin"):
        writer.stat(url)
    (tmp_path / "x.bin").write_bytes(b"x")
    reader = BucketClient(bucket_server.endpoint, READ_TOKEN)
    with pytest.raises(StorageError, match="(?s)storage-errors.*write access"):
        reader.upload(tmp_path / "x.bin", url)
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        writer.upload(tmp_path / "nothing-here", url)
    assert writer.ls(BucketUrl.parse("hf://buckets/lab/storage-errors")) == []  # nothing half-written


def test_embedded_server_starts_once_and_is_shared(tmp_path):
    root = tmp_path / "embedded"
    first = ensure_embedded_server(root)
    try:
        again = ensure_embedded_server(root)
        assert again.endpoint == first.endpoint and again.pid == first.pid
        assert (root / "tokens").stat().st_mode & 0o077 == 0  # token file private to the user
        settings = load_settings({"storage": {"embedded_root": str(root), "cache_dir": str(tmp_path / "c")}})
        client = connect(settings)
        assert client.endpoint == first.endpoint
        url = BucketUrl.parse("hf://buckets/local/embedded/hello.txt")
        client.create_bucket(url)
        (tmp_path / "hello.txt").write_text("hello")
        client.upload(tmp_path / "hello.txt", url)
        assert client.read_range(url, 0, 5) == b"hello"
        anonymous = BucketClient(first.endpoint, None)
        with pytest.raises(NotFound):
            anonymous.stat(url)  # private by default, even on the embedded server
    finally:
        assert stop_embedded_server(root)


def test_the_embedded_servers_token_goes_only_to_that_server(tmp_path):
    # The server died and another local process took its port: it answers everything, and must never see the token.
    import http.server
    import json
    import threading

    seen: list[str] = []

    class Squatter(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            seen.append(self.headers.get("authorization") or "")
            body = json.dumps({"proofs": ["0" * 64]}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Squatter)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    root = tmp_path / "embedded"
    first = ensure_embedded_server(root)
    stop_embedded_server(root)
    (root / "server.json").write_text(json.dumps({"endpoint": f"http://127.0.0.1:{squatter.server_port}", "pid": 1}))
    try:
        again = ensure_embedded_server(root)  # a fresh server of ours, not the squatter
        assert again.endpoint != f"http://127.0.0.1:{squatter.server_port}" and again.token == first.token
        assert seen and not any(first.token in header for header in seen)
    finally:
        stop_embedded_server(root)
        squatter.shutdown()


def test_refusals_are_filed_under_their_category_in_one_line(bucket_server, tmp_path):
    """The bucket server's refusals through huggingface_hub become robotloop errors of the status's category
    (`category_of_status`, as the service clients'), still StorageErrors, each message one line."""
    from robotloop.errors import Conflict, Refused

    url = BucketUrl.parse("hf://buckets/lab/storage-refusals/notes.md")
    writer = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    writer.create_bucket(url)
    (tmp_path / "notes.md").write_text("notes")
    writer.upload(tmp_path / "notes.md", url)
    refusals = [
        (Refused, lambda: BucketClient(bucket_server.endpoint, "wrong").ls(url)),  # 401
        (Refused, lambda: BucketClient(bucket_server.endpoint, READ_TOKEN).upload(tmp_path / "notes.md", url)),  # 403
        (Conflict, lambda: writer.upload(tmp_path / "notes.md", url / "inner.md")),  # 409
    ]
    for kind, call in refusals:
        with pytest.raises(StorageError) as error:
            call()
        assert isinstance(error.value, kind) and "\n" not in str(error.value), repr(error.value)
    with pytest.raises(Refused, match=r"refused the token \(401\).*--token"):
        BucketClient(bucket_server.endpoint, "wrong").stat(url)
