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
listing every failure, and nothing is applied.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import BadInput, Conflict, NotFound, RobotloopError, Unprocessable
from ..private import private_dir
from .sqlite import ThreadLocalDb

MAX_PATH_BYTES = 1024
MAX_NAME_LEN = 96
PAGE_SIZE = 1000

_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")
_RESERVED_NAMESPACES = {"me", "api", "buckets"}

FileSizeFn = Callable[[str], "int | None"]
"""``file_size(xet_hash) -> size in bytes, or None if the CAS does not know the hash``."""


class BucketError(RobotloopError):
    """Base class of bucket-store errors; each kind names its category (`robotloop.errors`) first."""


class InvalidName(BadInput, BucketError):
    """Invalid namespace or bucket name."""


class InvalidPath(BadInput, BucketError):
    """A file path that cannot be stored (traversal, absolute, NUL, empty segment, too long)."""


class InvalidOperation(BadInput, BucketError):
    """One operation of a batch cannot apply: a malformed or unknown hash, a size mismatch, a copy from nowhere."""


class BucketNotFound(NotFound, BucketError):
    """No bucket of that name, or the caller cannot see it."""


class EntryNotFound(NotFound, BucketError):
    """No file at that path in the bucket."""


class BucketExists(Conflict, BucketError):
    """A bucket of that name exists already."""


@dataclass
class BatchRejected(Unprocessable, BucketError):
    """A batch was refused as a whole; ``failures`` is ``[{"path": ..., "error": ...}]``."""

    bucket_id: str
    failures: list[dict[str, str]]

    def __str__(self) -> str:
        lines = "; ".join(f"{f['path']}: {f['error']}" for f in self.failures[:10])
        return (
            f"batch on bucket '{self.bucket_id}' rejected, nothing applied ({len(self.failures)} failure(s)): {lines}"
        )


@dataclass(frozen=True)
class BucketRecord:
    namespace: str
    name: str
    private: bool
    created_at: float  # unix seconds
    size: int = 0  # logical bytes (sum of file sizes)
    total_files: int = 0

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class FileRecord:
    path: str
    xet_hash: str
    size: int
    mtime_ms: int | None
    uploaded_at: float  # unix seconds
    content_type: str | None = None


@dataclass(frozen=True)
class FolderRecord:
    path: str
    uploaded_at: float | None = None


@dataclass(frozen=True)
class AddFile:
    path: str
    xet_hash: str
    mtime_ms: int | None = None
    size: int | None = None  # optional client-declared size; must match the CAS if given
    content_type: str | None = None


@dataclass(frozen=True)
class CopyFile:
    path: str
    xet_hash: str
    source_repo_type: str
    source_repo_id: str
    mtime_ms: int | None = None


@dataclass(frozen=True)
class DeleteFile:
    path: str


Operation = AddFile | CopyFile | DeleteFile


@dataclass
class BatchResult:
    added: int = 0
    copied: int = 0
    deleted: int = 0
    files: list[FileRecord] = field(default_factory=list)


def validate_name(kind: str, value: str) -> str:
    """Validate a namespace or bucket name (``[A-Za-z0-9._-]``, 1..96 chars, alnum at both ends).

    Raises:
        InvalidName: with a message naming ``kind`` and ``value``.
    """
    if not (0 < len(value) <= MAX_NAME_LEN) or not _NAME_RE.match(value) or ".." in value:
        raise InvalidName(
            f"invalid {kind} {value!r}: use 1-{MAX_NAME_LEN} chars from [A-Za-z0-9._-], "
            "starting and ending alphanumeric"
        )
    if kind == "namespace" and value.lower() in _RESERVED_NAMESPACES:
        raise InvalidName(f"invalid namespace {value!r}: reserved")
    return value


def validate_path(bucket_id: str, path: str) -> str:
    """Validate a file path inside a bucket and return it unchanged.

    Example::

        >>> validate_path("ns/b", "episodes/0001/data.parquet")
        'episodes/0001/data.parquet'

    Raises:
        InvalidPath: empty, absolute (``/x``), backslash, NUL or control characters, empty
            segments (``a//b``, trailing ``/``), ``.``/``..`` segments, or over
            ``MAX_PATH_BYTES`` UTF-8 bytes.
    """

    def bad(reason: str) -> InvalidPath:
        return InvalidPath(f"invalid path {path!r} in bucket '{bucket_id}': {reason}")

    if not path:
        raise bad("empty path")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: SQLite and every client would fail on it later
        raise bad("not valid UTF-8 text") from None
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise bad(f"longer than {MAX_PATH_BYTES} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise bad("contains NUL or control characters")
    if "\\" in path:
        raise bad("contains a backslash")
    if path.startswith("/"):
        raise bad("absolute paths are not allowed")
    for segment in path.split("/"):
        if segment == "":
            raise bad("empty path segment")
        if segment in (".", ".."):
            raise bad(f"'{segment}' segments are not allowed")
    return path


def _prefix_upper_bound(prefix: str) -> str | None:
    """Smallest string greater than every string starting with ``prefix`` (for index range scans); None when there
    is none (``prefix`` is only U+10FFFF, the last code point, which has no successor)."""
    stripped = prefix.rstrip("\U0010ffff")
    return stripped[:-1] + chr(ord(stripped[-1]) + 1) if stripped else None


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
    """SQLite-backed bucket metadata under ``root`` (see module docstring for guarantees).

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
        self._file_size, self._uploaded_by = file_size, uploaded_by
        self._db = ThreadLocalDb(self.db_path, timeout_s=30.0, foreign_keys=True, rows=True)
        with self._db.conn() as conn:
            conn.executescript(_SCHEMA)

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
        return _bucket_from_row(row)

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
        return [_bucket_from_row(r) for r in rows]

    def delete_bucket(self, namespace: str, name: str) -> None:
        """Delete a bucket and all its path entries (content stays in the CAS).

        Raises:
            BucketNotFound: no such bucket.
        """
        with self._db.tx(immediate=True) as conn:
            bucket_id = self._bucket_id(conn, namespace, name)
            conn.execute("DELETE FROM files WHERE bucket_id = ?", (bucket_id,))
            conn.execute("DELETE FROM buckets WHERE id = ?", (bucket_id,))

    def set_private(self, namespace: str, name: str, private: bool) -> None:
        """Change a bucket's visibility.

        Raises:
            BucketNotFound: no such bucket.
        """
        with self._db.tx(immediate=True) as conn:
            bucket_id = self._bucket_id(conn, namespace, name)
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
                bucket_id = self._bucket_id(conn, from_ns, from_name)
                conn.execute("UPDATE buckets SET namespace = ?, name = ? WHERE id = ?", (to_ns, to_name, bucket_id))
        except sqlite3.IntegrityError:
            raise BucketExists(f"bucket '{to_ns}/{to_name}' already exists") from None

    # --- files --------------------------------------------------------------------------

    def get_file(self, namespace: str, name: str, path: str) -> FileRecord:
        """Return one file.

        Raises:
            BucketNotFound, EntryNotFound.
        """
        conn = self._db.conn()
        bucket_id = self._bucket_id(conn, namespace, name)
        row = conn.execute("SELECT * FROM files WHERE bucket_id = ? AND path = ?", (bucket_id, path)).fetchone()
        if row is None:
            raise EntryNotFound(f"file '{path}' not found in bucket '{namespace}/{name}'")
        return _file_from_row(row)

    def holds_hash(self, namespace: str, name: str, xet_hash: str) -> bool:
        """Whether bucket ``namespace/name`` has a file with this Xet hash (False for a missing bucket): a CAS
        token of that bucket may reconstruct only such files."""
        row = (
            self._db.conn()
            .execute(
                "SELECT 1 FROM files f JOIN buckets b ON b.id = f.bucket_id WHERE b.namespace = ? AND b.name = ? "
                "AND f.xet_hash = ? LIMIT 1",
                (namespace, name, xet_hash),
            )
            .fetchone()
        )
        return row is not None

    def paths_info(self, namespace: str, name: str, paths: Sequence[str]) -> list[FileRecord]:
        """Files among ``paths`` that exist (missing ones are silently skipped, like the Hub).

        Raises:
            BucketNotFound.
        """
        conn = self._db.conn()
        bucket_id = self._bucket_id(conn, namespace, name)
        out: list[FileRecord] = []
        for path in dict.fromkeys(paths):  # dedupe, keep order
            row = conn.execute("SELECT * FROM files WHERE bucket_id = ? AND path = ?", (bucket_id, path)).fetchone()
            if row is not None:
                out.append(_file_from_row(row))
        return out

    def list_tree(
        self,
        namespace: str,
        name: str,
        prefix: str = "",
        recursive: bool = False,
        after: str | None = None,
        limit: int = PAGE_SIZE,
    ) -> list[FileRecord | FolderRecord]:
        """List a bucket ordered by path, resuming after cursor ``after`` (see :func:`tree_cursor`).

        * ``recursive=True``: every file whose path starts with ``prefix`` (lexical match, as the Hub).
        * ``recursive=False``: the immediate children (files and folders) of directory ``prefix``,
          plus the file named exactly ``prefix`` if there is one.

        Raises:
            BucketNotFound. InvalidPath: ``prefix`` or ``after`` is not UTF-8 text (a lone surrogate).
        """
        for what, text in (("prefix", prefix), ("cursor", after or "")):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidPath(f"{what} {text!r} is not valid UTF-8 text") from None
        conn = self._db.conn()
        bucket_id = self._bucket_id(conn, namespace, name)
        kind, after_path = (after[0], after[2:]) if after else ("f", None)
        if recursive:
            return self._list_recursive(conn, bucket_id, prefix, after_path, limit)
        return self._list_children(conn, bucket_id, prefix.rstrip("/"), after_path, kind == "d", limit)

    def _list_recursive(
        self, conn: sqlite3.Connection, bucket_id: int, prefix: str, after: str | None, limit: int
    ) -> list[FileRecord | FolderRecord]:
        sql = "SELECT * FROM files WHERE bucket_id = ? AND path >= ? AND path > ?"
        args: list = [bucket_id, prefix, after or ""]
        if prefix and (upper := _prefix_upper_bound(prefix)) is not None:
            sql += " AND path < ?"
            args.append(upper)
        rows = conn.execute(sql + " ORDER BY path LIMIT ?", (*args, limit)).fetchall()
        return [_file_from_row(r) for r in rows]

    def _list_children(
        self,
        conn: sqlite3.Connection,
        bucket_id: int,
        directory: str,
        after: str | None,
        after_is_folder: bool,
        limit: int,
    ) -> list[FileRecord | FolderRecord]:
        out: list[FileRecord | FolderRecord] = []
        base = f"{directory}/" if directory else ""
        if directory and after is None:
            row = conn.execute(
                "SELECT * FROM files WHERE bucket_id = ? AND path = ?", (bucket_id, directory)
            ).fetchone()
            if row is not None:
                out.append(_file_from_row(row))
        hi = _prefix_upper_bound(base) if base else None
        # Walk the index: one query per child. After a folder, jump past its whole subtree
        # ("dir/" .. "dir0", since '0' == chr(ord('/') + 1)) so a folder costs one lookup, not one per file.
        cursor, skip_subtree = (after, after_is_folder) if after and after.startswith(base) else (base, False)
        while len(out) < limit:
            lower = _prefix_upper_bound(cursor + "/") if skip_subtree else cursor
            sql = "SELECT * FROM files WHERE bucket_id = ? AND path > ? AND path >= ?"
            args: list = [bucket_id, cursor, lower]
            if hi is not None:
                sql += " AND path < ?"
                args.append(hi)
            row = conn.execute(sql + " ORDER BY path LIMIT 1", args).fetchone()
            if row is None:
                break
            rest = row["path"][len(base) :]
            if "/" not in rest:
                out.append(_file_from_row(row))
                cursor, skip_subtree = row["path"], False
                continue
            folder = base + rest.split("/", 1)[0]
            latest = conn.execute(
                "SELECT MAX(uploaded_at) FROM files WHERE bucket_id = ? AND path >= ? AND path < ?",
                (bucket_id, folder + "/", _prefix_upper_bound(folder + "/")),
            ).fetchone()[0]
            out.append(FolderRecord(folder, latest))
            cursor, skip_subtree = folder, True
        return out

    def logical_bytes(self) -> dict[str, int]:
        """Totals across all buckets: ``{"buckets", "bucket_files", "logical_bytes"}``."""
        conn = self._db.conn()
        files, size = conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM files").fetchone()
        (buckets,) = conn.execute("SELECT COUNT(*) FROM buckets").fetchone()
        return {"buckets": buckets, "bucket_files": files, "logical_bytes": size}

    # --- batch --------------------------------------------------------------------------

    def apply_batch(
        self,
        namespace: str,
        name: str,
        operations: Sequence[Operation],
        can_read_source: Callable[[str, str], bool] = lambda ns, n: True,
    ) -> BatchResult:
        """Apply adds, copies and deletes atomically, in order (a later op on a path wins).

        Every operation is validated first; nothing is written unless all are valid. An added
        hash must be known to the CAS (``file_size``), its size must match a client-declared
        one, and the caller must have had the file: uploaded with a token of this namespace
        (``uploaded_by``), or in a bucket the caller may read. Knowing a private file's hash is not
        enough to link it into one's own bucket and read it there. A copy needs
        ``source_repo_type == "bucket"``, a source bucket the caller may read
        (``can_read_source(ns, name)``), and a file with that hash in it. Deleting a missing
        path is a no-op (idempotent retries).

        Example::

            store.apply_batch("robots", "episodes", [AddFile("ep/0.parquet", h), DeleteFile("tmp.txt")])

        Raises:
            BucketNotFound: target bucket missing.
            BatchRejected: at least one invalid operation; ``failures`` lists each one.
        """
        bucket_ref = f"{namespace}/{name}"
        conn = self._db.conn()
        self._bucket_id(conn, namespace, name)  # fail fast with BucketNotFound
        resolved, failures = self._resolve_operations(conn, bucket_ref, operations, can_read_source)
        if failures:
            raise BatchRejected(bucket_ref, failures)
        now = time.time()
        result = BatchResult()
        with self._db.tx(immediate=True) as conn:
            bucket_id = self._bucket_id(conn, namespace, name)  # re-check inside the lock: may be deleted
            for op, size in resolved:
                if isinstance(op, DeleteFile):
                    result.deleted += conn.execute(
                        "DELETE FROM files WHERE bucket_id = ? AND path = ?", (bucket_id, op.path)
                    ).rowcount
                    continue
                content_type = op.content_type if isinstance(op, AddFile) else None
                conn.execute(
                    "INSERT OR REPLACE INTO files "
                    "(bucket_id, path, xet_hash, size, mtime_ms, uploaded_at, content_type)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (bucket_id, op.path, op.xet_hash, size, op.mtime_ms, now, content_type),
                )
                if isinstance(op, AddFile):
                    result.added += 1
                else:
                    result.copied += 1
                result.files.append(FileRecord(op.path, op.xet_hash, size, op.mtime_ms, now, content_type))
        return result

    def _resolve_operations(
        self,
        conn: sqlite3.Connection,
        bucket_ref: str,
        operations: Sequence[Operation],
        can_read_source: Callable[[str, str], bool],
    ) -> tuple[list[tuple[Operation, int]], list[dict[str, str]]]:
        """Validate every operation; return ``([(op, size)], failures)``."""
        resolved: list[tuple[Operation, int]] = []
        failures: list[dict[str, str]] = []
        for op in operations:
            try:
                validate_path(bucket_ref, op.path)
                size = self._operation_size(conn, bucket_ref, op, can_read_source)
            except BucketError as err:
                failures.append({"path": op.path, "error": f"{err} (whole batch rejected, nothing applied)"})
            else:
                resolved.append((op, size))
        return resolved, failures

    def _operation_size(
        self, conn: sqlite3.Connection, bucket_ref: str, op: Operation, can_read_source: Callable[[str, str], bool]
    ) -> int:
        if isinstance(op, DeleteFile):
            return 0
        where = f"'{op.path}' in bucket '{bucket_ref}'"
        if not _HASH_RE.match(op.xet_hash or ""):
            raise InvalidOperation(f"invalid xet hash {op.xet_hash!r} for {where}: expected 64 lowercase hex chars")
        if isinstance(op, CopyFile):
            return self._copy_source_size(conn, where, op, can_read_source)
        size = self._file_size(op.xet_hash)
        if size is None:
            raise InvalidOperation(f"xet hash {op.xet_hash} for {where} is unknown to the CAS: upload its shard first")
        if op.size is not None and op.size != size:
            raise InvalidOperation(f"size mismatch for {where}: client says {op.size} bytes, CAS has {size}")
        namespace = bucket_ref.partition("/")[0]
        if (
            size
            and not self._uploaded_by(namespace, op.xet_hash)
            and not self._readable_elsewhere(conn, op.xet_hash, can_read_source)
        ):
            raise InvalidOperation(
                f"xet hash {op.xet_hash} for {where} was not uploaded to namespace '{namespace}' and is "
                "in no bucket you can read: upload the file itself"
            )
        return size

    def paths_of(self, xet_hash: str) -> list[str]:
        """Every '<namespace>/<bucket>/<path>' that holds the file with this Xet hash (what a damaged file affects)."""
        rows = (
            self._db.conn()
            .execute(
                "SELECT b.namespace, b.name, f.path FROM files f JOIN buckets b ON b.id = f.bucket_id "
                "WHERE f.xet_hash = ? "
                "ORDER BY 1, 2, 3",
                (xet_hash,),
            )
            .fetchall()
        )
        return [f"{ns}/{name}/{path}" for ns, name, path in rows]

    @staticmethod
    def _readable_elsewhere(conn: sqlite3.Connection, xet_hash: str, can_read: Callable[[str, str], bool]) -> bool:
        rows = conn.execute(
            "SELECT DISTINCT b.namespace, b.name FROM files f JOIN buckets b ON b.id = f.bucket_id "
            "WHERE f.xet_hash = ?",
            (xet_hash,),
        ).fetchall()
        return any(can_read(ns, name) for ns, name in rows)

    def _copy_source_size(
        self, conn: sqlite3.Connection, where: str, op: CopyFile, can_read_source: Callable[[str, str], bool]
    ) -> int:
        if op.source_repo_type != "bucket":
            raise InvalidOperation(f"copy to {where}: only bucket sources are hosted here, not {op.source_repo_type!r}")
        src_ns, _, src_name = op.source_repo_id.partition("/")
        row = conn.execute("SELECT id FROM buckets WHERE namespace = ? AND name = ?", (src_ns, src_name)).fetchone()
        if row is None or not can_read_source(src_ns, src_name):
            raise InvalidOperation(f"copy to {where}: source bucket '{op.source_repo_id}' not found")
        hit = conn.execute(
            "SELECT size FROM files WHERE bucket_id = ? AND xet_hash = ? LIMIT 1", (row["id"], op.xet_hash)
        ).fetchone()
        if hit is None:
            raise InvalidOperation(f"copy to {where}: no file with hash {op.xet_hash} in bucket '{op.source_repo_id}'")
        return int(hit["size"])

    # --- helpers ------------------------------------------------------------------------

    def _bucket_id(self, conn: sqlite3.Connection, namespace: str, name: str) -> int:
        row = conn.execute("SELECT id FROM buckets WHERE namespace = ? AND name = ?", (namespace, name)).fetchone()
        if row is None:
            raise BucketNotFound(f"bucket '{namespace}/{name}' not found")
        return int(row["id"])

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        self._db.close()


def _bucket_from_row(row: sqlite3.Row) -> BucketRecord:
    return BucketRecord(
        namespace=row["namespace"],
        name=row["name"],
        private=bool(row["private"]),
        created_at=row["created_at"],
        size=int(row["size"]),
        total_files=int(row["total_files"]),
    )


def _file_from_row(row: sqlite3.Row) -> FileRecord:
    return FileRecord(
        path=row["path"],
        xet_hash=row["xet_hash"],
        size=int(row["size"]),
        mtime_ms=row["mtime_ms"],
        uploaded_at=row["uploaded_at"],
        content_type=row["content_type"],
    )


def tree_cursor(entry: FileRecord | FolderRecord) -> str:
    """Opaque paging cursor for :meth:`BucketStore.list_tree`: ``"f:<path>"`` or ``"d:<path>"``.

    The kind matters because a bucket may hold both a file ``a/b`` and files under ``a/b/``.
    """
    return ("d:" if isinstance(entry, FolderRecord) else "f:") + entry.path
