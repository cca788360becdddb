"""A bounded, content-addressed local read cache.

Files are keyed by their Xet hash, so an entry can never be stale: a path whose content changes gets a
new hash. Eviction is least-recently-used by access time, down to `max_bytes`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import BadValue
from .private import private_dir


class ReadCache:
    """Example:
    ```python
    >>> cache = ReadCache(Path("/tmp/rl-cache"), max_bytes=2**30)
    >>> cache.get("ab12...") is None
    True
    ```
    """

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        private_dir(self.root)

    def _path(self, xet_hash: str) -> Path:
        if not (len(xet_hash) == 64 and all(c in "0123456789abcdef" for c in xet_hash)):
            raise BadValue(f"not a Xet hash: {xet_hash!r}")
        return self.root / xet_hash[:2] / xet_hash

    def get(self, xet_hash: str) -> Path | None:
        """The cached file for `xet_hash`, marked as just used, or None."""
        path = self._path(xet_hash)
        try:
            os.utime(path)  # access time drives eviction; utime works where atime updates are off
        except FileNotFoundError:
            return None
        return path

    def put(self, xet_hash: str, source: Path) -> Path:
        """Copy `source` into the cache (atomically: readers never see a partial entry) and evict to the bound."""
        path = self._path(xet_hash)
        path.parent.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp, open(source, "rb") as src:
            shutil.copyfileobj(src, tmp, 1 << 20)
        os.replace(tmp.name, path)
        self.evict()
        return path

    def size(self) -> int:
        return sum(p.stat().st_size for p in self._entries())

    def evict(self) -> None:
        """Remove the least recently used entries until the cache fits `max_bytes`."""
        entries = sorted(self._entries(), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in entries)
        for entry in entries:
            if total <= self.max_bytes:
                break
            total -= entry.stat().st_size
            entry.unlink(missing_ok=True)

    def _entries(self) -> list[Path]:
        return [p for p in self.root.glob("??/*") if len(p.name) == 64]
