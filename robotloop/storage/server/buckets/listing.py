"""Reading a bucket's files: one file, several paths, a tree listing page by page (walking the index, so a folder
costs one lookup however many files it holds), and which buckets hold a Xet hash."""

from __future__ import annotations

from collections.abc import Sequence

from ..sqlite import Db, DbConnection
from .records import PAGE_SIZE, EntryNotFound, FileRecord, FolderRecord, InvalidPath, bucket_row_id, file_from_row


class FileTable:
    """Owns the read side of the ``files`` table: lookups by path and by hash, tree listings with their paging
    cursors (`tree_cursor`), and the totals across buckets. Writes go through `BatchWriter`."""

    def __init__(self, db: Db) -> None:
        self._db = db

    def get_file(self, namespace: str, name: str, path: str) -> FileRecord:
        """Return one file.

        Raises:
            BucketNotFound, EntryNotFound.
        """
        conn = self._db.conn()
        bucket_id = bucket_row_id(conn, namespace, name)
        row = conn.execute("SELECT * FROM files WHERE bucket_id = ? AND path = ?", (bucket_id, path)).fetchone()
        if row is None:
            raise EntryNotFound(f"file '{path}' not found in bucket '{namespace}/{name}'")
        return file_from_row(row)

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
            BucketNotFound. InvalidPath: a path that is not UTF-8 text (a lone surrogate).
        """
        for path in paths:
            _require_text("path", path)
        conn = self._db.conn()
        bucket_id = bucket_row_id(conn, namespace, name)
        out: list[FileRecord] = []
        for path in dict.fromkeys(paths):  # dedupe, keep order
            row = conn.execute("SELECT * FROM files WHERE bucket_id = ? AND path = ?", (bucket_id, path)).fetchone()
            if row is not None:
                out.append(file_from_row(row))
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
            _require_text(what, text)
        conn = self._db.conn()
        bucket_id = bucket_row_id(conn, namespace, name)
        kind, after_path = (after[0], after[2:]) if after else ("f", None)
        if recursive:
            return self._list_recursive(conn, bucket_id, prefix, after_path, limit)
        return self._list_children(conn, bucket_id, prefix.rstrip("/"), after_path, kind == "d", limit)

    def _list_recursive(
        self, conn: DbConnection, bucket_id: int, prefix: str, after: str | None, limit: int
    ) -> list[FileRecord | FolderRecord]:
        sql = "SELECT * FROM files WHERE bucket_id = ? AND path >= ? AND path > ?"
        args: list = [bucket_id, prefix, after or ""]
        if prefix and (upper := _prefix_upper_bound(prefix)) is not None:
            sql += " AND path < ?"
            args.append(upper)
        rows = conn.execute(sql + " ORDER BY path LIMIT ?", (*args, limit)).fetchall()
        return [file_from_row(r) for r in rows]

    def _list_children(
        self,
        conn: DbConnection,
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
                out.append(file_from_row(row))
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
                out.append(file_from_row(row))
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
        files, size = conn.execute("SELECT COUNT(*), CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM files").fetchone()
        (buckets,) = conn.execute("SELECT COUNT(*) FROM buckets").fetchone()
        return {"buckets": buckets, "bucket_files": files, "logical_bytes": size}

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


def _prefix_upper_bound(prefix: str) -> str | None:
    """Smallest string greater than every string starting with ``prefix`` (for index range scans); None when there
    is none (``prefix`` is only U+10FFFF, the last code point, which has no successor)."""
    stripped = prefix.rstrip("\U0010ffff")
    return stripped[:-1] + chr(ord(stripped[-1]) + 1) if stripped else None


def tree_cursor(entry: FileRecord | FolderRecord) -> str:
    """Opaque paging cursor for :meth:`BucketStore.list_tree`: ``"f:<path>"`` or ``"d:<path>"``.

    The kind matters because a bucket may hold both a file ``a/b`` and files under ``a/b/``: batches that would make
    one are refused (`PathClash`), but a store written before that may hold one.
    """
    return ("d:" if isinstance(entry, FolderRecord) else "f:") + entry.path


def _require_text(what: str, text: str) -> None:
    """Raises InvalidPath when `text` cannot be UTF-8 (a lone surrogate): SQLite would fail on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPath(f"{what} {text!r} is not valid UTF-8 text") from None
