"""Xet CAS server tests: a real uvicorn server driven by the real hf_xet client, plus bad input.

Run: .venv/bin/python -m pytest tests/test_cas.py -q
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hf_xet
import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, HTTPException, Request

from robotloop.storage.server import xet_format as xf
from robotloop.storage.server.cas import CasStore
from services.bucket.cas_api import cas_router

MAX_XORB = 4 * 1024 * 1024
MAX_SHARD = 1024 * 1024
READ = {"Authorization": "Bearer cas-read"}
WRITE = {"Authorization": "Bearer cas-write"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(endpoint, store, request log) for a live server on a free 127.0.0.1 port.

    Besides the CAS router, the app has a stand-in for the Hub's xet token endpoint, so the
    client is driven exactly as huggingface_hub drives it (token_refresh_url -> casUrl/token).
    """
    tmp = tmp_path_factory.mktemp("cas")
    old_hf_home = os.environ.get("HF_HOME")
    os.environ["HF_HOME"] = str(tmp / "hf_home")  # isolate hf_xet's local chunk/shard caches
    store = CasStore(tmp / "store", max_xorb_bytes=MAX_XORB, max_shard_bytes=MAX_SHARD)
    log: list[tuple[str, str, int]] = []

    def authorize(request: Request, write: bool) -> None:  # the tokens our xet_token hands out
        token = request.headers.get("authorization")
        if token not in ({WRITE["Authorization"]} if write else {READ["Authorization"], WRITE["Authorization"]}):
            raise HTTPException(401 if token is None else 403, "missing or insufficient CAS token")

    app = FastAPI()
    app.include_router(cas_router(store, authorize))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"

    @app.get("/api/buckets/{ns}/{name}/xet-{kind}-token")
    def xet_token(ns: str, name: str, kind: str) -> dict:
        return {"casUrl": endpoint, "accessToken": f"cas-{kind}", "exp": int(time.time()) + 3600}

    @app.middleware("http")
    async def record(request: Request, call_next):
        response = await call_next(request)
        log.append((request.method, request.url.path, response.status_code))
        return response

    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    yield endpoint, store, log
    srv.should_exit = True
    thread.join(timeout=5)
    store.close()
    if old_hf_home is None:
        os.environ.pop("HF_HOME", None)
    else:
        os.environ["HF_HOME"] = old_hf_home


def _auth(endpoint: str, kind: str) -> dict:
    return {
        "token_refresh_url": f"{endpoint}/api/buckets/me/test/xet-{kind}-token",
        "token_refresh_headers": {"Authorization": "Bearer hub-user-token"},
    }


def _upload(endpoint: str, paths: list[Path]) -> list[str]:
    """Upload files with a fresh XetSession, the way huggingface_hub does; returns file hashes."""
    with hf_xet.XetSession().new_upload_commit(**_auth(endpoint, "write")) as commit:
        handles = [commit.start_upload_file(str(p), sha256=hf_xet.SKIP_SHA256) for p in paths]
    return [h.result().xet_info.hash for h in handles]


def _download(endpoint: str, file_hash: str, size: int, dest: Path) -> bytes:
    with hf_xet.XetSession().new_file_download_group(**_auth(endpoint, "read")) as group:
        handle = group.start_download_file(hf_xet.XetFileInfo(file_hash, size), str(dest))
    handle.result()
    return dest.read_bytes()


def _schemes(store: CasStore) -> set[int]:
    """Compression schemes used by the chunks of every stored xorb."""
    out = set()
    for p in (store.root / "xorbs").rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            for a, _, _ in xf.iter_chunks(data):
                out.add(data[a + 4])
    return out


# ---- the real client ------------------------------------------------------------------------


def test_client_roundtrip_dedup_and_ranges(server, tmp_path):
    endpoint, store, log = server
    rng = random.Random(0)
    big = rng.randbytes(1_000_000)
    text = b"".join(b"line %d of a compressible log file\n" % i for i in range(20_000))  # -> LZ4
    floats = (np.random.default_rng(0).normal(size=100_000) * 0.01).astype(np.float32).tobytes()  # BG4
    files = {"big.bin": big, "small.txt": b"hello xet\n", "log.txt": text, "floats.bin": floats}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)

    hashes = dict(zip(files, _upload(endpoint, [tmp_path / n for n in files]), strict=True))
    st = store.stats()
    assert st["files"] == 4 and st["xorbs"] >= 1 and st["shards"] >= 1
    assert st["xorb_bytes"] < sum(map(len, files.values()))  # text compressed
    assert {1, 2} <= _schemes(store)  # LZ4 and byte-grouped LZ4 chunks were parsed and verified
    for name, data in files.items():
        assert store.file_size(hashes[name]) == len(data)

    # A modified copy of big.bin: only the changed region's chunks may travel.
    variant = bytearray(big)
    variant[500_000:500_100] = rng.randbytes(100)
    (tmp_path / "variant.bin").write_bytes(variant)
    # A fresh HF_HOME empties the client's local shard cache: dedup must come from the server's
    # global dedup answer for the file's first chunk.
    os.environ["HF_HOME"] = str(tmp_path / "fresh_hf_home")
    before = store.stats()["bytes_received"]
    [vhash] = _upload(endpoint, [tmp_path / "variant.bin"])
    sent = store.stats()["bytes_received"] - before
    assert 0 < sent < len(big) // 3, f"re-upload sent {sent} bytes for a 100-byte edit"
    assert ("GET", f"/v1/chunks/default/{_first_chunk(store, hashes['big.bin'])}", 200) in log

    # Full downloads through the reconstruction API and signed xorb fetch URLs.
    for name, data in {**files, "variant.bin": bytes(variant)}.items():
        h = vhash if name == "variant.bin" else hashes[name]
        assert _download(endpoint, h, len(data), tmp_path / f"dl-{name}") == data

    # A byte range, read by hand: reconstruction JSON -> ranged xorb fetches -> chunk decode.
    start, end = 123_456, 654_321
    got = _read_range(endpoint, hashes["big.bin"], start, end)
    assert got == big[start : end + 1]
    assert store.stats()["bytes_served"] > 0


def _first_chunk(store: CasStore, file_hash: str) -> str:
    rec = store.reconstruction(file_hash)
    term = rec["terms"][0]
    chunk = store.index.chunks(store.index.db(), term["hash"])[term["range"]["start"]]
    return xf.hash_to_hex(chunk.hash)


def _read_range(endpoint: str, file_hash: str, start: int, end: int) -> bytes:
    r = httpx.get(f"{endpoint}/v1/reconstructions/{file_hash}", headers={"Range": f"bytes={start}-{end}", **READ})
    r.raise_for_status()
    rec = r.json()
    assert set(rec) == {"offset_into_first_range", "terms", "fetch_info"}
    out = bytearray()
    for term in rec["terms"]:
        fi = next(
            f
            for f in rec["fetch_info"][term["hash"]]
            if f["range"]["start"] <= term["range"]["start"] and term["range"]["end"] <= f["range"]["end"]
        )
        ur = fi["url_range"]
        body = httpx.get(fi["url"], headers={"Range": f"bytes={ur['start']}-{ur['end']}"})  # no token
        assert body.status_code == 206
        chunks = [raw for _, _, raw in xf.iter_chunks(body.content)]
        skip = term["range"]["start"] - fi["range"]["start"]
        data = b"".join(chunks[skip : skip + term["range"]["end"] - term["range"]["start"]])
        assert len(data) == term["unpacked_length"]
        out += data
    off = rec["offset_into_first_range"]
    return bytes(out[off : off + end - start + 1])


def test_dedup_query_returns_loadable_shard(server, tmp_path):
    endpoint, store, _ = server
    data = random.Random(1).randbytes(200_000)
    (tmp_path / "d.bin").write_bytes(data)
    [fhash] = _upload(endpoint, [tmp_path / "d.bin"])
    chunk = _first_chunk(store, fhash)
    r = httpx.get(f"{endpoint}/v1/chunks/default-merkledb/{chunk}", headers=WRITE)
    assert r.status_code == 200
    shard = xf.parse_shard(r.content)
    # The footer the client loads lookup tables from sits at the very end; it carries the chunk hash key.
    footer = xf.SHARD_FOOTER.unpack_from(r.content, len(r.content) - xf.SHARD_FOOTER.size)
    assert footer[0] == xf.FOOTER_VERSION and footer[-1] == len(r.content) - xf.SHARD_FOOTER.size
    key, listed = footer[9], {c.hash for x in shard.xorbs for c in x.chunks}
    assert key != xf.ZERO_HASH and xf.hex_to_hash(chunk) not in listed  # no chunk hash in the clear
    assert xf.keyed_chunk_hash(xf.hex_to_hash(chunk), key) in listed  # the asker, who holds it, can match it
    again = httpx.get(f"{endpoint}/v1/chunks/default-merkledb/{chunk}", headers=WRITE).content
    assert xf.SHARD_FOOTER.unpack_from(again, len(again) - xf.SHARD_FOOTER.size)[9] != key  # a fresh key each time
    assert httpx.get(f"{endpoint}/v1/chunks/default/{'0' * 64}", headers=WRITE).status_code == 404
    assert httpx.get(f"{endpoint}/v1/chunks/default-merkledb/{chunk}", headers=READ).status_code == 403


# ---- bad input ------------------------------------------------------------------------------


def _xorb(chunks: list[bytes]) -> tuple[str, bytes]:
    body = b"".join(xf.serialize_chunk(c, xf.SCHEME_LZ4 if i % 2 else xf.SCHEME_NONE) for i, c in enumerate(chunks))
    return xf.hash_to_hex(xf.xorb_hash([(xf.chunk_hash(c), len(c)) for c in chunks])), body


def _shard(xorb_hex: str, chunks: list[bytes], packed: int, *, term=None, fhash=None) -> bytes:
    """Upload-style shard: one file made of all chunks of one xorb (overridable for tests)."""
    hashes = [xf.chunk_hash(c) for c in chunks]
    xh, total = xf.hex_to_hash(xorb_hex), sum(map(len, chunks))
    term = term or xf.FileTerm(xh, 0, len(chunks), total)
    f = xf.ShardFile(
        fhash or xf.file_hash([(h, len(c)) for h, c in zip(hashes, chunks, strict=True)]),
        [term],
        verification=[xf.verification_hash(hashes)],
    )
    pos, entries = 0, []
    for h, c in zip(hashes, chunks, strict=True):
        entries.append(xf.ShardChunk(h, pos, len(c), 0))
        pos += len(c)
    return xf.serialize_shard(xf.Shard([f], [xf.ShardXorb(xh, entries, total, packed)]))


def _stored(store: CasStore) -> int:
    return sum(1 for d in ("xorbs", "shards") for p in (store.root / d).rglob("*") if p.is_file())


def test_bad_inputs(server):
    endpoint, store, _ = server
    rng = random.Random(2)
    chunks = [rng.randbytes(20_000), b"z" * 30_000, rng.randbytes(5_000)]
    xh, body = _xorb(chunks)
    n0 = _stored(store)

    with httpx.Client(base_url=endpoint, headers=WRITE) as c:
        # Xorb whose bytes do not hash to the URL hash, and plain garbage: 400, nothing stored.
        r = c.post(f"/v1/xorbs/default/{'ab' * 32}", content=body)
        assert r.status_code == 400 and "content hashes to" in r.json()["detail"]
        assert c.post(f"/v1/xorbs/default/{xh}", content=body[:-7]).status_code == 400
        assert c.post(f"/v1/xorbs/default/{xh}", content=b"\x07" * 64).status_code == 400
        assert c.post("/v1/xorbs/default/NOTHEX", content=body).status_code == 400
        assert c.post(f"/v1/xorbs/other/{xh}", content=body).status_code == 400
        # Shard before its xorb exists: unknown xorb.
        shard = _shard(xh, chunks, len(body))
        r = c.post("/v1/shards", content=shard)
        assert r.status_code == 400 and "not stored" in r.json()["detail"]
        assert _stored(store) == n0 and store.xorb_size(xh) is None

        assert c.post(f"/v1/xorbs/default/{xh}", content=body).json() == {"was_inserted": True}
        assert c.post(f"/v1/xorbs/default/{xh}", content=body).json() == {"was_inserted": False}
        n1 = _stored(store)
        # Truncated shard, out-of-range chunk term, wrong file hash: 400, nothing stored.
        r = c.post("/v1/shards", content=shard[:100])
        assert r.status_code == 400 and "truncated" in r.json()["detail"]
        bad_term = xf.FileTerm(xf.hex_to_hash(xh), 1, 9, sum(map(len, chunks)))
        r = c.post("/v1/shards", content=_shard(xh, chunks, len(body), term=bad_term))
        assert r.status_code == 400 and "out of bounds" in r.json()["detail"]
        r = c.post("/v1/shards", content=_shard(xh, chunks, len(body), fhash=b"\x01" * 32))
        assert r.status_code == 400
        assert _stored(store) == n1
        # The good shard registers the file; it then reconstructs, incl. range errors.
        assert c.post("/v1/shards", content=shard).json() == {"result": 1}
        assert c.post("/v1/shards", content=shard).json() == {"result": 0}
        fh = xf.hash_to_hex(xf.parse_shard(shard).files[0].hash)
        assert _read_range(endpoint, fh, 10, 50_000) == b"".join(chunks)[10:50_001]
        r = c.get(f"/v1/reconstructions/{fh}", headers={"Range": "bytes=999999-1000000"})
        assert r.status_code == 416

        # Unknown file -> 404; oversize bodies -> 413 without storing.
        assert c.get(f"/v1/reconstructions/{'cd' * 32}").status_code == 404
        assert c.post(f"/v1/xorbs/default/{'ef' * 32}", content=b"\0" * (MAX_XORB + 1)).status_code == 413
        assert c.post("/v1/shards", content=b"\0" * (MAX_SHARD + 1)).status_code == 413
        assert store.xorb_size("ef" * 32) is None
        # Fetch URLs: unknown xorb 404; v2/grant endpoints 404 so hf_xet falls back to v1.
        assert c.get(store.fetch_url("", "12" * 32)).status_code == 404
        assert c.get(f"/v2/reconstructions/{fh}").status_code == 404
        assert c.post(f"/v1/xorb-grants/default/{xh}", json={}).status_code == 404

    # Auth: every endpoint asks authorize(); fetch URLs are signed instead (no token is sent).
    assert httpx.post(f"{endpoint}/v1/shards", content=shard).status_code == 401
    assert httpx.post(f"{endpoint}/v1/xorbs/default/{xh}", content=body, headers=READ).status_code == 403
    assert httpx.get(f"{endpoint}/v1/reconstructions/{fh}").status_code == 401
    url = httpx.get(f"{endpoint}/v1/reconstructions/{fh}", headers=READ).json()["fetch_info"][xh][0]["url"]
    assert httpx.get(url).status_code == 200 and httpx.get(url).content == body
    assert httpx.get(url.replace("sig=", "sig=0")).status_code == 403  # hf_xet refreshes on 403
    assert httpx.get(url, headers={"Range": "bytes=-10"}).content == body[-10:]
    # Without a signature, not even a CAS token reads a xorb: its hash alone must not be enough.
    assert httpx.get(f"{endpoint}/v1/xorb-data/{xh}").status_code == 403
    assert httpx.get(f"{endpoint}/v1/xorb-data/{xh}", headers=READ).status_code == 403


def test_concurrent_stores_share_one_root(server, tmp_path):
    """Several CasStore objects (as in several server processes) writing the same root at once."""
    _, store, _ = server
    stores = [CasStore(store.root) for _ in range(4)]
    xorbs = [_xorb([random.Random(i).randbytes(9_000)]) for i in range(8)]
    same = xorbs[0]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: stores[i % 4].put_xorb(*(same if i % 2 else xorbs[i // 2])), range(16)))
    assert sum(r.was_inserted for r in results if r.hash == same[0]) == 1
    assert all(stores[0].xorb_size(h) == len(b) for h, b in xorbs)


def test_format_roundtrip():
    # bg4 regroup inverts the split for every length remainder.
    for n in range(9):
        data = bytes(range(n))
        grouped = b"".join(data[i::4] for i in range(4))
        assert xf.bg4_regroup(grouped) == data
    h = xf.chunk_hash(b"abc")
    assert xf.hex_to_hash(xf.hash_to_hex(h)) == h
    with pytest.raises(xf.FormatError):
        xf.hex_to_hash("xyz")
