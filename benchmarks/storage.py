"""Storage figures for BENCHMARKS.md: dedup on re-upload, append workload, download throughput.

Run:  .venv/bin/python benchmarks/storage.py [--size-mb 500] [--download-mb 2048] [--out results.json]

Starts a fresh robotloop bucket server (through the embedded-server launcher, in a temporary root) and
measures with the real huggingface_hub + hf_xet clients. "Bytes at the server" is the server's own count
of request bytes received (GET /api/robotloop/stats), so nothing here trusts the client's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server

MB = 1_000_000


def server_bytes_received(client: BucketClient) -> int:
    r = httpx.get(f"{client.endpoint}/api/robotloop/stats", headers={"authorization": f"Bearer {client.token}"})
    return r.json()["bytes_received"]


def dedup_figures(client: BucketClient, work: Path, size_mb: int) -> list[dict]:
    """Upload a random file, then re-upload it with 1%, 5%, 10% of its bytes changed in one region."""
    url = BucketUrl.parse("hf://buckets/bench/dedup/blob.bin")
    client.create_bucket(url)
    path = work / "blob.bin"
    original = os.urandom(size_mb * MB)
    path.write_bytes(original)
    before = server_bytes_received(client)
    report = client.upload(path, url)
    rows = [
        {
            "case": "first upload",
            "file_mb": size_mb,
            "server_mb": (server_bytes_received(client) - before) / MB,
            "client_sent_mb": report.bytes_sent / MB,
        }
    ]
    for percent in (1, 5, 10):
        data = bytearray(original)
        start, length = len(data) // 3, len(data) * percent // 100
        data[start : start + length] = os.urandom(length)
        path.write_bytes(data)
        before = server_bytes_received(client)
        report = client.upload(path, url)
        rows.append(
            {
                "case": f"{percent}% changed",
                "file_mb": size_mb,
                "server_mb": (server_bytes_received(client) - before) / MB,
                "client_sent_mb": report.bytes_sent / MB,
                "hub_public_mb": {1: 5.5, 5: 27.5, 10: 55}[percent] * size_mb / 500,
            }
        )
    return rows


def download_figures(client: BucketClient, work: Path, size_mb: int, repeats: int = 3) -> dict:
    """Download one file from the server and from hf_xet's local:// store, alternating, same process."""
    import hf_xet

    path = work / "big.bin"
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(MB))
    url = BucketUrl.parse("hf://buckets/bench/throughput/big.bin")
    client.create_bucket(url)
    client.upload(path, url)
    store = f"local://{work / 'local-store'}"
    session = hf_xet.XetSession()
    expiry = int(time.time()) + 3600
    commit = session.new_upload_commit(endpoint=store, token="local", token_expiry_unix_secs=expiry)
    handle = commit.start_upload_file(str(path), sha256=hf_xet.SKIP_SHA256)
    commit.wait_to_finish()
    info = handle.result().xet_info
    path.unlink()
    client.cache = None  # measure the network path, not the read cache

    def from_server() -> float:
        t = time.perf_counter()
        client.download(url, work / "from-server.bin")
        return time.perf_counter() - t

    def from_local() -> float:
        t = time.perf_counter()
        with session.new_file_download_group(endpoint=store, token="local", token_expiry_unix_secs=expiry) as group:
            group.start_download_file(hf_xet.XetFileInfo(info.hash, info.file_size), str(work / "from-local.bin"))
        return time.perf_counter() - t

    server_s, local_s = [], []
    for _ in range(repeats):
        server_s.append(from_server())
        local_s.append(from_local())
        for p in ("from-server.bin", "from-local.bin"):
            (work / p).unlink(missing_ok=True)
    server_mbs, local_mbs = size_mb / statistics.median(server_s), size_mb / statistics.median(local_s)
    return {
        "file_mb": size_mb,
        "server_MBps": server_mbs,
        "local_store_MBps": local_mbs,
        "ratio": server_mbs / local_mbs,
        "server_s": server_s,
        "local_s": local_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--download-mb", type=int, default=2048)
    parser.add_argument("--skip", nargs="*", default=[], choices=["dedup", "download"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} {os.cpu_count()} cores"}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        server = ensure_embedded_server(work / "server")
        client = BucketClient(server.endpoint, server.token)
        try:
            if "dedup" not in args.skip:
                results["dedup"] = dedup_figures(client, work, args.size_mb)
                print(json.dumps(results["dedup"], indent=1), flush=True)
            if "download" not in args.skip:
                results["download"] = download_figures(client, work, args.download_mb)
                print(json.dumps(results["download"], indent=1), flush=True)
        finally:
            stop_embedded_server(work / "server")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
