"""Content-addressed store for Xet xorbs and shards, indexed in SQLite.

Layout under `root`:
    xorbs/<2 hex>/<hash>    serialized xorbs exactly as uploaded (verified before storing)
    shards/<2 hex>/<hash>   uploaded shards, named by the Xet data hash of their bytes
    tmp/                    staging for atomic writes
    index.sqlite            files -> terms, xorbs -> chunks, chunk -> xorb (global dedup), stats
    fetch.key               secret for signing the xorb fetch URLs we hand out

Nothing is written unless every check passed; blobs are written (fsync + rename + dir fsync)
before the index rows that point at them, so the index never names a missing blob.
Safe across threads (one SQLite connection per thread) and processes (WAL, busy timeout).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from robotloop.storage.server import xet_format as xf

from ... import errors
from ...errors import BadInput, NotFound, RobotloopError, Unavailable
from .sqlite import ThreadLocalDb, Transaction

MAX_XORB_BYTES = 80 * 1024 * 1024  # client caps xorbs at 64 MiB of chunk data + headers/footer
MAX_SHARD_BYTES = 128 * 1024 * 1024
FETCH_URL_TTL_S = 3600
DEDUP_SHARD_MAX_XORBS = 64  # keep the dedup answer small even for shards with many xorbs
COUNTER_FLUSH_S = 1.0

Body = bytes | bytearray | memoryview | Iterable[bytes] | BinaryIO


class CasError(RobotloopError):
    """Base of all store errors; the message names the object and what is wrong."""


class BadHash(BadInput, CasError):
    """A hash argument is not 64 lowercase hex digits."""


class CorruptXorb(BadInput, CasError):
    """Xorb bytes are malformed or do not hash to the claimed hash."""


class CorruptShard(BadInput, CasError):
    """Shard bytes are malformed or disagree with the stored xorbs."""


class TruncatedShard(CorruptShard):
    """Shard bytes end inside a section."""


class UnknownXorb(NotFound, CasError):
    """A xorb that is not stored was referenced or requested."""


class DamagedXorb(Unavailable, CasError):
    """A stored xorb's bytes no longer match the chunk hashes it was verified with at upload (a flipped bit on disk,
    a truncated or edited file). Its bytes are never served; uploading the xorb again repairs it."""


class UnknownFile(NotFound, CasError):
    """No shard has registered this file hash."""


class RangeNotSatisfiable(BadInput, CasError):
    """Requested byte range starts at or beyond the end of the object."""


class TooLarge(errors.TooLarge, CasError):
    """Body exceeds the configured size limit."""


@dataclass(frozen=True)
class XorbResult:
    hash: str
    was_inserted: bool
    num_chunks: int
    size: int


@dataclass(frozen=True)
class ShardResult:
    hash: str
    was_inserted: bool
    files: int
    xorbs: int


@dataclass(frozen=True)
class XorbSlice:
    """A byte range of a stored xorb: read `length` bytes of `path` from `offset`."""

    path: Path
    offset: int
    length: int
    total: int  # size of the whole xorb, for Content-Range


@dataclass(frozen=True)
class VerifiedRange:
    """Bytes of a stored xorb, each chunk they touch checked against its hash: `data` starts at `offset`."""

    data: bytes
    offset: int
    total: int  # size of the whole xorb, for Content-Range


@dataclass(frozen=True)
class _Chunk:
    hash: bytes
    byte_start: int
    byte_end: int
    raw_len: int


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
COUNTERS = ("xorb_bytes_received", "shard_bytes_received", "bytes_served")


def _check_hex(h: str, what: str) -> bytes:
    try:
        return xf.hex_to_hash(h)
    except xf.FormatError:
        raise BadHash(f"{what} hash {h!r} is not 64 lowercase hex digits") from None


def _read_body(body: Body, limit: int, what: str) -> bytes:
    """Collect a request body, refusing more than `limit` bytes. Raises TooLarge."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        if len(body) > limit:
            raise TooLarge(f"{what} is {len(body)} bytes, limit is {limit}")
        return bytes(body)
    parts = iter(lambda: body.read(1 << 20), b"") if hasattr(body, "read") else body
    buf = bytearray()
    for part in parts:
        buf += part
        if len(buf) > limit:
            raise TooLarge(f"{what} exceeds the {limit}-byte limit")
    return bytes(buf)


class CasStore:
    """Xorbs and shards on disk plus a SQLite index; see the module docstring."""

    def __init__(self, root: str | Path, max_xorb_bytes: int = MAX_XORB_BYTES, max_shard_bytes: int = MAX_SHARD_BYTES):
        self.root = Path(root)
        self.max_xorb_bytes, self.max_shard_bytes = max_xorb_bytes, max_shard_bytes
        for d in ("xorbs", "shards", "tmp"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._index = ThreadLocalDb(self.root / "index.sqlite", timeout_s=60)
        self._counters = BufferedCounters(self._index)
        self._urls = FetchUrlSigner(self.root / "fetch.key", self.root / "tmp")
        self._verified: dict[str, tuple[int, int, int]] = {}  # xorb -> (size, mtime_ns, inode) when last checked whole
        with self._index.conn() as db:
            db.executescript(SCHEMA)
            db.executemany("INSERT OR IGNORE INTO counters VALUES (?, 0)", [(c,) for c in COUNTERS])

    def close(self) -> None:
        """Flush buffered counters and close this thread's connection (call on shutdown)."""
        self._counters.flush()
        self._index.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        return self._index.conn()

    def _tx(self) -> Transaction:
        return self._index.tx(immediate=True)  # writers queue on the lock up front

    def _blob_path(self, kind: str, hex_hash: str) -> Path:
        return self.root / kind / hex_hash[:2] / hex_hash

    def _write_blob(self, path: Path, data: bytes) -> None:
        """Durably place `data` at `path`: temp file, fsync, rename, fsync the directory."""
        path.parent.mkdir(exist_ok=True)
        tmp = self.root / "tmp" / f"{path.name}.{os.getpid()}.{threading.get_ident()}"
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

    def _chunks(self, db: sqlite3.Connection, xorb_hex: str) -> list[_Chunk] | None:
        rows = db.execute(
            "SELECT hash, byte_start, byte_end, raw_len FROM xorb_chunks WHERE xorb = ? ORDER BY idx", (xorb_hex,)
        ).fetchall()
        return [_Chunk(*r) for r in rows] or None

    # -- xorbs ------------------------------------------------------------------------------

    def put_xorb(self, hash_hex: str, body: Body, uploader: str | None = None) -> XorbResult:
        """Verify and store a serialized xorb under its hash; `uploader` (the namespace of the write token) is
        recorded as holding it (see `holds_xorb`).

        Raises BadHash, TooLarge, or CorruptXorb (malformed, or content hashes to another hash).
        Re-uploading a stored xorb stores nothing (was_inserted=False), but its bytes are verified all the same:
        only bytes that hash to the xorb make the uploader one of its holders.
        """
        _check_hex(hash_hex, "xorb")
        data = _read_body(body, self.max_xorb_bytes, f"xorb {hash_hex}")
        self._counters.add("xorb_bytes_received", len(data))
        try:
            parsed = xf.parse_xorb(data)
        except xf.FormatError as e:
            raise CorruptXorb(f"xorb {hash_hex}: {e}") from None
        actual = xf.hash_to_hex(parsed.hash)
        if actual != hash_hex:
            raise CorruptXorb(f"xorb {hash_hex}: content hashes to {actual}")
        stored = self._db().execute("SELECT 1 FROM xorbs WHERE hash = ?", (hash_hex,)).fetchone() is not None
        path = self._blob_path("xorbs", hash_hex)
        if not stored or _differs(path, data):  # a damaged copy is replaced by these verified bytes: the repair
            self._write_blob(path, data)
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO xorbs VALUES (?, ?, ?, ?, NULL, ?)",
                (hash_hex, len(data), parsed.raw_len, len(parsed.chunks), time.time()),
            )
            if cur.rowcount:
                db.executemany(
                    "INSERT INTO xorb_chunks VALUES (?, ?, ?, ?, ?, ?)",
                    [(hash_hex, i, c.hash, c.byte_start, c.byte_end, c.raw_len) for i, c in enumerate(parsed.chunks)],
                )
            if uploader is not None:
                db.execute("INSERT OR IGNORE INTO xorb_uploaders VALUES (?, ?)", (hash_hex, uploader))
            db.execute("DELETE FROM damaged_xorbs WHERE hash = ?", (hash_hex,))
        return XorbResult(hash_hex, bool(cur.rowcount), len(parsed.chunks), len(data))

    def _damaged(self, xorb_hex: str) -> bool:
        return self._db().execute("SELECT 1 FROM damaged_xorbs WHERE hash = ?", (xorb_hex,)).fetchone() is not None

    def holds_xorb(self, namespace: str | None, xorb_hex: str) -> bool:
        """Whether `namespace` uploaded this xorb's bytes (None or "*": every namespace's data is its own)."""
        if namespace in (None, "*"):
            return True
        row = (
            self._db()
            .execute("SELECT 1 FROM xorb_uploaders WHERE xorb = ? AND namespace = ?", (xorb_hex, namespace))
            .fetchone()
        )
        return row is not None

    def xorb_size(self, hash_hex: str) -> int | None:
        """Serialized size of a stored xorb, or None. Raises BadHash."""
        _check_hex(hash_hex, "xorb")
        row = self._db().execute("SELECT size FROM xorbs WHERE hash = ?", (hash_hex,)).fetchone()
        return row[0] if row else None

    def open_xorb_range(self, hash_hex: str, start: int | None = None, end: int | None = None) -> XorbSlice:
        """Locate bytes [start, end] (inclusive, like HTTP Range) of a stored xorb.

        None for start/end means from the beginning / to the end. The end is clipped to the
        xorb size. Counts the bytes as served. Raises BadHash, UnknownXorb, RangeNotSatisfiable.
        """
        _check_hex(hash_hex, "xorb")
        row = self._db().execute("SELECT size FROM xorbs WHERE hash = ?", (hash_hex,)).fetchone()
        if row is None:
            raise UnknownXorb(f"xorb {hash_hex} is not stored")
        total = row[0]
        start = 0 if start is None else start
        end = total - 1 if end is None else min(end, total - 1)
        if start >= total or start > end:
            raise RangeNotSatisfiable(f"xorb {hash_hex}: range {start}-{end} outside 0-{total - 1}")
        self._counters.add("bytes_served", end - start + 1)
        return XorbSlice(self._blob_path("xorbs", hash_hex), start, end - start + 1, total)

    def read_verified(self, hash_hex: str, start: int | None = None, end: int | None = None) -> VerifiedRange:
        """Bytes [start, end] (inclusive, like HTTP Range) of a stored xorb whose chunks match the hashes they were
        stored under. A xorb is checked whole (every chunk decompressed and hashed) the first time this process
        serves it and again whenever its file changes (size, mtime, inode) or is marked damaged (by a scrub), so a
        damaged or truncated xorb is an error status, never wrong bytes or a dropped connection. Bit rot that keeps
        the file's mtime is what `scrub` is for. Raises BadHash, UnknownXorb, RangeNotSatisfiable, DamagedXorb (and
        marks it damaged: dedup stops answering with it, so a client uploads the xorb again, which repairs it).
        """
        s = self.open_xorb_range(hash_hex, start, end)
        try:
            st = os.stat(s.path)
            identity = (st.st_size, st.st_mtime_ns, st.st_ino)
            if self._verified.get(hash_hex) != identity or self._damaged(hash_hex):
                self._verify_whole(hash_hex, s.path, s.total)
                self._verified[hash_hex] = identity
            with open(s.path, "rb") as f:
                f.seek(s.offset)
                data = f.read(s.length)
            if len(data) != s.length:
                raise xf.TruncatedError(f"the file ends before byte {s.offset + s.length}")
        except (OSError, xf.FormatError, ValueError) as error:  # TruncatedError is a FormatError
            self._verified.pop(hash_hex, None)
            self._mark_damaged(hash_hex, str(error))
            raise DamagedXorb(
                f"xorb {hash_hex} is damaged on the server ({error}); its bytes are not served. "
                "Upload the file again to repair it, or restore the server's data root"
            ) from None
        return VerifiedRange(data, s.offset, s.total)

    def _verify_whole(self, hash_hex: str, path: Path, total: int) -> None:
        """Raises xf.FormatError when the stored file is not exactly the xorb verified at upload."""
        data = path.read_bytes()
        if len(data) != total:
            raise xf.TruncatedError(f"the file holds {len(data)} bytes, {total} were stored")
        for c in self._chunks(self._db(), hash_hex) or []:
            [(_, _, raw)] = list(xf.iter_chunks(data[c.byte_start : c.byte_end]))
            if xf.chunk_hash(raw) != c.hash:
                raise xf.FormatError(f"the chunk at byte {c.byte_start} does not match its hash")
        if self._damaged(hash_hex):  # repaired on disk since it was marked (restored by hand): serve it again
            with self._tx() as db:
                db.execute("DELETE FROM damaged_xorbs WHERE hash = ?", (hash_hex,))

    def _mark_damaged(self, hash_hex: str, detail: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO damaged_xorbs VALUES (?, ?, ?)", (hash_hex, detail, time.time()))

    def scrub(self) -> dict:
        """Check every stored xorb (each chunk against its stored hash) and shard (against its name); mark the damaged.

        Returns {"xorbs": checked, "shards": checked, "damaged": [{"xorb", "detail", "files": [file hashes]}],
        "damaged_shards": [hashes]}. A xorb whose file is missing counts as damaged.
        """
        db = self._db()
        damaged, checked = [], 0
        for (x_hex,) in db.execute("SELECT hash FROM xorbs ORDER BY hash").fetchall():
            checked += 1
            try:  # the serve path's own check, over the whole xorb (it also clears a mark the bytes no longer earn)
                size = db.execute("SELECT size FROM xorbs WHERE hash = ?", (x_hex,)).fetchone()[0]
                self._verify_whole(x_hex, self._blob_path("xorbs", x_hex), size)
            except (OSError, xf.FormatError, ValueError) as error:
                self._mark_damaged(x_hex, str(error))
                files = [r[0] for r in db.execute("SELECT DISTINCT file FROM file_terms WHERE xorb = ?", (x_hex,))]
                damaged.append({"xorb": x_hex, "detail": str(error), "files": files})
        bad_shards, shards = [], 0
        for (s_hex,) in db.execute("SELECT hash FROM shards ORDER BY hash").fetchall():
            shards += 1
            try:
                ok = xf.hash_to_hex(xf.chunk_hash(self._blob_path("shards", s_hex).read_bytes())) == s_hex
            except OSError:
                ok = False
            if not ok:
                bad_shards.append(s_hex)
        return {"xorbs": checked, "shards": shards, "damaged": damaged, "damaged_shards": bad_shards}

    # -- shards -----------------------------------------------------------------------------

    def put_shard(self, body: Body, uploader: str | None = None) -> ShardResult:
        """Verify and register an uploaded shard; `uploader` (the namespace of the write token) is recorded for
        its files (see `uploaded_by`).

        Checks: format; every xorb in its xorb section is stored with exactly the listed chunks;
        every file term names a stored xorb with an in-bounds chunk range and the right length;
        verification hashes (if present) and the file hash itself match the stored chunk hashes.
        A term over a xorb that `uploader` does not hold (`holds_xorb`) must carry its verification hash: that
        proves the uploader knows those chunks' hashes, which only their bytes give (dedup answers key them). No
        refusal states a hash the uploader could not compute itself.
        Raises TooLarge, TruncatedShard, CorruptShard, UnknownXorb.
        """
        data = _read_body(body, self.max_shard_bytes, "shard")
        self._counters.add("shard_bytes_received", len(data))
        try:
            shard = xf.parse_shard(data)
        except xf.TruncatedError as e:
            raise TruncatedShard(str(e)) from None
        except xf.FormatError as e:
            raise CorruptShard(str(e)) from None
        shard_hex = xf.hash_to_hex(xf.chunk_hash(data))
        db = self._db()
        cache: dict[str, list[_Chunk]] = {}

        def chunks_of(xorb: bytes, who: str) -> list[_Chunk]:
            x = xf.hash_to_hex(xorb)
            if x not in cache:
                found = self._chunks(db, x)
                if found is None:
                    raise UnknownXorb(f"shard {shard_hex}: {who} references xorb {x}, which is not stored")
                cache[x] = found
            return cache[x]

        for x in shard.xorbs:
            stored, x_hex = chunks_of(x.hash, "xorb section"), xf.hash_to_hex(x.hash)
            listed = [(c.hash, c.raw_len) for c in x.chunks]
            if listed != [(c.hash, c.raw_len) for c in stored]:
                raise CorruptShard(f"shard {shard_hex}: chunk list of xorb {x_hex} differs from the stored xorb")
        eligible: dict[bytes, str] = {}
        for x in shard.xorbs:
            for c in x.chunks:
                if c.flags & xf.CHUNK_FLAG_GLOBAL_DEDUP or xf.is_global_dedup_eligible(c.hash):
                    eligible[c.hash] = xf.hash_to_hex(x.hash)
        for f in shard.files:
            self._verify_file(shard_hex, f, chunks_of, lambda x: self.holds_xorb(uploader, xf.hash_to_hex(x)))
            if f.terms:  # the first chunk of every file is a global-dedup entry point
                eligible.setdefault(
                    chunks_of(f.terms[0].xorb, "")[f.terms[0].chunk_start].hash, xf.hash_to_hex(f.terms[0].xorb)
                )

        path = self._blob_path("shards", shard_hex)
        if not path.exists():
            self._write_blob(path, data)
        now = time.time()
        with self._tx() as tx:
            cur = tx.execute("INSERT OR IGNORE INTO shards VALUES (?, ?, ?)", (shard_hex, len(data), now))
            inserted = bool(cur.rowcount)
            for f in shard.files:
                f_hex = xf.hash_to_hex(f.hash)
                sha = xf.hash_to_hex(f.sha256) if f.sha256 else None
                if tx.execute(
                    "INSERT OR IGNORE INTO files VALUES (?, ?, ?, ?, ?)", (f_hex, f.size, sha, shard_hex, now)
                ).rowcount:
                    tx.executemany(
                        "INSERT INTO file_terms VALUES (?, ?, ?, ?, ?, ?)",
                        [
                            (f_hex, i, xf.hash_to_hex(t.xorb), t.chunk_start, t.chunk_end, t.raw_len)
                            for i, t in enumerate(f.terms)
                        ],
                    )
            tx.executemany(
                "UPDATE xorbs SET shard = ? WHERE hash = ? AND shard IS NULL",
                [(shard_hex, xf.hash_to_hex(x.hash)) for x in shard.xorbs],
            )
            tx.executemany("INSERT OR IGNORE INTO dedup_chunks VALUES (?, ?)", list(eligible.items()))
            if uploader is not None:
                tx.executemany(
                    "INSERT OR IGNORE INTO file_uploaders VALUES (?, ?)",
                    [(xf.hash_to_hex(f.hash), uploader) for f in shard.files],
                )
        return ShardResult(shard_hex, inserted, len(shard.files), len(shard.xorbs))

    @staticmethod
    def _verify_file(shard_hex: str, f: xf.ShardFile, chunks_of, holds) -> None:
        f_hex = xf.hash_to_hex(f.hash)
        if f.verification is not None and len(f.verification) != len(f.terms):
            raise CorruptShard(
                f"shard {shard_hex}: file {f_hex} has {len(f.verification)} "
                f"verification entries for {len(f.terms)} terms"
            )
        leaves: list[tuple[bytes, int]] = []
        for i, t in enumerate(f.terms):
            chunks = chunks_of(t.xorb, f"file {f_hex}")
            x_hex = xf.hash_to_hex(t.xorb)
            if not 0 <= t.chunk_start < t.chunk_end <= len(chunks):
                raise CorruptShard(
                    f"shard {shard_hex}: file {f_hex} term {i} chunk range "
                    f"[{t.chunk_start}, {t.chunk_end}) is out of bounds for xorb "
                    f"{x_hex} with {len(chunks)} chunks"
                )
            if f.verification is None and not holds(t.xorb):
                raise CorruptShard(
                    f"shard {shard_hex}: file {f_hex} term {i} references chunks this namespace did "
                    "not upload and has no verification entry for them"
                )
            span = chunks[t.chunk_start : t.chunk_end]
            if sum(c.raw_len for c in span) != t.raw_len:
                raise CorruptShard(
                    f"shard {shard_hex}: file {f_hex} term {i} claims {t.raw_len} bytes, "
                    f"xorb {x_hex} chunks hold {sum(c.raw_len for c in span)}"
                )
            if f.verification is not None and f.verification[i] != xf.verification_hash([c.hash for c in span]):
                raise CorruptShard(f"shard {shard_hex}: file {f_hex} term {i} verification hash mismatch")
            leaves += [(c.hash, c.raw_len) for c in span]
        if xf.file_hash(leaves) != f.hash:
            # Not the hash the terms give: a caller who named chunks it does not hold would learn it from here.
            raise CorruptShard(f"shard {shard_hex}: file {f_hex} does not hash to its name")

    # -- reads ------------------------------------------------------------------------------

    def uploaded_by(self, namespace: str, file_hex: str) -> bool:
        """Whether a shard describing this file was uploaded with a write token of `namespace`. Describing a file
        takes its chunk hashes, which only its holder knows (global-dedup answers list them keyed)."""
        row = (
            self._db()
            .execute("SELECT 1 FROM file_uploaders WHERE file = ? AND namespace = ?", (file_hex, namespace))
            .fetchone()
        )
        return row is not None

    def file_size(self, file_hex: str) -> int | None:
        """Size in bytes of a registered file, or None. Raises BadHash."""
        _check_hex(file_hex, "file")
        row = self._db().execute("SELECT size FROM files WHERE hash = ?", (file_hex,)).fetchone()
        return row[0] if row else None

    def file_sha256(self, file_hex: str) -> str | None:
        """SHA-256 hex the client declared for the file (not verifiable here), or None."""
        row = self._db().execute("SELECT sha256 FROM files WHERE hash = ?", (file_hex,)).fetchone()
        return row[0] if row else None

    def reconstruction(self, file_hex: str, byte_range: tuple[int, int] | None = None, base_url: str = "") -> dict:
        """The v1 reconstruction JSON for a file, optionally for bytes [start, end) of it.

        Terms are trimmed to the chunks that overlap the range; `offset_into_first_range` says
        how many bytes of the first term to skip (the client trims the tail itself). Fetch URLs
        point at `{base_url}/v1/xorb-data/{xorb}` and carry a signature (see check_fetch_url).
        Raises BadHash, UnknownFile, RangeNotSatisfiable.
        """
        _check_hex(file_hex, "file")
        db = self._db()
        row = db.execute("SELECT size FROM files WHERE hash = ?", (file_hex,)).fetchone()
        if row is None:
            raise UnknownFile(f"file {file_hex} is not registered")
        size = row[0]
        start, end = byte_range if byte_range else (0, size)
        if size == 0 or (byte_range and start >= size):
            if size == 0 and start == 0:
                return {"offset_into_first_range": 0, "terms": [], "fetch_info": {}}
            raise RangeNotSatisfiable(f"file {file_hex}: range start {start} >= size {size}")
        end = min(end, size)
        terms_out: list[dict] = []
        fetch: dict[str, list[dict]] = {}
        xorb_chunks: dict[str, list[_Chunk]] = {}  # files often reuse one xorb across many terms
        pos, skip = 0, 0
        for x_hex, c0, c1, _ in db.execute(
            "SELECT xorb, chunk_start, chunk_end, raw_len FROM file_terms WHERE file = ? ORDER BY idx", (file_hex,)
        ).fetchall():
            if pos >= end:
                break
            if x_hex not in xorb_chunks:
                xorb_chunks[x_hex] = self._chunks(db, x_hex)
            chunks = xorb_chunks[x_hex][c0:c1]
            lo, hi = 0, len(chunks)
            while lo < hi and pos + chunks[lo].raw_len <= start:  # drop chunks before the range
                pos += chunks[lo].raw_len
                lo += 1
            if lo == hi:
                continue
            if not terms_out:
                skip = start - pos
            take = 0
            while lo + take < hi and pos < end:
                pos += chunks[lo + take].raw_len
                take += 1
            span = chunks[lo : lo + take]
            rng = {"start": c0 + lo, "end": c0 + lo + take}
            terms_out.append({"hash": x_hex, "unpacked_length": sum(c.raw_len for c in span), "range": rng})
            fetch.setdefault(x_hex, []).append(
                {
                    "range": rng,
                    "url": self.fetch_url(base_url, x_hex),
                    "url_range": {"start": span[0].byte_start, "end": span[-1].byte_end - 1},
                }
            )
            pos += sum(c.raw_len for c in chunks[lo + take :])  # rest of this term is unused
        return {"offset_into_first_range": skip, "terms": terms_out, "fetch_info": _merge_fetch(fetch)}

    def fetch_url(self, base_url: str, xorb_hex: str) -> str:
        """A signed, expiring URL for reading the xorb (the client sends no token there)."""
        return self._urls.url(base_url, xorb_hex)

    def check_fetch_url(self, xorb_hex: str, exp: str | None, sig: str | None) -> bool:
        """True if (exp, sig) is a valid, unexpired signature for this xorb."""
        return self._urls.check(xorb_hex, exp, sig)

    def dedup_shard(self, chunk_hex: str, namespace: str | None = None) -> bytes | None:
        """Global dedup answer: a shard listing the xorb holding this chunk (and the other xorbs
        registered by the same shard, up to a cap), or None if the chunk is not indexed.

        Only xorbs `namespace` holds (`holds_xorb`) are answered with: an answer names a xorb and its chunk
        lengths, which must not tell a caller about another namespace's data (a chunk of someone's private file
        it happens to know). Another namespace's chunk is answered as an unknown one.

        Only chunks that are global-dedup eligible (first chunk of a file, hash % 1024 == 0, or
        flagged by the client) are indexed, as in the Xet spec. Chunk hashes are keyed with a fresh
        random key per answer (the spec's chunk hash key): the asker matches the chunks it holds and
        learns nothing about the others. Raises BadHash.
        """
        raw = _check_hex(chunk_hex, "chunk")
        db = self._db()
        row = db.execute(
            "SELECT d.xorb, x.shard FROM dedup_chunks d JOIN xorbs x ON x.hash = d.xorb WHERE d.hash = ?", (raw,)
        ).fetchone()
        if row is None:
            return None
        xorb_hex, shard_hex = row
        if not self.holds_xorb(namespace, xorb_hex) or self._damaged(xorb_hex):
            return None  # a damaged xorb: the asker uploads its own copy, which repairs it
        others = (
            [
                r[0]
                for r in db.execute(
                    "SELECT hash FROM xorbs WHERE shard = ? AND hash != ? LIMIT ?",
                    (shard_hex, xorb_hex, 4 * DEDUP_SHARD_MAX_XORBS),
                )
            ]
            if shard_hex
            else []
        )
        others = [x for x in others if self.holds_xorb(namespace, x)][: DEDUP_SHARD_MAX_XORBS - 1]
        xorbs = []
        for x_hex in [xorb_hex] + others:
            size = db.execute("SELECT size FROM xorbs WHERE hash = ?", (x_hex,)).fetchone()[0]
            chunks, pos, out = self._chunks(db, x_hex), 0, []
            for c in chunks:
                out.append(xf.ShardChunk(c.hash, pos, c.raw_len, 0))
                pos += c.raw_len
            xorbs.append(xf.ShardXorb(xf.hex_to_hash(x_hex), out, pos, size))
        return xf.serialize_shard(xf.Shard(xorbs=xorbs), chunk_key=secrets.token_bytes(32))

    def stats(self) -> dict:
        """Counters and totals: bytes received/served, xorbs, chunks, shards, files, stored bytes.

        Counters include this process's buffered counts; other processes' may lag ~1 s.
        """
        self._counters.flush()
        db = self._db()
        out = dict(db.execute("SELECT name, value FROM counters").fetchall())
        out["bytes_received"] = out["xorb_bytes_received"] + out["shard_bytes_received"]
        out["xorbs"], out["xorb_bytes"], out["chunks"] = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0), COALESCE(SUM(num_chunks), 0) FROM xorbs"
        ).fetchone()
        out["shards"], out["shard_bytes"] = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM shards").fetchone()
        out["files"] = db.execute("SELECT COUNT(*) FROM files").fetchone()[0]
        out["stored_bytes"] = out["xorb_bytes"] + out["shard_bytes"]
        return out


def _differs(path: Path, data: bytes) -> bool:
    """Whether the stored file at `path` is not exactly `data` (missing, truncated, or bytes changed)."""
    try:
        return path.stat().st_size != len(data) or path.read_bytes() != data
    except OSError:
        return True


def _merge_fetch(fetch: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Merge overlapping/adjacent chunk ranges per xorb so each byte range is fetched once."""
    out: dict[str, list[dict]] = {}
    for x, items in fetch.items():
        merged: list[dict] = []
        for it in sorted(items, key=lambda i: i["range"]["start"]):
            last = merged[-1] if merged else None
            if last and it["range"]["start"] <= last["range"]["end"]:
                last["range"]["end"] = max(last["range"]["end"], it["range"]["end"])
                last["url_range"]["end"] = max(last["url_range"]["end"], it["url_range"]["end"])
            else:
                merged.append({"range": dict(it["range"]), "url": it["url"], "url_range": dict(it["url_range"])})
        out[x] = merged
    return out


class BufferedCounters:
    """The store's counters (bytes received and served, ...), added to in memory and written to the index at most
    every COUNTER_FLUSH_S: a durable write transaction per ranged read would cost an fsync each and serialize
    readers on the write lock. So counters may lag by COUNTER_FLUSH_S per process."""

    def __init__(self, index: ThreadLocalDb) -> None:
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


class FetchUrlSigner:
    """Signed, expiring xorb URLs (`/v1/xorb-data/<xorb>?exp=...&sig=...`), which clients read without a token.

    The HMAC key is made once, in `key_file` (0600), and shared by every process serving the same store."""

    def __init__(self, key_file: Path, tmp_dir: Path) -> None:
        if not key_file.exists():
            tmp = tmp_dir / f"{key_file.name}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_bytes(secrets.token_bytes(32))
            os.chmod(tmp, 0o600)
            with contextlib.suppress(FileExistsError):  # link, not rename: if another process won the race, its key
                os.link(tmp, key_file)
            tmp.unlink()
        self._key = key_file.read_bytes()

    def url(self, base_url: str, xorb_hex: str) -> str:
        exp = int(time.time()) + FETCH_URL_TTL_S
        return f"{base_url}/v1/xorb-data/{xorb_hex}?exp={exp}&sig={self._sign(xorb_hex, exp)}"

    def check(self, xorb_hex: str, exp: str | None, sig: str | None) -> bool:
        """True if (exp, sig) is a valid, unexpired signature for this xorb."""
        if not exp or not sig or not (exp.isascii() and exp.isdigit() and sig.isascii()) or int(exp) < time.time():
            return False  # non-ASCII digits or signatures are no URL of ours (and compare_digest refuses them)
        return hmac.compare_digest(sig, self._sign(xorb_hex, int(exp)))

    def _sign(self, xorb_hex: str, exp: int) -> str:
        return hmac.new(self._key, f"{xorb_hex}.{exp}".encode(), hashlib.sha256).hexdigest()[:32]
