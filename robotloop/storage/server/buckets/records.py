"""The bucket store's vocabulary: its errors, the records it returns, the operations of a batch, the checks of a
name and a path, and how a row of its tables reads."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from robotloop.errors import BadInput, Conflict, NotFound, RobotloopError, Unprocessable

if TYPE_CHECKING:
    from robotloop.database import Row
    from robotloop.storage.server.sqlite import DbConnection

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


@dataclass
class PathClash(Conflict, BucketError):
    """A batch would make a path both a file and a folder: a file under a path that is a file, or a file where a
    folder is (files under it). ``clashes`` is ``[(added path, what it clashes with)]``; nothing was applied.

    A bucket's paths map onto a file system's (``bucket get``, ``hf buckets sync``, lerobot's datasets): there a
    name is a file or a folder, never both, so a bucket holding both could not be downloaded whole."""

    bucket_id: str
    clashes: list[tuple[str, str]]

    def __str__(self) -> str:
        parts = "; ".join(
            f"file '{path}' cannot be added: '{other}' is under it"
            if other.startswith(path + "/")
            else f"file '{path}' cannot be added under '{other}', which is a file"
            for path, other in self.clashes[:10]
        )
        more = f" (and {len(self.clashes) - 10} more)" if len(self.clashes) > 10 else ""
        return (
            f"batch on bucket '{self.bucket_id}' rejected, nothing applied: {parts}{more}. A path is a file or a "
            "folder, not both: delete or rename the one in the way first"
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


def bucket_row_id(conn: DbConnection, namespace: str, name: str) -> int:
    """The row id of bucket ``namespace/name``. Raises BucketNotFound."""
    row = conn.execute("SELECT id FROM buckets WHERE namespace = ? AND name = ?", (namespace, name)).fetchone()
    if row is None:
        raise BucketNotFound(f"bucket '{namespace}/{name}' not found")
    return int(row["id"])


def bucket_from_row(row: sqlite3.Row | Row) -> BucketRecord:
    return BucketRecord(
        namespace=row["namespace"],
        name=row["name"],
        private=bool(row["private"]),
        created_at=row["created_at"],
        size=int(row["size"]),
        total_files=int(row["total_files"]),
    )


def file_from_row(row: sqlite3.Row | Row) -> FileRecord:
    return FileRecord(
        path=row["path"],
        xet_hash=row["xet_hash"],
        size=int(row["size"]),
        mtime_ms=row["mtime_ms"],
        uploaded_at=row["uploaded_at"],
        content_type=row["content_type"],
    )
