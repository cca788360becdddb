"""End-to-end tests of the Hub-compatible bucket API with the real clients.

A real server (`python -m services.bucket`) runs on 127.0.0.1; it is driven by the unmodified
`huggingface_hub.HfApi`, `HfFileSystem`, `hf_xet` and the `hf buckets` CLI. No mocks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from huggingface_hub import HfApi, HfFileSystem
from huggingface_hub.errors import BucketBatchError, BucketNotFoundError, HfHubHTTPError
from huggingface_hub.utils import disable_progress_bars

from robotloop.auth import (
    Forbidden,
    TokensFileError,
    TokenStore,
    Unauthorized,
    parse_tokens_text,
)
from robotloop.service_process import free_port
from robotloop.storage.server.buckets import BucketStore, InvalidPath, validate_path
from services.bucket import BucketOptions
from services.bucket.app import create_app, serve

W, R, OTHER, ADMIN = "hub_w_robots", "hub_r_robots", "hub_w_other", "hub_admin"
TOKENS = f"# test tokens\n{W} write robots\n{R} read robots  # read-only\n\n{OTHER} write other\n{ADMIN} write *\n"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server process with namespace-scoped tokens; yields its endpoint."""
    disable_progress_bars()
    base = tmp_path_factory.mktemp("hub")
    (base / "tokens").write_text(TOKENS)
    port = free_port()
    log = open(base / "server.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.bucket",
            "--root",
            str(base / "root"),
            "--port",
            str(port),
            "--tokens",
            str(base / "tokens"),
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, (base / "server.log").read_text()
        try:
            if (
                httpx.get(f"{endpoint}/api/robotloop/stats", headers={"authorization": f"Bearer {R}"}).status_code
                == 200
            ):
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    yield endpoint
    proc.terminate()
    proc.wait(10)


def api(endpoint: str, token: str | bool) -> HfApi:
    return HfApi(endpoint=endpoint, token=token)


def _ndjson(*ops: dict) -> bytes:
    return b"".join(json.dumps(op).encode() + b"\n" for op in ops)


# --- units: tokens file, CAS tokens, paths ---------------------------------------------------


def test_tokens_file_is_parsed_and_errors_name_the_line(tmp_path: Path) -> None:
    entries = parse_tokens_text(TOKENS)
    assert entries[R].write is False and entries[ADMIN].namespace == "*"
    for text, needle in [
        ("a write\n", ":1: expected"),
        ("# c\n\na admin ns\n", ":3: access"),
        ("a read ns\na write ns\n", ":2: duplicated"),
        ("a read bad/ns\n", ":1: invalid namespace"),
    ]:
        with pytest.raises(TokensFileError, match=needle):
            parse_tokens_text(text, source="tokens")
    with pytest.raises(TokensFileError, match=r"missing: no such tokens file .*<token> <read\|write>"):
        TokenStore.from_file(tmp_path / "missing")
    (tmp_path / "empty").write_text("# only a comment\n")
    with pytest.raises(TokensFileError, match="no token in this tokens file, so every request would be refused"):
        TokenStore.from_file(tmp_path / "empty")


def test_authorize_rules() -> None:
    store = TokenStore(parse_tokens_text(TOKENS))
    assert store.authorize(W, "robots", write=True, bucket_public=False).name == "robots"
    assert store.authorize(OTHER, "robots", write=False, bucket_public=True).name == "other"
    assert store.authorize(None, "robots", write=False, bucket_public=True).anonymous
    for bearer, ns, write, public, error in [
        (None, "robots", True, True, Unauthorized),
        (None, "robots", False, False, Unauthorized),
        ("nope", "robots", False, True, Unauthorized),
        (R, "robots", True, False, Forbidden),
        (OTHER, "robots", True, False, Forbidden),
        (OTHER, "robots", False, False, Forbidden),
    ]:
        with pytest.raises(error):
            store.authorize(bearer, ns, write=write, bucket_public=public)


def test_cas_tokens_are_signed_scoped_and_expire() -> None:
    store = TokenStore(None, cas_secret=b"k" * 32)
    token, exp = store.mint_cas_token("robots", "b", write=False)
    assert exp > time.time() and store.verify_cas_token(token, write=False).bucket == "b"
    with pytest.raises(Forbidden):
        store.verify_cas_token(token, write=True)
    with pytest.raises(Unauthorized, match="signature"):
        TokenStore(None, cas_secret=b"x" * 32).verify_cas_token(token, write=False)
    with pytest.raises(Unauthorized, match="expired"):
        store.verify_cas_token(store.mint_cas_token("robots", "b", write=True, ttl_s=-1)[0], write=False)
    with pytest.raises(Unauthorized):
        store.verify_cas_token("garbage", write=False)


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/abs", "a//b", "a/", "", "a\x00b", "a\\b", "./a", "x" * 1025])
def test_bad_paths_are_refused(path: str) -> None:
    with pytest.raises(InvalidPath, match="bucket 'ns/b'"):
        validate_path("ns/b", path)


def test_good_paths_pass() -> None:
    for path in ["a", "episodes/0001/data.parquet", "ünï/cødé.txt", "a..b/.hidden", "x" * 1024]:
        assert validate_path("ns/b", path) == path


# --- bucket lifecycle and auth through HfApi --------------------------------------------------


def test_bucket_lifecycle(hub: str) -> None:
    w = api(hub, W)
    assert w.whoami()["name"] == "robots"
    url = w.create_bucket("life")  # no namespace -> "me" -> the token's namespace
    assert url.bucket_id == "robots/life" and url.url == f"{hub}/buckets/robots/life"
    with pytest.raises(HfHubHTTPError) as err:
        w.create_bucket("robots/life")
    assert err.value.response.status_code == 409
    w.create_bucket("robots/life", exist_ok=True)
    info = w.bucket_info("robots/life")
    assert (info.id, info.private, info.size, info.total_files) == ("robots/life", True, 0, 0)
    assert "robots/life" in [b.id for b in w.list_buckets()]
    assert [b.id for b in w.list_buckets("robots", search="LIF")] == ["robots/life"]
    w.update_bucket_settings("robots/life", private=False)
    assert w.bucket_info("robots/life").private is False
    w.move_bucket("robots/life", "robots/life2")
    with pytest.raises(BucketNotFoundError):
        w.bucket_info("robots/life")
    w.delete_bucket("robots/life2")
    with pytest.raises(BucketNotFoundError):
        w.delete_bucket("robots/life2")
    w.delete_bucket("robots/life2", missing_ok=True)
    with pytest.raises(HfHubHTTPError, match="invalid bucket name"):
        w.create_bucket("robots/-bad-")


def test_auth_errors(hub: str) -> None:
    api(hub, W).create_bucket("robots/private")

    def status(call) -> int:
        with pytest.raises(HfHubHTTPError) as err:
            call()
        return err.value.response.status_code

    assert status(lambda: api(hub, False).create_bucket("robots/x")) == 401
    assert status(lambda: api(hub, R).create_bucket("robots/x")) == 403
    assert status(lambda: api(hub, OTHER).create_bucket("robots/x")) == 403
    assert status(lambda: api(hub, OTHER).delete_bucket("robots/private")) == 403
    assert status(lambda: api(hub, R).batch_bucket_files("robots/private", delete=["a"])) == 403
    assert status(lambda: api(hub, OTHER).bucket_info("robots/private")) == 403
    assert status(lambda: api(hub, "not-a-token").bucket_info("robots/private")) == 401
    with pytest.raises(BucketNotFoundError):  # anonymous: private and missing look the same (401)
        api(hub, False).bucket_info("robots/private")
    with pytest.raises(BucketNotFoundError):
        api(hub, False).bucket_info("robots/never-created")
    r = httpx.get(f"{hub}/api/buckets/robots/private/xet-write-token", headers={"authorization": f"Bearer {R}"})
    assert r.status_code == 403
    assert api(hub, R).bucket_info("robots/private").id == "robots/private"  # read token may read


def test_public_bucket_is_readable_anonymously(hub: str) -> None:
    w = api(hub, W)
    w.create_bucket("robots/public", private=False)
    w.batch_bucket_files("robots/public", add=[(b"open data", "readme.txt")])
    anon = api(hub, False)
    assert anon.bucket_info("robots/public").total_files == 1
    assert [f.path for f in anon.list_bucket_tree("robots/public")] == ["readme.txt"]
    assert "robots/public" in [b.id for b in anon.list_buckets("robots")]
    assert "robots/private" not in [b.id for b in anon.list_buckets("robots")]
    fs = HfFileSystem(endpoint=hub, token=False, skip_instance_cache=True)
    assert fs.cat_file("hf://buckets/robots/public/readme.txt") == b"open data"
    assert api(hub, OTHER).bucket_info("robots/public").private is False  # other namespace may read public
    with pytest.raises(HfHubHTTPError) as err:
        anon.batch_bucket_files("robots/public", delete=["readme.txt"])
    assert err.value.response.status_code == 401


# --- data path: upload, list, read, copy, delete ------------------------------------------------


def test_upload_list_read_copy_delete(hub: str, tmp_path: Path) -> None:
    w = api(hub, W)
    w.create_bucket("robots/data")
    big = os.urandom(2_500_000)
    (tmp_path / "big.bin").write_bytes(big)
    w.batch_bucket_files(
        "robots/data",
        add=[(tmp_path / "big.bin", "ep/0/big.bin"), (b"hi", "ep/0/hi.txt"), (b"", "ep/empty"), (b"top", "top.txt")],
    )
    info = w.bucket_info("robots/data")
    assert (info.total_files, info.size) == (4, len(big) + 5)

    assert [(type(e).__name__, e.path) for e in w.list_bucket_tree("robots/data")] == [
        ("BucketFolder", "ep"),
        ("BucketFile", "top.txt"),
    ]
    assert [e.path for e in w.list_bucket_tree("robots/data", prefix="ep")] == ["ep/0", "ep/empty"]
    assert [e.path for e in w.list_bucket_tree("robots/data", recursive=True)] == [
        "ep/0/big.bin",
        "ep/0/hi.txt",
        "ep/empty",
        "top.txt",
    ]
    files = {f.path: f for f in w.get_bucket_paths_info("robots/data", ["ep/0/big.bin", "ep/empty", "nope"])}
    assert set(files) == {"ep/0/big.bin", "ep/empty"} and files["ep/0/big.bin"].size == len(big)

    meta = w.get_bucket_file_metadata("robots/data", "ep/0/big.bin")
    assert meta.size == len(big) and meta.xet_file_data.file_hash == files["ep/0/big.bin"].xet_hash
    assert meta.xet_file_data.refresh_route == f"{hub}/api/buckets/robots/data/xet-read-token"

    w.download_bucket_files(
        "robots/data", [("ep/0/big.bin", tmp_path / "out/big.bin"), ("ep/empty", tmp_path / "out/empty")]
    )
    assert (tmp_path / "out/big.bin").read_bytes() == big and (tmp_path / "out/empty").read_bytes() == b""

    fs = HfFileSystem(endpoint=hub, token=R, skip_instance_cache=True)
    with fs.open("hf://buckets/robots/data/ep/0/big.bin", "rb") as f:
        f.seek(1_234_567)
        assert f.read(300_000) == big[1_234_567:1_534_567]
    assert fs.cat_file("hf://buckets/robots/data/ep/0/big.bin", start=len(big) - 10) == big[-10:]
    assert fs.info("hf://buckets/robots/data/ep/0/hi.txt")["size"] == 2
    with HfFileSystem(endpoint=hub, token=W, skip_instance_cache=True).open(
        "hf://buckets/robots/data/fs.txt", "wb"
    ) as f:
        f.write(b"written through fsspec")
    assert fs.cat_file("hf://buckets/robots/data/fs.txt") == b"written through fsspec"
    fs.invalidate_cache()
    assert fs.find("hf://buckets/robots/data/ep") == [
        "buckets/robots/data/ep/0/big.bin",
        "buckets/robots/data/ep/0/hi.txt",
        "buckets/robots/data/ep/empty",
    ]
    r = httpx.get(
        f"{hub}/buckets/robots/data/resolve/top.txt", headers={"authorization": f"Bearer {R}", "range": "bytes=5-"}
    )
    assert r.status_code == 416 and r.headers["content-range"] == "bytes */3"

    w.batch_bucket_files(
        "robots/data", copy=[("bucket", "robots/data", files["ep/0/big.bin"].xet_hash, "copy.bin")], delete=["top.txt"]
    )
    assert fs.cat_file("hf://buckets/robots/data/copy.bin", start=0, end=100) == big[:100]
    assert [e.path for e in w.list_bucket_tree("robots/data")] == ["copy.bin", "ep", "fs.txt"]
    with pytest.raises(HfHubHTTPError, match="403 Forbidden"):  # fs holds the read-only token
        fs.rm("hf://buckets/robots/data/copy.bin")
    HfFileSystem(endpoint=hub, token=W, skip_instance_cache=True).rm("hf://buckets/robots/data/copy.bin")
    assert w.bucket_info("robots/data").total_files == 4
    stats = httpx.get(f"{hub}/api/robotloop/stats", headers={"authorization": f"Bearer {R}"}).json()
    assert stats["logical_bytes"] >= len(big) and stats["xorbs"] >= 1 and stats["bytes_served"] > 0


def test_batch_is_all_or_nothing(hub: str) -> None:
    w = api(hub, W)
    w.create_bucket("robots/atomic")
    w.batch_bucket_files("robots/atomic", add=[(b"v1", "keep.txt")])
    known = next(iter(w.get_bucket_paths_info("robots/atomic", ["keep.txt"]))).xet_hash
    body = _ndjson(
        {"type": "addFile", "path": "new.txt", "xetHash": known, "mtime": 0},
        {"type": "deleteFile", "path": "keep.txt"},
        {"type": "addFile", "path": "ghost.txt", "xetHash": "ab" * 32, "mtime": 0},
    )
    r = httpx.post(f"{hub}/api/buckets/robots/atomic/batch", content=body, headers={"authorization": f"Bearer {W}"})
    assert r.status_code == 422
    assert [f["path"] for f in r.json()["failed"]] == ["ghost.txt"] and "unknown to the CAS" in r.text
    assert [e.path for e in w.list_bucket_tree("robots/atomic")] == ["keep.txt"]  # nothing applied

    with pytest.raises(BucketBatchError, match="'..' segments"):  # real client, real upload, bad path
        w.batch_bucket_files("robots/atomic", add=[(b"x", "ok.txt"), (b"y", "../escape.txt")])
    assert [e.path for e in w.list_bucket_tree("robots/atomic")] == ["keep.txt"]

    auth = {"authorization": f"Bearer {W}"}
    for bad in (
        b"{not json\n",
        b'{"type": "addFile", "path": "a", "xetHash": "x", "size": 1e400}\n',
        b"[" * 5000 + b"\n",
    ):
        r = httpx.post(f"{hub}/api/buckets/robots/atomic/batch", content=bad, headers=auth)
        assert r.status_code == 400 and "line 1" in r.json()["error"], r.text
    r = httpx.get(f"{hub}/api/no-such-route", headers=auth)  # the Hub's error shape, header included
    assert r.status_code == 404 and r.json()["error"] == "Not Found" and r.headers["x-error-message"] == "Not Found"
    r = httpx.post(f"{hub}/api/buckets/robots/deep", content=b"[" * 5000, headers=auth)
    assert r.status_code == 400 and "invalid JSON body" in r.json()["error"], r.text


def test_a_path_is_a_file_or_a_folder_never_both(hub: str) -> None:
    """A file under a file, or a file where a folder is, is refused whole with a 409 naming both paths, whether the
    other path is in the bucket or in the same batch; the real client raises it. Deleting the one in the way in the
    same batch is fine."""
    w = api(hub, W)
    w.create_bucket("robots/clash")
    w.batch_bucket_files("robots/clash", add=[(b"notes", "notes.md"), (b"a", "dir/a.txt")])

    def refused(**ops) -> str:
        with pytest.raises(HfHubHTTPError) as err:
            w.batch_bucket_files("robots/clash", **ops)
        assert err.value.response.status_code == 409
        return err.value.server_message

    said = refused(add=[(b"inner", "notes.md/inner.md"), (b"ok", "ok.txt")])
    assert "'notes.md/inner.md'" in said and "under 'notes.md', which is a file" in said and "nothing applied" in said
    assert "'dir/a.txt' is under it" in refused(add=[(b"file", "dir")])
    assert "'x/y' is under it" in refused(add=[(b"x", "x"), (b"y", "x/y")])  # both in one batch
    deep = refused(add=[(b"deep", "notes.md/a/b/c.md")])
    assert "under 'notes.md'" in deep
    assert [e.path for e in w.list_bucket_tree("robots/clash", recursive=True)] == ["dir/a.txt", "notes.md"]
    body = _ndjson(
        {
            "type": "addFile",
            "path": "dir",
            "xetHash": next(iter(w.get_bucket_paths_info("robots/clash", ["notes.md"]))).xet_hash,
            "mtime": 0,
        }
    )
    r = httpx.post(f"{hub}/api/buckets/robots/clash/batch", content=body, headers={"authorization": f"Bearer {W}"})
    assert r.status_code == 409 and "'dir/a.txt'" in r.headers["x-error-message"] and "'dir/a.txt'" in r.json()["error"]

    w.batch_bucket_files("robots/clash", add=[(b"inner", "notes.md/inner.md")], delete=["notes.md"])
    w.batch_bucket_files("robots/clash", add=[(b"a", "dir/a.txt/b")], delete=["dir/a.txt"])
    assert [e.path for e in w.list_bucket_tree("robots/clash", recursive=True)] == ["dir/a.txt/b", "notes.md/inner.md"]


def test_a_lone_surrogate_in_a_json_body_is_refused_as_400(hub: str, tmp_path: Path) -> None:
    # JSON may escape a lone UTF-16 surrogate; Python's parser also reads raw surrogate bytes as one. Neither is text
    # SQLite or the answer's JSON can hold: refused where the body is read, naming the line.
    api(hub, W).create_bucket("robots/surrogates")
    auth = {"authorization": f"Bearer {W}"}
    known = {"type": "copyFile", "path": "c", "xetHash": "ab" * 32, "sourceRepoType": "bucket"}
    for line in (
        json.dumps({"type": "deleteFile", "path": "\ud800"}).encode(),  # the escape: "\\ud800"
        json.dumps({"type": "deleteFile", "path": "a\udc00b"}, ensure_ascii=False).encode("utf-8", "surrogatepass"),
        json.dumps({"type": "addFile", "path": "ok", "xetHash": "ab" * 32, "\ud83d": 1}).encode(),  # in a key
        json.dumps({**known, "sourceRepoId": "robots/\udfff"}).encode(),
    ):
        r = httpx.post(f"{hub}/api/buckets/robots/surrogates/batch", content=line + b"\n", headers=auth)
        assert r.status_code == 400 and "line 1" in r.json()["error"] and "surrogate" in r.text, r.text
    for body in (json.dumps({"paths": ["ok", "\ud800"]}).encode(), b'{"paths": ["\xed\xa0\x80"]}'):
        r = httpx.post(f"{hub}/api/buckets/robots/surrogates/paths-info", content=body, headers=auth)
        assert r.status_code == 400 and "surrogate" in r.json()["error"], r.text
    assert list(api(hub, W).list_bucket_tree("robots/surrogates")) == []
    store = BucketStore(tmp_path, file_size=lambda h: 1)
    store.create_bucket("robots", "surrogates")
    with pytest.raises(InvalidPath, match="not valid UTF-8"):  # the store says so too, called directly
        store.paths_info("robots", "surrogates", ["\ud800"])


def test_numbers_of_any_length_in_a_query_or_range_are_no_500(hub: str) -> None:
    w = api(hub, W)
    w.create_bucket("robots/numbers")
    w.batch_bucket_files("robots/numbers", add=[(b"0123456789", "ten.bin")])
    auth = {"authorization": f"Bearer {W}"}
    file_hash = next(iter(w.get_bucket_paths_info("robots/numbers", ["ten.bin"]))).xet_hash
    huge = "9" * 5000  # past int()'s 4,300 digits
    # A signed xorb URL with an expiry no URL of ours has: refused like a bad signature (hf_xet asks anew on 403).
    r = httpx.get(f"{hub}/v1/xorb-data/{'ab' * 32}?exp={huge}&sig=0")
    assert r.status_code == 403, r.text
    # Range positions of any length: past the end is unsatisfiable; a last position past the end is the rest.
    resolve = f"{hub}/buckets/robots/numbers/resolve/ten.bin"
    assert httpx.get(resolve, headers={**auth, "range": f"bytes={huge}-"}).status_code == 416
    r = httpx.get(resolve, headers={**auth, "range": f"bytes=2-{huge}"})
    assert (r.status_code, r.content) == (206, b"23456789")
    r = httpx.get(resolve, headers={**auth, "range": f"bytes=-{'0' * 4990}3"})
    assert (r.status_code, r.content) == (206, b"789")
    cas = httpx.get(f"{hub}/api/buckets/robots/numbers/xet-read-token", headers=auth).json()
    read = {"authorization": f"Bearer {cas['accessToken']}"}
    r = httpx.get(f"{hub}/v1/reconstructions/{file_hash}", headers={**read, "range": f"bytes={huge}-{huge}"})
    assert r.status_code == 416, r.text
    r = httpx.get(f"{hub}/v1/reconstructions/{file_hash}", headers={**read, "range": f"bytes=0-{huge}"})
    assert r.status_code == 200, r.text
    url = next(iter(r.json()["fetch_info"].values()))[0]["url"]
    r = httpx.get(url, headers={"range": f"bytes=-{huge}"})
    assert r.status_code == 206, r.text
    assert httpx.get(url, headers={"range": f"bytes={huge}-"}).status_code == 416


def test_knowing_a_private_files_hash_is_not_enough_to_read_it(hub: str, tmp_path: Path) -> None:
    secret = os.urandom(300_000)
    api(hub, W).create_bucket("robots/vault")  # private by default
    api(hub, W).batch_bucket_files("robots/vault", add=[(secret, "weights.bin")])
    leaked = next(iter(api(hub, W).get_bucket_paths_info("robots/vault", ["weights.bin"]))).xet_hash
    other = api(hub, OTHER)
    other.create_bucket("other/mine")
    other.batch_bucket_files("other/mine", add=[(b"mine", "mine.txt")])
    # 1. Another namespace's CAS token cannot reconstruct it (the same answer as for an unknown file).
    cas = httpx.get(f"{hub}/api/buckets/other/mine/xet-read-token", headers={"authorization": f"Bearer {OTHER}"}).json()
    r = httpx.get(
        f"{cas['casUrl']}/v1/reconstructions/{leaked}", headers={"authorization": f"Bearer {cas['accessToken']}"}
    )
    assert r.status_code == 404
    # 2. Nor link it into its own bucket by hash, to read it from there.
    link = _ndjson({"type": "addFile", "path": "stolen.bin", "xetHash": leaked, "mtime": 0})
    r = httpx.post(f"{hub}/api/buckets/other/mine/batch", content=link, headers={"authorization": f"Bearer {OTHER}"})
    assert r.status_code == 422 and "was not uploaded to namespace 'other'" in r.text
    assert [e.path for e in other.list_bucket_tree("other/mine")] == ["mine.txt"]
    # Who has the file may: its own upload in another namespace (real client, Xet dedup on), or a reader of it.
    other.batch_bucket_files("other/mine", add=[(secret, "own-copy.bin")])
    api(hub, W).create_bucket("robots/vault2")
    r = httpx.post(f"{hub}/api/buckets/robots/vault2/batch", content=link, headers={"authorization": f"Bearer {W}"})
    assert r.status_code == 200, r.text
    (tmp_path / "back").mkdir()
    other.download_bucket_files("other/mine", [("own-copy.bin", tmp_path / "back" / "c.bin")])
    assert (tmp_path / "back" / "c.bin").read_bytes() == secret


def test_tree_pagination_follows_link_headers(hub: str) -> None:
    w = api(hub, W)
    w.create_bucket("robots/many")
    w.batch_bucket_files("robots/many", add=[(b"same bytes", "seed")])
    h = next(iter(w.get_bucket_paths_info("robots/many", ["seed"]))).xet_hash
    ops = [{"type": "addFile", "path": f"d{i % 3}/f{i:05d}", "xetHash": h, "mtime": 0} for i in range(2400)]
    ops += [{"type": "addFile", "path": f"top{i:05d}", "xetHash": h, "mtime": 0} for i in range(1100)]
    r = httpx.post(
        f"{hub}/api/buckets/robots/many/batch", content=_ndjson(*ops), headers={"authorization": f"Bearer {W}"}
    )
    assert r.status_code == 200, r.text
    paths = [e.path for e in w.list_bucket_tree("robots/many", recursive=True)]
    assert len(paths) == 3501 and paths == sorted(paths)
    top = [e.path for e in w.list_bucket_tree("robots/many")]
    assert top[:3] == ["d0", "d1", "d2"] and len(top) == 3 + 1 + 1100
    assert len(list(w.list_bucket_tree("robots/many", prefix="d1"))) == 800


def test_sync_bucket_round_trip(hub: str, tmp_path: Path) -> None:
    w = api(hub, W)
    w.create_bucket("robots/sync")
    src = tmp_path / "src"
    for rel, data in {"a.txt": b"a", "sub/b.bin": os.urandom(200_000), "sub/deep/c": b"c"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    w.sync_bucket(str(src), "hf://buckets/robots/sync", quiet=True)
    assert w.bucket_info("robots/sync").total_files == 3
    again = w.sync_bucket(str(src), "hf://buckets/robots/sync", quiet=True)
    assert again.summary()["uploads"] == 0  # sizes and mtimes match: nothing to do
    w.sync_bucket("hf://buckets/robots/sync", str(tmp_path / "dst"), quiet=True)
    for rel in ["a.txt", "sub/b.bin", "sub/deep/c"]:
        assert (tmp_path / "dst" / rel).read_bytes() == (src / rel).read_bytes()
    (src / "a.txt").unlink()
    w.sync_bucket(str(src), "hf://buckets/robots/sync", delete=True, quiet=True)
    assert [e.path for e in w.list_bucket_tree("robots/sync", recursive=True)] == ["sub/b.bin", "sub/deep/c"]


def test_hf_buckets_cli(hub: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "HF_ENDPOINT": hub,
        "HF_TOKEN": W,
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    hf = str(Path(sys.executable).with_name("hf"))

    def run(*args: str) -> str:
        out = subprocess.run([hf, "buckets", *args], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    run("create", "robots/cli")
    (tmp_path / "f.txt").write_text("from the cli")
    run("cp", str(tmp_path / "f.txt"), "hf://buckets/robots/cli/dir/f.txt")
    assert "dir/f.txt" in run("ls", "robots/cli", "-R")
    assert "robots/cli" in run("list", "robots")
    assert "robots/cli" in run("info", "robots/cli")
    run("cp", "hf://buckets/robots/cli/dir/f.txt", str(tmp_path / "back.txt"))
    assert (tmp_path / "back.txt").read_text() == "from the cli"
    run("rm", "robots/cli/dir/f.txt", "-y")
    assert api(hub, W).bucket_info("robots/cli").total_files == 0
    (tmp_path / "tree/sub").mkdir(parents=True)
    (tmp_path / "tree/sub/x.bin").write_bytes(b"x" * 1000)
    run("sync", str(tmp_path / "tree"), "hf://buckets/robots/cli/synced")
    assert [f.path for f in api(hub, R).list_bucket_tree("robots/cli", recursive=True)] == ["synced/sub/x.bin"]
    run("delete", "robots/cli", "-y")


# --- open local mode, body limit, durability ---------------------------------------------------


def test_open_local_mode(tmp_path: Path) -> None:
    with TestClient(create_app(tmp_path / "root", tokens_file=None)) as client:
        assert client.post("/api/buckets/me/b", json={}).json()["id"] == "local/b"  # no token needed
        assert client.get("/api/buckets/local/b", headers={"authorization": "Bearer anything"}).status_code == 200
        assert client.get("/api/whoami-v2").json()["name"] == "local"
    with pytest.raises(ValueError, match="non-loopback"):
        serve(BucketOptions(tmp_path / "root", host="0.0.0.0", port=0, tokens=None))


def test_body_limit(tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text(TOKENS)
    with TestClient(create_app(tmp_path / "root", tmp_path / "tokens", max_body_bytes=1000)) as client:
        r = client.post("/api/buckets/robots/b/batch", content=b"x" * 5000, headers={"authorization": f"Bearer {W}"})
        assert r.status_code == 413
    with TestClient(create_app(tmp_path / "root", tmp_path / "tokens")) as client:
        many = b'{"type":"deleteFile","path":"x"}\n' * 10_001
        # No token: refused before the body is read. With one: too many operations, refused before parsing.
        assert client.post("/api/buckets/robots/b/batch", content=many).status_code == 401
        r = client.post("/api/buckets/robots/b/batch", content=many, headers={"authorization": f"Bearer {W}"})
        assert r.status_code == 413 and "at most 10000 operations" in r.headers["X-Error-Message"]
        r = client.post(
            "/api/buckets/robots/b/paths-info", json={"paths": ["p"] * 10_001}, headers={"authorization": f"Bearer {W}"}
        )
        assert r.status_code == 413
        r = client.post(
            "/api/buckets/robots/b2", content=b"{" + b" " * (5 * 2**20) + b"}", headers={"authorization": f"Bearer {W}"}
        )
        assert r.status_code == 413


_WRITER = textwrap.dedent("""
    import sys
    from robotloop.storage.server.buckets import AddFile, BucketStore
    store = BucketStore(sys.argv[1], file_size=lambda h: 1)
    store.create_bucket("ns", "b")
    gen = 0
    while True:
        gen += 1
        store.apply_batch("ns", "b", [AddFile(f"p{i:03d}", f"{gen:064x}") for i in range(200)])
        print(gen, flush=True)
""")


def test_kill_9_leaves_every_batch_whole(tmp_path: Path) -> None:
    """SIGKILL a writer mid-stream: every path must show the same (last committed) batch."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    acked = [int(proc.stdout.readline()) for _ in range(5)]  # let a few batches commit
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = BucketStore(tmp_path, file_size=lambda h: 1)
    hashes = {f.xet_hash for f in store.list_tree("ns", "b", recursive=True)}
    assert len(hashes) == 1 and len(store.list_tree("ns", "b", recursive=True)) == 200
    assert int(hashes.pop(), 16) >= acked[-1]  # an acknowledged batch is never lost


def test_a_busy_port_is_refused_before_the_banner() -> None:
    import socket

    from services.ports import PortInUse, require_free_port

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUse, match=f"127.0.0.1:{port}: Address already in use"):
            require_free_port("127.0.0.1", port)
    require_free_port("127.0.0.1", port)  # free again
