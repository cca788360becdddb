"""The CAS store's ground floor: its files on disk and the index that names them (SQLite in the root, or the
PostgreSQL database the bucket server is given), shared by the write side (`ingest`) and the read sides (`reads`,
`reconstruct`).

Blobs are written (fsync + rename + dir fsync) before the index rows that point at them, so the index never names a
missing blob. Safe across threads (one connection per thread) and processes (SQLite: WAL, busy timeout; PostgreSQL:
the store's writer lock, `robotloop.database`), so several bucket servers over one shared root share one index.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import xet_format as xf
from ..sqlite import Db, DbConnection, Transaction, open_db
from .errors import BadHash

COUNTER_FLUSH_S = 1.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS xorbs (hash TEXT PRIMARY KEY, size INT NOT NULL, raw_size INT NOT NULL,
    num_chunks INT NOT NULL, shard TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS xorb_chunks (xorb TEXT NOT NULL, idx INT NOT NULL, hash BLOB NOT NULL,
    byte_start INT NOT NULL, byte_end INT NOT NULL, raw_len INT NOT NULL,
    PRIMARY KEY (xorb, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shards (hash TEXT PRIMARY KEY, size INT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS files (hash TEXT PRIMARY KEY, size INT NOT NULL, sha256 TEXT,
    shard TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS file_terms (file TEXT NOT NULL, idx INT NOT NULL, xorb TEXT NOT NULL,
    chunk_start INT NOT NULL, chunk_end INT NOT NULL, raw_len INT NOT NULL,
    PRIMARY KEY (file, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dedup_chunks (hash BLOB PRIMARY KEY, xorb TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS file_uploaders (file TEXT NOT NULL, namespace TEXT NOT NULL,
    PRIMARY KEY (file, namespace)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS xorb_uploaders (xorb TEXT NOT NULL, namespace TEXT NOT NULL,
    PRIMARY KEY (xorb, namespace)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS damaged_xorbs (hash TEXT PRIMARY KEY, detail TEXT NOT NULL, found REAL NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INT NOT NULL) WITHOUT ROWID;
"""
# The same tables in PostgreSQL's types: hashes of chunks are BYTEA, sizes and counters BIGINT, times DOUBLE PRECISION.
POSTGRES_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS cas;
CREATE TABLE IF NOT EXISTS xorbs (hash TEXT COLLATE "C" PRIMARY KEY, size BIGINT NOT NULL, raw_size BIGINT NOT NULL,
    num_chunks BIGINT NOT NULL, shard TEXT, created DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS xorb_chunks (xorb TEXT NOT NULL, idx INT NOT NULL, hash BYTEA NOT NULL,
    byte_start BIGINT NOT NULL, byte_end BIGINT NOT NULL, raw_len BIGINT NOT NULL, PRIMARY KEY (xorb, idx));
CREATE TABLE IF NOT EXISTS shards (hash TEXT COLLATE "C" PRIMARY KEY, size BIGINT NOT NULL,
    created DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS files (hash TEXT PRIMARY KEY, size BIGINT NOT NULL, sha256 TEXT, shard TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS file_terms (file TEXT NOT NULL, idx INT NOT NULL, xorb TEXT NOT NULL,
    chunk_start BIGINT NOT NULL, chunk_end BIGINT NOT NULL, raw_len BIGINT NOT NULL, PRIMARY KEY (file, idx));
CREATE INDEX IF NOT EXISTS file_terms_by_xorb ON file_terms (xorb);
CREATE INDEX IF NOT EXISTS xorbs_by_shard ON xorbs (shard);
CREATE TABLE IF NOT EXISTS dedup_chunks (hash BYTEA PRIMARY KEY, xorb TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS file_uploaders (file TEXT NOT NULL, namespace TEXT NOT NULL, PRIMARY KEY (file, namespace));
CREATE TABLE IF NOT EXISTS xorb_uploaders (xorb TEXT NOT NULL, namespace TEXT NOT NULL, PRIMARY KEY (xorb, namespace));
CREATE TABLE IF NOT EXISTS damaged_xorbs (hash TEXT PRIMARY KEY, detail TEXT NOT NULL, found DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
"""
COUNTERS = ("xorb_bytes_received", "shard_bytes_received", "bytes_served")


@dataclass(frozen=True)
class Chunk:
    """One chunk of a stored xorb: its hash, where its compressed bytes lie in the xorb, its uncompressed length."""

    hash: bytes
    byte_start: int
    byte_end: int
    raw_len: int


def check_hex(h: str, what: str) -> bytes:
    """The 32 bytes of a hex hash argument. Raises BadHash."""
    try:
        return xf.hex_to_hash(h)
    except xf.FormatError:
        raise BadHash(f"{what} hash {h!r} is not 64 lowercase hex digits") from None


class CasIndex:
    """Owns the store's root folder (blob paths and durable writes), the index (connections, transactions,
    schema), the counters, and the few facts every side asks about a xorb: its chunks, who holds it, whether it is
    marked damaged. `database`: a ``postgresql://`` URL for the index (default: SQLite, ``root/index.sqlite``).

    Raises:
        BadDatabaseUrl, DatabaseUnavailable: `database` is not a PostgreSQL URL, or cannot be reached.
    """

    def __init__(self, root: str | Path, database: str | None = None) -> None:
        self.root = Path(root)
        for d in ("xorbs", "shards", "tmp"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._db = open_db(database, self.root / "index.sqlite", "cas", timeout_s=60)
        self.counters = BufferedCounters(self._db)
        self._db.conn().executescript(SCHEMA if database is None else POSTGRES_SCHEMA)
        with self._db.tx(immediate=True) as db:
            db.executemany("INSERT INTO counters VALUES (?, 0) ON CONFLICT DO NOTHING", [(c,) for c in COUNTERS])

    def close(self) -> None:
        """Flush buffered counters and close this thread's connection (call on shutdown)."""
        self.counters.flush()
        self._db.close()

    def db(self) -> DbConnection:
        """This thread's connection, for reads."""
        return self._db.conn()

    def tx(self) -> Transaction:
        """A write transaction; writers queue on the lock up front (BEGIN IMMEDIATE)."""
        return self._db.tx(immediate=True)

    def blob_path(self, kind: str, hex_hash: str) -> Path:
        return self.root / kind / hex_hash[:2] / hex_hash

    def write_blob(self, path: Path, data: bytes) -> None:
        """Durably place `data` at `path`: temp file, fsync, rename, fsync the directory."""
        path.parent.mkdir(exist_ok=True)
        # The host too: bucket servers on several machines may share the root (a network file system).
        tmp = self.root / "tmp" / f"{path.name}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def chunks(self, db: DbConnection, xorb_hex: str) -> list[Chunk] | None:
        """The chunks of a stored xorb in order, or None if it is not stored."""
        rows = db.execute(
            "SELECT hash, byte_start, byte_end, raw_len FROM xorb_chunks WHERE xorb = ? ORDER BY idx", (xorb_hex,)
        ).fetchall()
        return [Chunk(*r) for r in rows] or None

    def xorb_size(self, xorb_hex: str) -> int | None:
        """Serialized size of a stored xorb, or None."""
        row = self.db().execute("SELECT size FROM xorbs WHERE hash = ?", (xorb_hex,)).fetchone()
        return row[0] if row else None

    def holds_xorb(self, namespace: str | None, xorb_hex: str) -> bool:
        """Whether `namespace` uploaded this xorb's bytes (None or "*": every namespace's data is its own)."""
        if namespace in (None, "*"):
            return True
        row = (
            self.db()
            .execute("SELECT 1 FROM xorb_uploaders WHERE xorb = ? AND namespace = ?", (xorb_hex, namespace))
            .fetchone()
        )
        return row is not None

    def damaged(self, xorb_hex: str) -> bool:
        return self.db().execute("SELECT 1 FROM damaged_xorbs WHERE hash = ?", (xorb_hex,)).fetchone() is not None

    def mark_damaged(self, xorb_hex: str, detail: str) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO damaged_xorbs VALUES (?, ?, ?) ON CONFLICT (hash) DO UPDATE SET detail = excluded.detail,"
                " found = excluded.found",
                (xorb_hex, detail, time.time()),
            )

    def clear_damaged(self, xorb_hex: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM damaged_xorbs WHERE hash = ?", (xorb_hex,))

    def stats(self) -> dict:
        """Counters and totals: bytes received/served, xorbs, chunks, shards, files, stored bytes.

        Counters include this process's buffered counts; other processes' may lag ~1 s.
        """
        self.counters.flush()
        db = self.db()
        out = dict(db.execute("SELECT name, value FROM counters").fetchall())
        out["bytes_received"] = out["xorb_bytes_received"] + out["shard_bytes_received"]
        out["xorbs"], out["xorb_bytes"], out["chunks"] = db.execute(
            "SELECT COUNT(*), CAST(COALESCE(SUM(size), 0) AS BIGINT), CAST(COALESCE(SUM(num_chunks), 0) AS BIGINT)"
            " FROM xorbs"
        ).fetchone()
        out["shards"], out["shard_bytes"] = db.execute(
            "SELECT COUNT(*), CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM shards"
        ).fetchone()
        out["files"] = db.execute("SELECT COUNT(*) FROM files").fetchone()[0]
        out["stored_bytes"] = out["xorb_bytes"] + out["shard_bytes"]
        return out


class BufferedCounters:
    """The store's counters (bytes received and served, ...), added to in memory and written to the index at most
    every COUNTER_FLUSH_S: a durable write transaction per ranged read would cost an fsync each and serialize
    readers on the write lock. So counters may lag by COUNTER_FLUSH_S per process."""

    def __init__(self, index: Db) -> None:
        self._index = index
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._flushed_at = time.monotonic()

    def add(self, name: str, n: int) -> None:
        with self._lock:
            self._pending[name] = self._pending.get(name, 0) + n
            due = time.monotonic() - self._flushed_at > COUNTER_FLUSH_S
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending, self._flushed_at = self._pending, {}, time.monotonic()
        if pending:
            with self._index.tx(immediate=True) as db:
                db.executemany(
                    "UPDATE counters SET value = value + ? WHERE name = ?", [(n, name) for name, n in pending.items()]
                )
