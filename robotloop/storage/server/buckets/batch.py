"""Writing a bucket's files: a batch of adds, copies and deletes, validated whole and then applied in one
transaction (see the package docstring for what that guarantees)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence

from ..sqlite import Db, DbConnection
from .records import (
    AddFile,
    BatchRejected,
    BatchResult,
    BucketError,
    CopyFile,
    DeleteFile,
    FileRecord,
    FileSizeFn,
    InvalidOperation,
    Operation,
    PathClash,
    bucket_row_id,
    validate_path,
)

_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


class BatchWriter:
    """Owns writes to the ``files`` table: checking each operation of a batch (path, hash known to the CAS, size,
    that the caller had the file: ``uploaded_by`` or a bucket it may read, copy sources), then applying them all in
    one transaction or none."""

    def __init__(self, db: Db, file_size: FileSizeFn, uploaded_by: Callable[[str, str], bool]) -> None:
        """``uploaded_by(namespace, xet_hash)``: whether the CAS registered that file from an upload with a token of
        ``namespace``."""
        self._db, self._file_size, self._uploaded_by = db, file_size, uploaded_by

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
            PathClash: once applied, a path it added would be both a file and a folder (checked inside the
                transaction, on the bucket as the batch leaves it).
        """
        bucket_ref = f"{namespace}/{name}"
        conn = self._db.conn()
        bucket_row_id(conn, namespace, name)  # fail fast with BucketNotFound
        resolved, failures = self._resolve_operations(conn, bucket_ref, operations, can_read_source)
        if failures:
            raise BatchRejected(bucket_ref, failures)
        now = time.time()
        result = BatchResult()
        with self._db.tx(immediate=True) as conn:
            bucket_id = bucket_row_id(conn, namespace, name)  # re-check inside the lock: may be deleted
            for op, size in resolved:
                if isinstance(op, DeleteFile):
                    result.deleted += conn.execute(
                        "DELETE FROM files WHERE bucket_id = ? AND path = ?", (bucket_id, op.path)
                    ).rowcount
                    continue
                content_type = op.content_type if isinstance(op, AddFile) else None
                conn.execute(
                    "INSERT INTO files (bucket_id, path, xet_hash, size, mtime_ms, uploaded_at, content_type)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (bucket_id, path) DO UPDATE SET"
                    " xet_hash = excluded.xet_hash, size = excluded.size, mtime_ms = excluded.mtime_ms,"
                    " uploaded_at = excluded.uploaded_at, content_type = excluded.content_type",
                    (bucket_id, op.path, op.xet_hash, size, op.mtime_ms, now, content_type),
                )
                if isinstance(op, AddFile):
                    result.added += 1
                else:
                    result.copied += 1
                result.files.append(FileRecord(op.path, op.xet_hash, size, op.mtime_ms, now, content_type))
            clashes = _path_clashes(conn, bucket_id, _paths_added(op for op, _ in resolved))
            if clashes:
                raise PathClash(bucket_ref, clashes)  # rolls the transaction back: nothing applied
        return result

    def _resolve_operations(
        self,
        conn: DbConnection,
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
        self, conn: DbConnection, bucket_ref: str, op: Operation, can_read_source: Callable[[str, str], bool]
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

    @staticmethod
    def _readable_elsewhere(conn: DbConnection, xet_hash: str, can_read: Callable[[str, str], bool]) -> bool:
        rows = conn.execute(
            "SELECT DISTINCT b.namespace, b.name FROM files f JOIN buckets b ON b.id = f.bucket_id "
            "WHERE f.xet_hash = ?",
            (xet_hash,),
        ).fetchall()
        return any(can_read(ns, name) for ns, name in rows)

    def _copy_source_size(
        self, conn: DbConnection, where: str, op: CopyFile, can_read_source: Callable[[str, str], bool]
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


def _paths_added(operations: Iterable[Operation]) -> list[str]:
    """The paths a batch leaves as files it wrote: added or copied, and not deleted by a later operation."""
    last: dict[str, bool] = {}
    for op in operations:
        last[op.path] = not isinstance(op, DeleteFile)
    return [path for path, written in last.items() if written]


def _path_clashes(conn: DbConnection, bucket_id: int, paths: list[str]) -> list[tuple[str, str]]:
    """``[(path, clashing path)]`` for each of ``paths`` (files now in the bucket) that is under a file, or that has
    files under it; each clash once, as the first of its two paths names it. Index lookups: one per distinct folder
    above the paths, one per path."""
    is_file: dict[str, bool] = {}

    def file_at(path: str) -> bool:
        if path not in is_file:
            row = conn.execute("SELECT 1 FROM files WHERE bucket_id = ? AND path = ?", (bucket_id, path)).fetchone()
            is_file[path] = row is not None
        return is_file[path]

    clashes: dict[frozenset[str], tuple[str, str]] = {}
    for path in paths:
        parts = path.split("/")
        above = next((a for a in ("/".join(parts[:i]) for i in range(1, len(parts))) if file_at(a)), None)
        # Files under `path/`: "path/" <= p < "path0", as '0' == chr(ord('/') + 1).
        below = conn.execute(
            "SELECT path FROM files WHERE bucket_id = ? AND path >= ? AND path < ? ORDER BY path LIMIT 1",
            (bucket_id, path + "/", path + "0"),
        ).fetchone()
        for other in (above, below["path"] if below else None):
            if other is not None:
                clashes.setdefault(frozenset((path, other)), (path, other))
    return list(clashes.values())
