"""`robotloop demo`: a storage round trip through a bucket (the main job is `robotloop loop`).

It shows what robotloop's storage gives a robot team: an upload, a re-upload of the same file with 1% of
its bytes changed (only the changed chunks travel), a ranged read, and a verified download.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

import typer
from rich.table import Table

from ..storage import BucketUrl, connect
from .output import cli_console

console = cli_console()


def demo(
    ctx: typer.Context,
    bucket: str = typer.Option("hf://buckets/local/demo", help="Bucket to use."),
    size_mb: int = typer.Option(64, min=1, help="Size of the demo file in MB."),
) -> None:
    """Storage round trip: upload, change 1%, re-upload (dedup), ranged read, download and verify."""
    t0 = time.perf_counter()
    client = connect(ctx.obj)
    console.print(f"bucket endpoint: {client.endpoint}")
    url = BucketUrl.parse(bucket) / "demo" / "blob.bin"
    client.create_bucket(url)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "blob.bin"
        data = bytearray(os.urandom(size_mb * 2**20))
        local.write_bytes(data)
        first = client.upload(local, url)
        rows.append(("first upload", first.bytes_total, first.bytes_sent))
        start = len(data) // 2
        data[start : start + len(data) // 100] = os.urandom(len(data) // 100)  # 1% changed, one region
        local.write_bytes(data)
        second = client.upload(local, url)
        rows.append(("1% changed, re-upload", second.bytes_total, second.bytes_sent))
        ranged = client.read_range(url, start, start + 4096) == bytes(data[start : start + 4096])
        back = client.download(url, Path(tmp) / "back.bin")
        same = ranged and hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()
    table = Table("step", "file bytes", "bytes sent", title=f"robotloop storage round trip ({url})")
    for step, total, sent in rows:
        table.add_row(step, f"{total:,}", f"{sent:,}")
    console.print(table)
    console.print(
        f"ranged read: {'ok' if ranged else 'MISMATCH'}; download verified: {'ok' if same else 'MISMATCH'}; "
        f"{time.perf_counter() - t0:.1f} s"
    )
    if not same:
        raise typer.Exit(1)
