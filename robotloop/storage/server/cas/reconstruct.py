"""The CAS store's file reads: what the shards registered about files (sizes, uploaders), the reconstruction plans
a client follows to read a file (with signed fetch URLs for the xorbs), and the global-dedup answers."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import threading
import time
from pathlib import Path

from .. import xet_format as xf
from .errors import RangeNotSatisfiable, UnknownFile
from .index import CasIndex, Chunk, check_hex

FETCH_URL_TTL_S = 3600
DEDUP_SHARD_MAX_XORBS = 64  # keep the dedup answer small even for shards with many xorbs


class FileReads:
    """Owns the read side of the shard index: file sizes and uploaders, reconstruction plans, signed xorb fetch
    URLs, and global-dedup shards (answered only with xorbs the asking namespace holds)."""

    def __init__(self, index: CasIndex) -> None:
        self.index = index
        self._urls = FetchUrlSigner(index.root / "fetch.key", index.root / "tmp")

    def uploaded_by(self, namespace: str, file_hex: str) -> bool:
        """Whether a shard describing this file was uploaded with a write token of `namespace`. Describing a file
        takes its chunk hashes, which only its holder knows (global-dedup answers list them keyed)."""
        row = (
            self.index.db()
            .execute("SELECT 1 FROM file_uploaders WHERE file = ? AND namespace = ?", (file_hex, namespace))
            .fetchone()
        )
        return row is not None

    def file_size(self, file_hex: str) -> int | None:
        """Size in bytes of a registered file, or None. Raises BadHash."""
        check_hex(file_hex, "file")
        row = self.index.db().execute("SELECT size FROM files WHERE hash = ?", (file_hex,)).fetchone()
        return row[0] if row else None

    def file_sha256(self, file_hex: str) -> str | None:
        """SHA-256 hex the client declared for the file (not verifiable here), or None."""
        row = self.index.db().execute("SELECT sha256 FROM files WHERE hash = ?", (file_hex,)).fetchone()
        return row[0] if row else None

    def reconstruction(self, file_hex: str, byte_range: tuple[int, int] | None = None, base_url: str = "") -> dict:
        """The v1 reconstruction JSON for a file, optionally for bytes [start, end) of it.

        Terms are trimmed to the chunks that overlap the range; `offset_into_first_range` says
        how many bytes of the first term to skip (the client trims the tail itself). Fetch URLs
        point at `{base_url}/v1/xorb-data/{xorb}` and carry a signature (see check_fetch_url).
        Raises BadHash, UnknownFile, RangeNotSatisfiable.
        """
        check_hex(file_hex, "file")
        db = self.index.db()
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
        xorb_chunks: dict[str, list[Chunk]] = {}  # files often reuse one xorb across many terms
        pos, skip = 0, 0
        for x_hex, c0, c1, _ in db.execute(
            "SELECT xorb, chunk_start, chunk_end, raw_len FROM file_terms WHERE file = ? ORDER BY idx", (file_hex,)
        ).fetchall():
            if pos >= end:
                break
            if x_hex not in xorb_chunks:
                xorb_chunks[x_hex] = self.index.chunks(db, x_hex)
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
        raw = check_hex(chunk_hex, "chunk")
        db = self.index.db()
        row = db.execute(
            "SELECT d.xorb, x.shard FROM dedup_chunks d JOIN xorbs x ON x.hash = d.xorb WHERE d.hash = ?", (raw,)
        ).fetchone()
        if row is None:
            return None
        xorb_hex, shard_hex = row
        if not self.index.holds_xorb(namespace, xorb_hex) or self.index.damaged(xorb_hex):
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
        others = [x for x in others if self.index.holds_xorb(namespace, x)][: DEDUP_SHARD_MAX_XORBS - 1]
        xorbs = []
        for x_hex in [xorb_hex] + others:
            size = db.execute("SELECT size FROM xorbs WHERE hash = ?", (x_hex,)).fetchone()[0]
            chunks, pos, out = self.index.chunks(db, x_hex), 0, []
            for c in chunks:
                out.append(xf.ShardChunk(c.hash, pos, c.raw_len, 0))
                pos += c.raw_len
            xorbs.append(xf.ShardXorb(xf.hex_to_hash(x_hex), out, pos, size))
        return xf.serialize_shard(xf.Shard(xorbs=xorbs), chunk_key=secrets.token_bytes(32))


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
        expiry = _unix_seconds(exp)
        if expiry is None or expiry < time.time() or not sig or not sig.isascii():
            return False  # non-ASCII signatures are no URL of ours (and compare_digest refuses them)
        return hmac.compare_digest(sig, self._sign(xorb_hex, expiry))

    def _sign(self, xorb_hex: str, exp: int) -> str:
        return hmac.new(self._key, f"{xorb_hex}.{exp}".encode(), hashlib.sha256).hexdigest()[:32]


def _unix_seconds(text: str | None) -> int | None:
    """The `exp` of a fetch URL of ours: Unix seconds in ASCII digits, at most 19 of them (what `url` writes: 10 until
    the year 2286). Anything else is None: no URL of ours, read without ever converting a number of any length
    (int() refuses over 4,300 digits)."""
    if not text or len(text) > 19 or not (text.isascii() and text.isdigit()):
        return None
    return int(text)
