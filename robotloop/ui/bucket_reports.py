"""The loop reports `robotloop loop` uploads beside its runs (`<bucket>/models/<run>/report/`, see
`robotloop.loop.report.upload_report`), read through the dashboard's bucket client.

A report is named by a hash of its URL, as a report folder on this machine is by a hash of its path, so no bucket
path is ever taken from a request: an id is looked up among the reports found, and a file name among the files
listed in that report. Files come through the storage read cache (keyed by Xet hash: never stale), and a run's
listing is kept `ttl_s` seconds, so a page that polls does not list the bucket on every poll.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..clients import ServiceClients
from ..loop.layout import EVAL_FOLDER, run_report_url
from ..storage import BadBucketUrl, BucketUrl, Entry, StorageError
from ..storage import NotFound as StorageNotFound
from ..storage.cache import ReadCache
from .names import UnknownItem

log = logging.getLogger("robotloop.ui")
MARKDOWN, SUMMARY, EVALUATION = "report.md", "report.json", f"{EVAL_FOLDER}/eval_report.json"
MAX_TEXT_BYTES = 2**20  # report.md, report.json, eval_report.json: kilobytes as the loop writes them
MAX_MEDIA_BYTES = 256 * 2**20  # a figure or a rollout video (a few MB)


def report_id(where: Path | BucketUrl) -> str:
    """The id pages name a report by: a hash of its folder or URL, so no path or URL is in a page's URL."""
    return hashlib.sha256(str(where).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class BucketReport:
    """One uploaded report: its URL (`<run>/report`), the run's URL, and its files by path under the report."""

    id: str
    url: BucketUrl
    run_url: str
    files: dict[str, Entry]

    @property
    def media(self) -> dict[str, Entry]:
        """The files a page may show, by name: the report's PNG figures and its evaluation's rollout videos."""
        shown = {}
        for path, entry in self.files.items():
            parts = PurePosixPath(path).parts
            figure = len(parts) == 1 and path.endswith(".png")
            video = len(parts) == 3 and parts[:2] == (EVAL_FOLDER, "videos") and path.endswith(".mp4")
            if figure or video:
                shown[parts[-1]] = entry
        return shown

    @property
    def modified(self) -> float | None:
        times = [e.uploaded_at for e in self.files.values() if e.uploaded_at is not None]
        return max(times) if times else None


class BucketReports:
    """Finds the report beside a run, remembers which id is which, and reads the report's files."""

    def __init__(self, clients: ServiceClients, ttl_s: float = 10.0) -> None:
        self.clients, self.ttl_s = clients, ttl_s
        self._listed: dict[str, tuple[float, BucketReport | None]] = {}  # run URL -> (when listed, its report)
        self._runs: dict[str, str] = {}  # report id -> run URL: how a page's id is found again
        self._lock = threading.Lock()

    def find(self, run_url: str) -> BucketReport | None:
        """The report uploaded beside run `run_url` (`<bucket>/models/<run>`), or None: none there, or not a
        bucket URL.

        Raises:
            StorageError: the bucket server failed or refused the listing (a missing folder is None).
        """
        run_url = run_url.rstrip("/")
        now = time.monotonic()
        with self._lock:
            listed = self._listed.get(run_url)
        if listed is not None and now - listed[0] < self.ttl_s:
            return listed[1]
        found = self._list(run_url)
        with self._lock:
            self._listed = {k: v for k, v in self._listed.items() if now - v[0] < self.ttl_s}  # forget old ones
            self._listed[run_url] = (now, found)
            if found is not None:
                self._runs[found.id] = run_url
        return found

    def find_all(self, run_urls: list[str]) -> list[BucketReport]:
        """The reports of those runs that have one; a run the bucket server cannot list is left out (logged), so
        one broken bucket does not take the page down."""
        out = []
        for run_url in dict.fromkeys(r.rstrip("/") for r in run_urls):
            try:
                found = self.find(run_url)
            except StorageError as err:
                log.warning("dashboard: no report for %s: %s", run_url, err)
                continue
            if found is not None:
                out.append(found)
        return out

    def get(self, wanted: str, runs: Callable[[], list[str]] | None = None) -> BucketReport:
        """The report with id `wanted`, among those found so far, else among those of `runs()` (the runs the
        dashboard knows: after a restart, a report page opened from a link).

        Raises:
            UnknownItem: no report with that id.
        """
        with self._lock:
            run_url = self._runs.get(wanted)
        found = self.find(run_url) if run_url is not None else None
        if (found is None or found.id != wanted) and runs is not None:
            found = next((r for r in self.find_all(runs()) if r.id == wanted), None)
        if found is None or found.id != wanted:
            raise UnknownItem(f"no report {wanted!r}")
        return found

    def text(self, report: BucketReport, path: str) -> str | None:
        """A text file of the report (`report.md`, ...), or None when it has none (or one too large to show)."""
        entry = report.files.get(path)
        if entry is None or entry.size > MAX_TEXT_BYTES:
            return None
        try:
            return self.local_copy(entry).read_text(errors="replace")
        except (StorageNotFound, OSError):  # deleted since it was listed
            return None

    def json(self, report: BucketReport, path: str) -> dict[str, Any]:
        """A JSON file of the report as a dict; {} when it is missing or not a JSON object."""
        try:
            value = json.loads(self.text(report, path) or "null")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def media(self, report: BucketReport, name: str) -> Path:
        """A figure or video of the report, by name (only names its listing holds), as a local file.

        Raises:
            UnknownItem: no such file in the report, or it went since it was listed.
        """
        entry = report.media.get(name)
        if entry is None or entry.size > MAX_MEDIA_BYTES:
            raise UnknownItem(f"report {report.id} has no file {name!r}")
        try:
            return self.local_copy(entry)
        except StorageNotFound:
            raise UnknownItem(f"report {report.id} has no file {name!r} any more") from None

    def local_copy(self, entry: Entry) -> Path:
        """`entry`'s bytes on this machine: its read-cache file, downloaded (and hash-checked) on first use."""
        cache = self._cache
        hit = cache.get(entry.xet_hash)
        if hit is None:
            with tempfile.TemporaryDirectory(dir=cache.root) as tmp:  # the cache's file system: a cheap copy
                got = self.clients.bucket.download(entry, Path(tmp) / "file")  # fills the client's cache
                hit = cache.get(entry.xet_hash) or cache.put(entry.xet_hash, got)
        return hit

    @functools.cached_property
    def _cache(self) -> ReadCache:
        bucket, storage = self.clients.bucket, self.clients.settings.storage
        return bucket.cache or ReadCache(storage.cache_dir, storage.cache_max_bytes)

    def _list(self, run_url: str) -> BucketReport | None:
        try:
            url = run_report_url(BucketUrl.parse(run_url))
            listed = self.clients.bucket.ls(url, recursive=True)
        except (BadBucketUrl, StorageNotFound):
            return None
        prefix = f"{url.path}/"  # a listing by prefix: `report-old/` is not this report's
        files = {e.url.path[len(prefix) :]: e for e in listed if isinstance(e, Entry) and e.url.path.startswith(prefix)}
        if MARKDOWN not in files and EVALUATION not in files:
            return None
        return BucketReport(report_id(url), url, run_url, files)
