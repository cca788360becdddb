"""Bucket metadata store: which path of which bucket points at which Xet file hash.

File *content* lives in the CAS (xorbs + shards, see ``cas.py``); this module only keeps the
mapping ``(bucket, path) -> (xet_hash, size, mtime)`` in SQLite under ``<root>/buckets.sqlite``.

Durability and atomicity
------------------------
The database runs in WAL mode with ``synchronous=FULL``: a transaction is on disk when
``COMMIT`` returns, and a crash (even ``kill -9`` or power loss) rolls back any uncommitted
transaction on next open. Every batch (adds, copies and deletes together) is one
``BEGIN IMMEDIATE ... COMMIT`` transaction, and the HTTP layer answers only after
:meth:`BucketStore.apply_batch` returned, i.e. after the commit. Hence after a crash at any
moment every path shows either its content before the batch or after it, never a mix, and
a batch that was acknowledged is never lost.

Batches are validated completely *before* the transaction starts (paths, hashes known to the
CAS, copy sources): one bad operation rejects the whole batch with :class:`BatchRejected`
listing every failure, and nothing is applied. Inside the transaction, once the batch is written, no path it added
may be both a file and a folder (a file under a file, or a file where files are under it): :class:`PathClash`
(a 409) rolls the whole batch back. Checked there, not before, so that two batches racing (one adds ``a``, the other
``a/b``) cannot both pass, and a batch that deletes ``a`` and adds ``a/b`` is fine.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ...private import private_dir
from ..sqlite import ThreadLocalDb
from .batch import BatchWriter
from .listing import FileTable, tree_cursor
from .records import (
    MAX_NAME_LEN,
    MAX_PATH_BYTES,
    PAGE_SIZE,
    AddFile,
    BatchRejected,
    BatchResult,
    BucketError,
    BucketExists,
    BucketNotFound,
    BucketRecord,
    CopyFile,
    DeleteFile,
    EntryNotFound,
    FileRecord,
    FileSizeFn,
    FolderRecord,
    InvalidName,
    InvalidOperation,
    InvalidPath,
    Operation,
    PathClash,
    bucket_from_row,
    bucket_row_id,
    validate_name,
    validate_path,
)

__all__ = [
    "MAX_NAME_LEN",
    "MAX_PATH_BYTES",
    "PAGE_SIZE",
    "AddFile",
    "BatchRejected",
    "BatchResult",
    "BucketError",
    "BucketExists",
    "BucketNotFound",
    "BucketRecord",
    "BucketStore",
    "CopyFile",
    "DeleteFile",
    "EntryNotFound",
    "FileRecord",
    "FileSizeFn",
    "FolderRecord",
    "InvalidName",
    "InvalidOperation",
    "InvalidPath",
    "Operation",
    "PathClash",
    "tree_cursor",
    "validate_name",
    "validate_path",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (
    id INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    private INTEGER NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (namespace, name)
);
CREATE TABLE IF NOT EXISTS files (
    bucket_id INTEGER NOT NULL REFERENCES buckets(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    xet_hash TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ms INTEGER,
    uploaded_at REAL NOT NULL,
    content_type TEXT,
    PRIMARY KEY (bucket_id, path)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS files_by_hash ON files (bucket_id, xet_hash);
CREATE INDEX IF NOT EXISTS files_by_xet_hash ON files (xet_hash);
"""


class BucketStore:
    """SQLite-backed bucket metadata under ``root`` (see the package docstring for guarantees): owns the
    ``buckets`` table (create, find, list, delete, rename, visibility) and puts the ``files`` table's readers
    (`FileTable`, as ``files``) and writer (`BatchWriter`, as ``batches``) behind the same object.

    Thread-safe: each thread gets its own connection; SQLite serializes writers.
    """

    def __init__(
        self,
        root: Path | str,
        file_size: FileSizeFn,
        uploaded_by: Callable[[str, str], bool] = lambda namespace, xet_hash: True,
    ) -> None:
        """``uploaded_by(namespace, xet_hash)``: whether the CAS registered that file from an upload with a token of
        ``namespace`` (see ``apply_batch``)."""
        self.root = Path(root)
        private_dir(self.root)
        self.db_path = self.root / "buckets.sqlite"
        self._db = ThreadLocalDb(self.db_path, timeout_s=30.0, foreign_keys=True, rows=True)
        with self._db.conn() as conn:
            conn.executescript(_SCHEMA)
        self.files = FileTable(self._db)
        self.batches = BatchWriter(self._db, file_size, uploaded_by)

    # --- buckets ------------------------------------------------------------------------

    def create_bucket(self, namespace: str, name: str, private: bool = True) -> BucketRecord:
        """Create an empty bucket.

        Raises:
            InvalidName: bad namespace or name.
            BucketExists: ``namespace/name`` already exists.
        """
        validate_name("namespace", namespace)
        validate_name("bucket name", name)
        now = time.time()
        try:
            with self._db.tx(immediate=True) as conn:
                conn.execute(
                    "INSERT INTO buckets (namespace, name, private, created_at) VALUES (?, ?, ?, ?)",
                    (namespace, name, int(private), now),
                )
        except sqlite3.IntegrityError:
            raise BucketExists(f"bucket '{namespace}/{name}' already exists") from None
        return BucketRecord(namespace, name, private, now)

    def get_bucket(self, namespace: str, name: str) -> BucketRecord:
        """Return a bucket with its logical size and file count.

        Raises:
            BucketNotFound: no such bucket.
        """
        row = (
            self._db.conn()
            .execute(
                "SELECT b.*, COALESCE(SUM(f.size), 0) AS size, COUNT(f.path) AS total_files"
                " FROM buckets b LEFT JOIN files f ON f.bucket_id = b.id"
                " WHERE b.namespace = ? AND b.name = ? GROUP BY b.id",
                (namespace, name),
            )
            .fetchone()
        )
        if row is None:
            raise BucketNotFound(f"bucket '{namespace}/{name}' not found")
        return bucket_from_row(row)

    def find_bucket(self, namespace: str, name: str) -> BucketRecord | None:
        """Like :meth:`get_bucket` but returns None when missing."""
        try:
            return self.get_bucket(namespace, name)
        except BucketNotFound:
            return None

    def list_buckets(
        self, namespace: str, search: str | None = None, after: str | None = None, limit: int = PAGE_SIZE
    ) -> list[BucketRecord]:
        """Buckets of ``namespace`` ordered by name, names strictly after ``after`` (keyset paging)."""
        rows = (
            self._db.conn()
            .execute(
                "SELECT b.*, COALESCE(SUM(f.size), 0) AS size, COUNT(f.path) AS total_files"
                " FROM buckets b LEFT JOIN files f ON f.bucket_id = b.id"
                " WHERE b.namespace = ? AND b.name > ? AND instr(lower(b.name), lower(?)) > 0"
                " GROUP BY b.id ORDER BY b.name LIMIT ?",
                (namespace, after or "", search or "", limit),
            )
            .fetchall()
        )
        return [bucket_from_row(r) for r in rows]

    def delete_bucket(self, namespace: str, name: str) -> None:
        """Delete a bucket and all its path entries (content stays in the CAS).

        Raises:
            BucketNotFound: no such bucket.
        """
        with self._db.tx(immediate=True) as conn:
            bucket_id = bucket_row_id(conn, namespace, name)
            conn.execute("DELETE FROM files WHERE bucket_id = ?", (bucket_id,))
            conn.execute("DELETE FROM buckets WHERE id = ?", (bucket_id,))

    def set_private(self, namespace: str, name: str, private: bool) -> None:
        """Change a bucket's visibility.

        Raises:
            BucketNotFound: no such bucket.
        """
        with self._db.tx(immediate=True) as conn:
            bucket_id = bucket_row_id(conn, namespace, name)
            conn.execute("UPDATE buckets SET private = ? WHERE id = ?", (int(private), bucket_id))

    def move_bucket(self, from_ns: str, from_name: str, to_ns: str, to_name: str) -> None:
        """Rename/transfer a bucket.

        Raises:
            InvalidName, BucketNotFound, BucketExists.
        """
        validate_name("namespace", to_ns)
        validate_name("bucket name", to_name)
        try:
            with self._db.tx(immediate=True) as conn:
                bucket_id = bucket_row_id(conn, from_ns, from_name)
                conn.execute("UPDATE buckets SET namespace = ?, name = ? WHERE id = ?", (to_ns, to_name, bucket_id))
        except sqlite3.IntegrityError:
            raise BucketExists(f"bucket '{to_ns}/{to_name}' already exists") from None

    # --- files: see FileTable and BatchWriter ----------------------------------------------

    def get_file(self, namespace: str, name: str, path: str) -> FileRecord:
        """One file (`FileTable.get_file`). Raises BucketNotFound, EntryNotFound."""
        return self.files.get_file(namespace, name, path)

    def holds_hash(self, namespace: str, name: str, xet_hash: str) -> bool:
        """Whether the bucket has a file with this Xet hash (`FileTable.holds_hash`)."""
        return self.files.holds_hash(namespace, name, xet_hash)

    def paths_info(self, namespace: str, name: str, paths: Sequence[str]) -> list[FileRecord]:
        """The files among ``paths`` that exist (`FileTable.paths_info`). Raises BucketNotFound."""
        return self.files.paths_info(namespace, name, paths)

    def list_tree(
        self,
        namespace: str,
        name: str,
        prefix: str = "",
        recursive: bool = False,
        after: str | None = None,
        limit: int = PAGE_SIZE,
    ) -> list[FileRecord | FolderRecord]:
        """A page of a bucket's listing (`FileTable.list_tree`). Raises BucketNotFound, InvalidPath."""
        return self.files.list_tree(namespace, name, prefix, recursive, after, limit)

    def paths_of(self, xet_hash: str) -> list[str]:
        """Every '<namespace>/<bucket>/<path>' holding this Xet hash (`FileTable.paths_of`)."""
        return self.files.paths_of(xet_hash)

    def logical_bytes(self) -> dict[str, int]:
        """Totals across all buckets (`FileTable.logical_bytes`)."""
        return self.files.logical_bytes()

    def apply_batch(
        self,
        namespace: str,
        name: str,
        operations: Sequence[Operation],
        can_read_source: Callable[[str, str], bool] = lambda ns, n: True,
    ) -> BatchResult:
        """Apply adds, copies and deletes atomically, all or none (`BatchWriter.apply_batch`).

        Raises:
            BucketNotFound: target bucket missing.
            BatchRejected: at least one invalid operation; ``failures`` lists each one.
            PathClash: it would make a path both a file and a folder.
        """
        return self.batches.apply_batch(namespace, name, operations, can_read_source)

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        self._db.close()
