"""The datasets page: buckets, the LeRobot datasets in them, each episode's length, task, success and video
segment, an episode's state and action for its plots, and the byte ranges its video player asks for, all read
from the bucket server as `robotloop bucket ls` and the trainer's catalog read them."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..clients import ServiceClients
from ..storage import BucketUrl, Entry
from ..storage import NotFound as StorageNotFound
from .names import UnknownItem

SUCCESS_KEY = "next.success"  # robotloop.capture.recorder's column: true from the frame the task is solved
STATE_KEY, ACTION_KEY = "observation.state", "action"
MAX_PLOT_FRAMES = 5000  # frames of one episode plotted; longer episodes are thinned to this


class DatasetViews:
    """Datasets in buckets, shaped for the datasets page, and their videos' bytes.

    Datasets are kept open between calls (`DatasetSource.refresh` re-reads only the metadata that changed), each
    under its own lock, so a page polled every few seconds costs one listing; which episodes succeeded is
    remembered per data file (by Xet hash), and a file's size for a few seconds (a video's range requests come in
    bursts).
    """

    def __init__(self, clients: ServiceClients) -> None:
        self.clients = clients
        self._sources: dict[str, tuple[threading.Lock, Any]] = {}  # dataset URL -> (its lock, DatasetSource)
        self._success: dict[str, dict[str, dict[int, bool]]] = {}  # dataset -> data file Xet hash -> successes
        self._sizes: dict[str, tuple[float, Entry]] = {}
        self._lock = threading.Lock()

    def buckets(self, namespaces: list[str]) -> list[str]:
        """The bucket URLs of `namespaces` this dashboard's storage token may see."""
        out = []
        for ns in namespaces:
            out += [f"hf://buckets/{b['id']}" for b in self.clients.bucket.list_buckets(ns)]
        return out

    def datasets(self, bucket: str) -> list[str]:
        """The dataset URLs under `<bucket>/datasets/` (the layout `robotloop record` writes)."""
        url = BucketUrl.parse(bucket)
        root = url if url.path else url / "datasets"
        try:
            found = self.clients.bucket.ls(root)
        except StorageNotFound:
            return []
        return sorted(str(u) for u in found if isinstance(u, BucketUrl))

    def dataset(self, url: str) -> dict[str, Any]:
        """A dataset's shape and its episodes: length, task, success and, per camera, the shared video file and
        the episode's time segment in it.

        Raises:
            NotFound: no LeRobot dataset at `url`.
        """
        with self._source(url) as source:
            return self._dataset(url, source)

    def _dataset(self, url: str, source) -> dict[str, Any]:
        rows = source.episode_rows()
        success = self._episode_success(url, source)
        episodes = []
        for ref in source.episodes:
            row = rows[ref.index]
            videos = {
                key: {
                    "url": ref.videos[key][0].url,
                    "from_s": float(row[f"videos/{key}/from_timestamp"]),
                    "to_s": float(row[f"videos/{key}/to_timestamp"]),
                }
                for key in source.video_keys
            }
            episodes.append(
                {
                    "index": ref.index,
                    "length": ref.length,
                    "task": "; ".join(row.get("tasks") or []),
                    "success": success.get(ref.index),
                    "video": videos,
                }
            )
        return {
            "url": url,
            "fps": source.fps,
            "features": {k: {"dtype": v["dtype"], "shape": list(v["shape"])} for k, v in source.features.items()},
            "video_keys": source.video_keys,
            "episodes": episodes,
        }

    def episode(self, url: str, index: int) -> dict[str, Any]:
        """One episode's state and action per frame (for plots), with their feature names.

        Raises:
            UnknownItem: no such episode.
        """
        import pyarrow.parquet as pq

        with self._source(url) as source:
            ref = next((e for e in source.episodes if e.index == index), None)
            names = {k: (source.features[k].get("names") or None) for k in (STATE_KEY, ACTION_KEY)}
        if ref is None:
            raise UnknownItem(f"{url} has no episode {index}")
        columns = ["episode_index", "timestamp", STATE_KEY, ACTION_KEY]
        with self.clients.bucket.open(BucketUrl.parse(ref.data.url)) as f:
            table = pq.read_table(f, columns=columns, filters=[("episode_index", "=", index)])
        if table.num_rows > MAX_PLOT_FRAMES:  # thinned evenly: a plot has fewer pixels than that anyway
            table = table.take(list(range(0, table.num_rows, -(-table.num_rows // MAX_PLOT_FRAMES))))
        return {
            "url": url,
            "index": index,
            "timestamp": table.column("timestamp").to_pylist(),
            "state": table.column(STATE_KEY).to_pylist(),
            "action": table.column(ACTION_KEY).to_pylist(),
            "names": names,
        }

    def file_entry(self, url: str, max_age_s: float = 10.0) -> Entry:
        """Size and Xet hash of a bucket file, remembered for `max_age_s` (a video's range requests come in
        bursts).

        Raises:
            NotFound: no such file.
        """
        now = time.monotonic()
        cached = self._sizes.get(url)
        if cached and now - cached[0] < max_age_s:
            return cached[1]
        entry = self.clients.bucket.stat(BucketUrl.parse(url))
        if len(self._sizes) > 4096:  # bounded: forget everything rather than track ages
            self._sizes.clear()
        self._sizes[url] = (now, entry)
        return entry

    def read_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of a bucket file (a video's byte range)."""
        return self.clients.bucket.read_range(BucketUrl.parse(url), start, end)

    @contextlib.contextmanager
    def _source(self, url: str) -> Iterator[Any]:
        """The dataset's `DatasetSource`, refreshed, held under its lock (it is not thread-safe, and pages poll)."""
        with self._lock:
            lock = self._sources.setdefault(url, (threading.Lock(), None))[0]
        with lock:
            source = self._sources[url][1]  # read under the lock: another request may have opened it meanwhile
            if source is None:
                source = dataset_source_class()(self.clients.bucket, BucketUrl.parse(url))
                with self._lock:
                    self._sources[url] = (lock, source)
            else:
                source.refresh()
            yield source

    def _episode_success(self, url: str, source) -> dict[int, bool]:
        """Per episode, whether `next.success` is ever true (None-free: datasets without the column give {})."""
        import pyarrow.parquet as pq

        if SUCCESS_KEY not in source.features:
            return {}
        out: dict[int, bool] = {}
        seen, kept = self._success.get(url, {}), {}
        for data in {e.data.xet_hash: e.data for e in source.episodes}.values():
            known = seen.get(data.xet_hash)
            if known is None:
                raw = self.clients.bucket.read_range(BucketUrl.parse(data.url), 0, data.size)
                table = pq.ParquetFile(io.BytesIO(raw)).read(columns=["episode_index", SUCCESS_KEY], use_threads=False)
                known = {}
                for episode, flag in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
                    solved = bool(flag[0] if isinstance(flag, list) else flag)
                    known[episode] = known.get(episode, False) or solved
            kept[data.xet_hash] = known
            out.update(known)
        self._success[url] = kept  # only the data files the dataset has now: the last one changes every commit
        return out


def dataset_source_class() -> type:
    """The trainer's `DatasetSource` (its catalog skips LeRobot's per-episode stats columns, most of an episodes
    file). Imported on first use: the catalog imports torch."""
    from ..train.data.catalog import DatasetSource

    return DatasetSource
