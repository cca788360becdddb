"""The CAS store's xorb reads: byte ranges of stored xorbs, served only while their chunks still match the hashes
they were verified with at upload, and the scrub that checks the whole store."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import xet_format as xf
from .errors import DamagedXorb, RangeNotSatisfiable, UnknownXorb
from .index import CasIndex, check_hex


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


class XorbReads:
    """Owns serving xorb bytes: ranges, the check of a xorb's bytes against its chunk hashes (remembered per file
    identity, so a xorb is hashed again only when its file changes), damage marks, and `scrub`."""

    def __init__(self, index: CasIndex) -> None:
        self.index = index
        self._verified: dict[str, tuple[int, int, int]] = {}  # xorb -> (size, mtime_ns, inode) when last checked whole

    def xorb_size(self, hash_hex: str) -> int | None:
        """Serialized size of a stored xorb, or None. Raises BadHash."""
        check_hex(hash_hex, "xorb")
        return self.index.xorb_size(hash_hex)

    def open_xorb_range(self, hash_hex: str, start: int | None = None, end: int | None = None) -> XorbSlice:
        """Locate bytes [start, end] (inclusive, like HTTP Range) of a stored xorb.

        None for start/end means from the beginning / to the end. The end is clipped to the
        xorb size. Counts the bytes as served. Raises BadHash, UnknownXorb, RangeNotSatisfiable.
        """
        total = self.xorb_size(hash_hex)
        if total is None:
            raise UnknownXorb(f"xorb {hash_hex} is not stored")
        start = 0 if start is None else start
        end = total - 1 if end is None else min(end, total - 1)
        if start >= total or start > end:
            raise RangeNotSatisfiable(f"xorb {hash_hex}: range {start}-{end} outside 0-{total - 1}")
        self.index.counters.add("bytes_served", end - start + 1)
        return XorbSlice(self.index.blob_path("xorbs", hash_hex), start, end - start + 1, total)

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
            if self._verified.get(hash_hex) != identity or self.index.damaged(hash_hex):
                self._verify_whole(hash_hex, s.path, s.total)
                self._verified[hash_hex] = identity
            with open(s.path, "rb") as f:
                f.seek(s.offset)
                data = f.read(s.length)
            if len(data) != s.length:
                raise xf.TruncatedError(f"the file ends before byte {s.offset + s.length}")
        except (OSError, xf.FormatError, ValueError) as error:  # TruncatedError is a FormatError
            self._verified.pop(hash_hex, None)
            self.index.mark_damaged(hash_hex, str(error))
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
        for c in self.index.chunks(self.index.db(), hash_hex) or []:
            [(_, _, raw)] = list(xf.iter_chunks(data[c.byte_start : c.byte_end]))
            if xf.chunk_hash(raw) != c.hash:
                raise xf.FormatError(f"the chunk at byte {c.byte_start} does not match its hash")
        if self.index.damaged(hash_hex):  # repaired on disk since it was marked (restored by hand): serve it again
            self.index.clear_damaged(hash_hex)

    def scrub(self) -> dict:
        """Check every stored xorb (each chunk against its stored hash) and shard (against its name); mark the damaged.

        Returns {"xorbs": checked, "shards": checked, "damaged": [{"xorb", "detail", "files": [file hashes]}],
        "damaged_shards": [hashes]}. A xorb whose file is missing counts as damaged.
        """
        db = self.index.db()
        damaged, checked = [], 0
        for (x_hex,) in db.execute("SELECT hash FROM xorbs ORDER BY hash").fetchall():
            checked += 1
            try:  # the serve path's own check, over the whole xorb (it also clears a mark the bytes no longer earn)
                self._verify_whole(x_hex, self.index.blob_path("xorbs", x_hex), self.index.xorb_size(x_hex))
            except (OSError, xf.FormatError, ValueError) as error:
                self.index.mark_damaged(x_hex, str(error))
                files = [r[0] for r in db.execute("SELECT DISTINCT file FROM file_terms WHERE xorb = ?", (x_hex,))]
                damaged.append({"xorb": x_hex, "detail": str(error), "files": files})
        bad_shards, shards = [], 0
        for (s_hex,) in db.execute("SELECT hash FROM shards ORDER BY hash").fetchall():
            shards += 1
            try:
                ok = xf.hash_to_hex(xf.chunk_hash(self.index.blob_path("shards", s_hex).read_bytes())) == s_hex
            except OSError:
                ok = False
            if not ok:
                bad_shards.append(s_hex)
        return {"xorbs": checked, "shards": shards, "damaged": damaged, "damaged_shards": bad_shards}
