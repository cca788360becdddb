"""Content-addressed store for Xet xorbs and shards, indexed in SQLite (or PostgreSQL: `CasStore(root, database=...)`).

Layout under `root`:
    xorbs/<2 hex>/<hash>    serialized xorbs exactly as uploaded (verified before storing)
    shards/<2 hex>/<hash>   uploaded shards, named by the Xet data hash of their bytes
    tmp/                    staging for atomic writes
    index.sqlite            files -> terms, xorbs -> chunks, chunk -> xorb (global dedup), stats (unless the index
                            is in PostgreSQL, schema `cas`: then several servers over one shared root share it)
    fetch.key               secret for signing the xorb fetch URLs we hand out

Nothing is written unless every check passed; blobs are written (fsync + rename + dir fsync)
before the index rows that point at them, so the index never names a missing blob.
Safe across threads (one SQLite connection per thread) and processes (WAL, busy timeout).

The pieces, each its own module: `index` (files on disk, the SQLite index, counters), `ingest` (verifying and
storing uploads), `reads` (serving verified xorb bytes, scrub), `reconstruct` (file plans, fetch URLs, dedup
answers), `errors`. `CasStore` puts them together behind one object, which is what the HTTP layer calls.
"""

from __future__ import annotations

from pathlib import Path

from .errors import (
    BadHash,
    CasError,
    CorruptShard,
    CorruptXorb,
    DamagedXorb,
    RangeNotSatisfiable,
    TooLarge,
    TruncatedShard,
    UnknownFile,
    UnknownXorb,
)
from .index import CasIndex
from .ingest import MAX_SHARD_BYTES, MAX_XORB_BYTES, Body, CasIngest, ShardResult, XorbResult
from .reads import VerifiedRange, XorbReads, XorbSlice
from .reconstruct import FileReads

__all__ = [
    "BadHash",
    "Body",
    "CasError",
    "CasStore",
    "CorruptShard",
    "CorruptXorb",
    "DamagedXorb",
    "RangeNotSatisfiable",
    "ShardResult",
    "TooLarge",
    "TruncatedShard",
    "UnknownFile",
    "UnknownXorb",
    "VerifiedRange",
    "XorbResult",
    "XorbSlice",
]


class CasStore:
    """One data root's store: uploads (`ingest`), xorb reads (`xorbs`) and file reads (`files`) over one shared
    `index`. Its methods are theirs; see the module docstring for the layout."""

    def __init__(
        self,
        root: str | Path,
        max_xorb_bytes: int = MAX_XORB_BYTES,
        max_shard_bytes: int = MAX_SHARD_BYTES,
        database: str | None = None,
    ):
        """`database`: a ``postgresql://`` URL for the index (default: SQLite in `root`). Raises BadDatabaseUrl,
        DatabaseUnavailable."""
        self.index = CasIndex(root, database)
        self.root = self.index.root
        self.ingest = CasIngest(self.index, max_xorb_bytes, max_shard_bytes)
        self.xorbs = XorbReads(self.index)
        self.files = FileReads(self.index)

    @property
    def max_xorb_bytes(self) -> int:
        return self.ingest.max_xorb_bytes

    @property
    def max_shard_bytes(self) -> int:
        return self.ingest.max_shard_bytes

    def close(self) -> None:
        """Flush buffered counters and close this thread's connection (call on shutdown)."""
        self.index.close()

    # -- uploads: see CasIngest ----------------------------------------------------------------

    def put_xorb(self, hash_hex: str, body: Body, uploader: str | None = None) -> XorbResult:
        """Verify and store a xorb (`CasIngest.put_xorb`)."""
        return self.ingest.put_xorb(hash_hex, body, uploader)

    def put_shard(self, body: Body, uploader: str | None = None) -> ShardResult:
        """Verify and register a shard (`CasIngest.put_shard`)."""
        return self.ingest.put_shard(body, uploader)

    # -- xorb reads: see XorbReads -------------------------------------------------------------

    def holds_xorb(self, namespace: str | None, xorb_hex: str) -> bool:
        """Whether `namespace` uploaded this xorb's bytes (`CasIndex.holds_xorb`)."""
        return self.index.holds_xorb(namespace, xorb_hex)

    def xorb_size(self, hash_hex: str) -> int | None:
        """Serialized size of a stored xorb, or None (`XorbReads.xorb_size`)."""
        return self.xorbs.xorb_size(hash_hex)

    def open_xorb_range(self, hash_hex: str, start: int | None = None, end: int | None = None) -> XorbSlice:
        """Locate an inclusive byte range of a stored xorb (`XorbReads.open_xorb_range`)."""
        return self.xorbs.open_xorb_range(hash_hex, start, end)

    def read_verified(self, hash_hex: str, start: int | None = None, end: int | None = None) -> VerifiedRange:
        """An inclusive byte range of a xorb whose chunks match their hashes (`XorbReads.read_verified`)."""
        return self.xorbs.read_verified(hash_hex, start, end)

    def scrub(self) -> dict:
        """Check every stored xorb and shard, marking the damaged (`XorbReads.scrub`)."""
        return self.xorbs.scrub()

    # -- file reads: see FileReads -------------------------------------------------------------

    def uploaded_by(self, namespace: str, file_hex: str) -> bool:
        """Whether a shard describing this file came with a write token of `namespace` (`FileReads.uploaded_by`)."""
        return self.files.uploaded_by(namespace, file_hex)

    def file_size(self, file_hex: str) -> int | None:
        """Size in bytes of a registered file, or None (`FileReads.file_size`)."""
        return self.files.file_size(file_hex)

    def file_sha256(self, file_hex: str) -> str | None:
        """SHA-256 hex the client declared for the file, or None (`FileReads.file_sha256`)."""
        return self.files.file_sha256(file_hex)

    def reconstruction(self, file_hex: str, byte_range: tuple[int, int] | None = None, base_url: str = "") -> dict:
        """The v1 reconstruction JSON for a file or bytes [start, end) of it (`FileReads.reconstruction`)."""
        return self.files.reconstruction(file_hex, byte_range, base_url)

    def fetch_url(self, base_url: str, xorb_hex: str) -> str:
        """A signed, expiring URL for reading the xorb (`FileReads.fetch_url`)."""
        return self.files.fetch_url(base_url, xorb_hex)

    def check_fetch_url(self, xorb_hex: str, exp: str | None, sig: str | None) -> bool:
        """True if (exp, sig) is a valid, unexpired signature for this xorb (`FileReads.check_fetch_url`)."""
        return self.files.check_fetch_url(xorb_hex, exp, sig)

    def dedup_shard(self, chunk_hex: str, namespace: str | None = None) -> bytes | None:
        """The global-dedup answer for a chunk, or None (`FileReads.dedup_shard`)."""
        return self.files.dedup_shard(chunk_hex, namespace)

    def stats(self) -> dict:
        """Counters and totals (`CasIndex.stats`)."""
        return self.index.stats()
