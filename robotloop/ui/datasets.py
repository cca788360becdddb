"""The datasets page: buckets, the LeRobot datasets in them, each episode's length, task, success and video
segment, an episode's state and action for its plots, and the byte ranges its video player asks for, all read
from the bucket server as `robotloop bucket ls` and the trainer's catalog read them.

A fleet dataset (`robotloop.fleet.FleetRecorder`'s: frames with `intervention`, episodes with a line each in
`meta/fleet_episodes.jsonl`) shows, per episode, the robot, release, kind, success and expert frames its facts
say, and the takeovers: the `[start, end)` frame ranges where the expert drove (`takeover_segments`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..capture.recorder import EPISODE_FACTS_FILE, camera_shadow_map
from ..clients import ServiceClients
from ..features import ACTION_KEY, INTERVENTION_KEY, STATE_KEY, SUCCESS_KEY
from ..storage import BucketUrl, Entry
from ..storage import NotFound as StorageNotFound
from .names import UnknownItem

log = logging.getLogger("robotloop.ui")
MAX_PLOT_FRAMES = 5000  # frames of one episode plotted; longer episodes are thinned to this
MAX_FACTS_BYTES = 64 * 2**20  # meta/fleet_episodes.jsonl: ~250 bytes an episode, so 250,000 episodes
# What a fleet episode's line (robotloop.fleet.recording's facts) says, as the page shows it: the page's name for
# each and the line's key.
FLEET_FACTS = {
    "robot": "robot_id",
    "release": "release",
    "seed": "seed",
    "kind": "kind",
    "success": "success",
    "max_reward": "max_reward",
    "frames": "frames",
    "expert_frames": "expert_frames",
}


def takeover_segments(flags: Sequence[bool]) -> list[tuple[int, int]]:
    """The `[start, end)` frame ranges of an episode where `flags` (its frames' `intervention`) are true: where
    the expert drove.

    Example:
        ```python
        >>> takeover_segments([False, True, True, False, True])
        [(1, 3), (4, 5)]
        ```
    """
    segments: list[tuple[int, int]] = []
    start = None
    for i, flag in enumerate(flags):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            segments.append((start, i))
            start = None
    if start is not None:
        segments.append((start, len(flags)))
    return segments


def fleet_facts(text: str) -> dict[int, dict[str, Any]]:
    """The episodes' facts of a `meta/fleet_episodes.jsonl`, by episode index, under the page's names
    (`FLEET_FACTS`). A line that is no JSON object with an integer `episode_index` is skipped: the page shows the
    episode without facts rather than nothing."""
    out: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        index = row.get("episode_index") if isinstance(row, dict) else None
        if isinstance(index, int) and not isinstance(index, bool):
            out[index] = {name: _plain(row.get(key)) for name, key in FLEET_FACTS.items()}
    return out


def _plain(value: Any) -> Any:
    """A fact as the page shows it: a string, number, bool or None (anything else, as its JSON text)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value)[:200]


@dataclass
class _Flags:
    """What an episode's data says of it: whether it succeeded, and where the expert drove."""

    success: bool | None = None
    intervention: list[bool] = field(default_factory=list)


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
        self._flags: dict[str, dict[str, dict[int, _Flags]]] = {}  # dataset -> data file Xet hash -> episodes
        self._facts: dict[str, tuple[str, dict[int, dict[str, Any]]]] = {}  # dataset -> (Xet hash, its facts)
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
        the episode's time segment in it; a fleet dataset's (`role` "fleet") also each episode's `fleet` facts
        (None where its line is missing) and its `takeovers`, `[start, end)` frame ranges.

        Raises:
            NotFound: no LeRobot dataset at `url`.
        """
        with self._source(url) as source:
            return self._dataset(url, source)

    def _dataset(self, url: str, source) -> dict[str, Any]:
        rows = source.episode_rows()
        flags = self._episode_flags(url, source)
        fleet = INTERVENTION_KEY in source.features
        facts = self._fleet_facts(url) if fleet else {}
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
            found = flags.get(ref.index, _Flags())
            episode = {
                "index": ref.index,
                "length": ref.length,
                "task": "; ".join(row.get("tasks") or []),
                "success": found.success,
                "video": videos,
            }
            if fleet:
                episode["fleet"] = facts.get(ref.index)
                episode["takeovers"] = [list(s) for s in takeover_segments(found.intervention)]
            episodes.append(episode)
        return {
            "url": url,
            "role": "fleet" if fleet else "demo",
            "fps": source.fps,
            "features": {k: {"dtype": v["dtype"], "shape": list(v["shape"])} for k, v in source.features.items()},
            "video_keys": source.video_keys,
            # The sim cameras filmed with other shadow maps than gym-aloha's (`DatasetSpec.shadow_map`): side by key.
            "shadow_maps": {
                k: side for k in source.video_keys if (side := camera_shadow_map(source.features[k])) is not None
            },
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

    def _episode_flags(self, url: str, source) -> dict[int, _Flags]:
        """Per episode, whether `next.success` is ever true and its frames' `intervention`, read once per data file
        (by Xet hash); a dataset with neither column gives {}."""
        import pyarrow.parquet as pq

        columns = [k for k in (SUCCESS_KEY, INTERVENTION_KEY) if k in source.features]
        if not columns:
            return {}
        out: dict[int, _Flags] = {}
        seen, kept = self._flags.get(url, {}), {}
        for data in {e.data.xet_hash: e.data for e in source.episodes}.values():
            known = seen.get(data.xet_hash)
            if known is None:
                raw = self.clients.bucket.read_range(BucketUrl.parse(data.url), 0, data.size)
                table = pq.ParquetFile(io.BytesIO(raw)).read(columns=["episode_index", *columns], use_threads=False)
                known = _flags_of(table, columns)
            kept[data.xet_hash] = known
            out.update(known)
        self._flags[url] = kept  # only the data files the dataset has now: the last one changes every commit
        return out

    def _fleet_facts(self, url: str) -> dict[int, dict[str, Any]]:
        """The fleet dataset's episode facts (`fleet_facts`), read again only when the file's Xet hash changed; {}
        when it has none (or one too large to show)."""
        facts_url = BucketUrl.parse(url) / EPISODE_FACTS_FILE
        try:
            entry = self.clients.bucket.stat(facts_url)
            cached = self._facts.get(url)
            if cached is not None and cached[0] == entry.xet_hash:
                return cached[1]
            if entry.size > MAX_FACTS_BYTES:
                log.warning("dashboard: %s is %d bytes: its episodes are shown without facts", facts_url, entry.size)
                return {}
            text = self.clients.bucket.read_range(facts_url, 0, entry.size).decode(errors="replace")
        except StorageNotFound:  # no episode came with facts (yet), or the file went since it was listed
            return {}
        found = fleet_facts(text)
        self._facts[url] = (entry.xet_hash, found)
        return found


def _flags_of(table, columns: list[str]) -> dict[int, _Flags]:
    """Each episode's success and intervention flags from a data file's `episode_index` and flag columns (bool
    [1] features: a list of one per row), in the file's row order, which is the frames' order."""

    def flag(value: Any) -> bool:
        return bool(value[0] if isinstance(value, list) else value)

    out: dict[int, _Flags] = {}
    episodes = table.column("episode_index").to_pylist()
    success = table.column(SUCCESS_KEY).to_pylist() if SUCCESS_KEY in columns else None
    intervention = table.column(INTERVENTION_KEY).to_pylist() if INTERVENTION_KEY in columns else None
    for i, episode in enumerate(episodes):
        found = out.setdefault(episode, _Flags(success=False if success is not None else None))
        if success is not None:
            found.success = found.success or flag(success[i])
        if intervention is not None:
            found.intervention.append(flag(intervention[i]))
    return out


def dataset_source_class() -> type:
    """The trainer's `DatasetSource` (its catalog skips LeRobot's per-episode stats columns, most of an episodes
    file). Imported on first use: the catalog imports torch."""
    from ..train.data.catalog import DatasetSource

    return DatasetSource
