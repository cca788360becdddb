"""The Hub-compatible Xet bucket server (see app.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from services.options import option
from services.ports import BUCKET_PORT

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024  # a xorb is at most 64 MiB; leave headroom for shards


@dataclasses.dataclass(frozen=True)
class BucketOptions:
    """Run the Hub-compatible Xet bucket server."""

    section: ClassVar[str | None] = None  # reads no settings: only its options

    root: Path = option(Path("buckets"), "Data root (xorbs, shards, index); created if missing.")
    host: str = option("127.0.0.1", "Address to listen on (anything but loopback needs --tokens).")
    port: int = option(BUCKET_PORT, "Port to listen on.", min=0, max=65535)
    tokens: Path | None = option(
        None, "Tokens file: '<token> <read|write> <namespace|*>' per line; omit for open local mode."
    )
    max_body_bytes: int = option(DEFAULT_MAX_BODY_BYTES, "Largest request body; larger is refused (413).", min=1)
    database: str | None = option(
        None,
        "Bucket metadata and the CAS index in PostgreSQL: postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME, shared "
        "by every bucket server over the same --root. Default: SQLite files in ROOT.",
    )
