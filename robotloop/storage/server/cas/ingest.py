"""The CAS store's write side: a xorb or a shard is verified whole before anything of it is stored.

A xorb must hash to its name; a shard's xorbs must be stored with exactly the chunks it lists, and every file it
describes must hash to its name from stored chunks the uploader proves it knows (see `CasIngest.put_shard`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .. import xet_format as xf
from .errors import CorruptShard, CorruptXorb, TooLarge, TruncatedShard, UnknownXorb
from .index import CasIndex, Chunk, check_hex

MAX_XORB_BYTES = 80 * 1024 * 1024  # client caps xorbs at 64 MiB of chunk data + headers/footer
MAX_SHARD_BYTES = 128 * 1024 * 1024

Body = bytes | bytearray | memoryview | Iterable[bytes] | BinaryIO


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


def read_body(body: Body, limit: int, what: str) -> bytes:
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


class CasIngest:
    """Owns uploads: checks xorb and shard bodies (size limits, format, hashes, the uploader's proof of the chunks a
    shard's files name), then writes their blobs and index rows (xorbs, chunks, files, terms, dedup entry points,
    uploaders). Nothing is written unless every check passed."""

    def __init__(self, index: CasIndex, max_xorb_bytes: int = MAX_XORB_BYTES, max_shard_bytes: int = MAX_SHARD_BYTES):
        self.index = index
        self.max_xorb_bytes, self.max_shard_bytes = max_xorb_bytes, max_shard_bytes

    def put_xorb(self, hash_hex: str, body: Body, uploader: str | None = None) -> XorbResult:
        """Verify and store a serialized xorb under its hash; `uploader` (the namespace of the write token) is
        recorded as holding it (see `CasIndex.holds_xorb`).

        Raises BadHash, TooLarge, or CorruptXorb (malformed, or content hashes to another hash).
        Re-uploading a stored xorb stores nothing (was_inserted=False), but its bytes are verified all the same:
        only bytes that hash to the xorb make the uploader one of its holders.
        """
        check_hex(hash_hex, "xorb")
        data = read_body(body, self.max_xorb_bytes, f"xorb {hash_hex}")
        self.index.counters.add("xorb_bytes_received", len(data))
        try:
            parsed = xf.parse_xorb(data)
        except xf.FormatError as e:
            raise CorruptXorb(f"xorb {hash_hex}: {e}") from None
        actual = xf.hash_to_hex(parsed.hash)
        if actual != hash_hex:
            raise CorruptXorb(f"xorb {hash_hex}: content hashes to {actual}")
        stored = self.index.xorb_size(hash_hex) is not None
        path = self.index.blob_path("xorbs", hash_hex)
        if not stored or _differs(path, data):  # a damaged copy is replaced by these verified bytes: the repair
            self.index.write_blob(path, data)
        with self.index.tx() as db:
            cur = db.execute(
                "INSERT INTO xorbs VALUES (?, ?, ?, ?, NULL, ?) ON CONFLICT DO NOTHING",
                (hash_hex, len(data), parsed.raw_len, len(parsed.chunks), time.time()),
            )
            if cur.rowcount:
                db.executemany(
                    "INSERT INTO xorb_chunks VALUES (?, ?, ?, ?, ?, ?)",
                    [(hash_hex, i, c.hash, c.byte_start, c.byte_end, c.raw_len) for i, c in enumerate(parsed.chunks)],
                )
            if uploader is not None:
                db.execute("INSERT INTO xorb_uploaders VALUES (?, ?) ON CONFLICT DO NOTHING", (hash_hex, uploader))
            db.execute("DELETE FROM damaged_xorbs WHERE hash = ?", (hash_hex,))
        return XorbResult(hash_hex, bool(cur.rowcount), len(parsed.chunks), len(data))

    def put_shard(self, body: Body, uploader: str | None = None) -> ShardResult:
        """Verify and register an uploaded shard; `uploader` (the namespace of the write token) is recorded for
        its files (see `FileReads.uploaded_by`).

        Checks: format; every xorb in its xorb section is stored with exactly the listed chunks;
        every file term names a stored xorb with an in-bounds chunk range and the right length;
        verification hashes (if present) and the file hash itself match the stored chunk hashes.
        A term over a xorb that `uploader` does not hold (`holds_xorb`) must carry its verification hash: that
        proves the uploader knows those chunks' hashes, which only their bytes give (dedup answers key them). No
        refusal states a hash the uploader could not compute itself.
        Raises TooLarge, TruncatedShard, CorruptShard, UnknownXorb.
        """
        data = read_body(body, self.max_shard_bytes, "shard")
        self.index.counters.add("shard_bytes_received", len(data))
        try:
            shard = xf.parse_shard(data)
        except xf.TruncatedError as e:
            raise TruncatedShard(str(e)) from None
        except xf.FormatError as e:
            raise CorruptShard(str(e)) from None
        shard_hex = xf.hash_to_hex(xf.chunk_hash(data))
        eligible = self._check_shard(shard_hex, shard, uploader)
        path = self.index.blob_path("shards", shard_hex)
        if not path.exists():
            self.index.write_blob(path, data)
        inserted = self._register_shard(shard_hex, shard, len(data), eligible, uploader)
        return ShardResult(shard_hex, inserted, len(shard.files), len(shard.xorbs))

    def _check_shard(self, shard_hex: str, shard: xf.Shard, uploader: str | None) -> dict[bytes, str]:
        """Every check of `put_shard`; returns the global-dedup entry points (chunk hash -> xorb) it adds."""
        db = self.index.db()
        cache: dict[str, list[Chunk]] = {}

        def chunks_of(xorb: bytes, who: str) -> list[Chunk]:
            x = xf.hash_to_hex(xorb)
            if x not in cache:
                found = self.index.chunks(db, x)
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
            _verify_file(shard_hex, f, chunks_of, lambda x: self.index.holds_xorb(uploader, xf.hash_to_hex(x)))
            if f.terms:  # the first chunk of every file is a global-dedup entry point
                eligible.setdefault(
                    chunks_of(f.terms[0].xorb, "")[f.terms[0].chunk_start].hash, xf.hash_to_hex(f.terms[0].xorb)
                )
        return eligible

    def _register_shard(
        self, shard_hex: str, shard: xf.Shard, size: int, eligible: dict[bytes, str], uploader: str | None
    ) -> bool:
        """Write a checked shard's index rows in one transaction; whether the shard was new."""
        now = time.time()
        with self.index.tx() as tx:
            cur = tx.execute("INSERT INTO shards VALUES (?, ?, ?) ON CONFLICT DO NOTHING", (shard_hex, size, now))
            inserted = bool(cur.rowcount)
            for f in shard.files:
                f_hex = xf.hash_to_hex(f.hash)
                sha = xf.hash_to_hex(f.sha256) if f.sha256 else None
                if tx.execute(
                    "INSERT INTO files VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (f_hex, f.size, sha, shard_hex, now),
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
            tx.executemany("INSERT INTO dedup_chunks VALUES (?, ?) ON CONFLICT DO NOTHING", list(eligible.items()))
            if uploader is not None:
                tx.executemany(
                    "INSERT INTO file_uploaders VALUES (?, ?) ON CONFLICT DO NOTHING",
                    [(xf.hash_to_hex(f.hash), uploader) for f in shard.files],
                )
        return inserted


def _verify_file(shard_hex: str, f: xf.ShardFile, chunks_of, holds) -> None:
    """Raises CorruptShard unless every term of `f` is in bounds, of the right length and proven (a verification
    hash, or a xorb the uploader `holds`), and the terms' chunks hash to the file's name."""
    f_hex = xf.hash_to_hex(f.hash)
    if f.verification is not None and len(f.verification) != len(f.terms):
        raise CorruptShard(
            f"shard {shard_hex}: file {f_hex} has {len(f.verification)} verification entries for {len(f.terms)} terms"
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


def _differs(path: Path, data: bytes) -> bool:
    """Whether the stored file at `path` is not exactly `data` (missing, truncated, or bytes changed)."""
    try:
        return path.stat().st_size != len(data) or path.read_bytes() != data
    except OSError:
        return True
