"""Damaged bytes on the bucket server are never served: a flipped bit or a truncated xorb is an error status on every
read path (/resolve, HfFileSystem, hf_xet downloads, BucketClient.read_range), `robotloop bucket scrub` names what is
damaged, and uploading the file again repairs it. Its own real server (the damage stays out of the shared one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi

from robotloop.storage import BucketClient, BucketUrl, StorageError

from .conftest import WRITE_TOKEN, start_server


@pytest.fixture
def damaged(tmp_path, tokens_file):
    server = start_server(tmp_path / "root", tokens_file)
    data = os.urandom(300_000)
    (tmp_path / "f.bin").write_bytes(data)
    client = BucketClient(server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/corrupt/f.bin")
    client.create_bucket(url)
    client.upload(tmp_path / "f.bin", url)
    [xorb] = [p for p in (tmp_path / "root" / "cas" / "xorbs").rglob("*") if p.is_file()]
    yield server, client, url, data, xorb
    server.proc.terminate()
    server.proc.wait(10)


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def _scrub(root: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "robotloop.cli", "bucket", "scrub", "--root", str(root)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})


def test_a_flipped_bit_is_never_served_is_found_by_scrub_and_an_upload_repairs_it(damaged, tmp_path, monkeypatch):
    server, client, url, data, xorb = damaged
    assert client.read_range(url, 0, 1000) == data[:1000]
    _flip(xorb, 5000)  # inside the first chunk's compressed bytes

    auth = {"authorization": f"Bearer {WRITE_TOKEN}"}
    r = httpx.get(f"{server.endpoint}/buckets/lab/corrupt/resolve/f.bin", headers=auth)
    assert r.status_code == 410 and "damaged" in r.text and r.content != data
    t0 = time.monotonic()
    with pytest.raises(StorageError):  # the trainer's read path: an error, not wrong bytes
        client.read_range(url, 0, 1000)
    assert time.monotonic() - t0 < 10  # no minutes of retries
    api = HfApi(endpoint=server.endpoint, token=WRITE_TOKEN)
    with pytest.raises(Exception):  # noqa: B017 - hf_xet's own error type; what matters is that it fails
        api.download_bucket_files("lab/corrupt", [("f.bin", str(tmp_path / "got.bin"))])
    got = tmp_path / "got.bin"
    assert not got.exists() or data.startswith(got.read_bytes())  # never a wrong byte on disk

    scrub = _scrub(server.root)
    said = " ".join(scrub.stdout.split())
    assert scrub.returncode == 1 and "damaged xorb" in said and "breaks lab/corrupt/f.bin" in said, said

    # The owner uploads the file again (a fresh client cache, as after the error): dedup no longer offers the
    # damaged xorb, so its bytes go up again and replace the damaged copy.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "fresh-hf-home"))
    client.upload(tmp_path / "f.bin", url)
    assert client.read_range(url, 0, len(data)) == data
    assert _scrub(server.root).returncode == 0


def test_a_truncated_xorb_is_an_error_status_not_a_dropped_connection(damaged):
    server, client, url, data, xorb = damaged
    xorb.write_bytes(xorb.read_bytes()[: xorb.stat().st_size // 2])
    r = httpx.get(
        f"{server.endpoint}/buckets/lab/corrupt/resolve/f.bin", headers={"authorization": f"Bearer {WRITE_TOKEN}"}
    )
    assert r.status_code == 410 and "damaged" in r.text
    t0 = time.monotonic()
    with pytest.raises(StorageError):
        client.read_range(url, 0, 1000)
    assert time.monotonic() - t0 < 10
