"""What there is to train on: the datasets' episodes (LeRobot v3 metadata read from the bucket), this rank's share
of them, and the order in which to decode them.

Metadata (`meta/info.json`, `meta/stats.json`, the episodes parquet files) is small and read whole, uncached;
`DatasetSource.refresh` re-reads only the episodes parquet files whose Xet hash changed.
"""

from __future__ import annotations

import io
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ...capture.info import episode_files
from ...capture.recorder import camera_shadow_map
from ...features import ACTION_KEY, INTERVENTION_KEY, STATE_KEY, SUCCESS_KEY
from ...storage import BucketClient, BucketUrl, Entry, NotFound, StorageError
from ..weights import Role, role_of
from .errors import DatasetMismatch

log = logging.getLogger(__name__)

_DEFAULT_KEYS = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
# Of LeRobot's per-episode stats, the two that say what an episode's frames weigh before any is decoded.
_SUCCESS_MAX, _INTERVENTION_MEAN = f"stats/{SUCCESS_KEY}/max", f"stats/{INTERVENTION_KEY}/mean"

EpisodeKey = tuple[str, int]  # (dataset URL, episode index)


@dataclass(frozen=True)
class FileRef:
    """One file an episode reads: its URL, Xet hash (lineage), and whether other episodes share it."""

    url: str
    xet_hash: str
    size: int
    shared: bool


@dataclass(frozen=True)
class EpisodeRef:
    """One committed episode: where its rows and frames are, and (from its metadata's stats, None where they are
    missing) whether it succeeded and how many of its frames the expert drove."""

    dataset: str
    index: int
    length: int
    from_index: int  # the dataset-global `index` range of its rows, [from_index, to_index)
    to_index: int
    data: FileRef
    videos: dict[str, tuple[FileRef, float]]  # video key -> (file, from_timestamp)
    role: Role = "demo"
    success: bool | None = None
    expert_frames: int | None = None
    flag_columns: tuple[str, ...] = ()  # the data columns that weigh its frames (next.success, intervention)

    @property
    def key(self) -> EpisodeKey:
        return (self.dataset, self.index)

    def lineage(self) -> dict:
        """The episode's files and their Xet hashes, as a checkpoint records what it was trained on."""
        files = [{"url": self.data.url, "xet_hash": self.data.xet_hash}]
        files += [{"url": f.url, "xet_hash": f.xet_hash, "video_key": k} for k, (f, _) in self.videos.items()]
        return {"dataset": self.dataset, "episode_index": self.index, "length": self.length, "files": files}


def _combined_stats(sources: list[DatasetSource]) -> dict:
    """Normalization stats over all datasets (count-weighted, as lerobot's own multi-dataset loader combines them),
    as JSON-style lists. A dataset without `meta/stats.json` is left out, with a warning."""
    for source in sources:
        if not source.stats:
            log.warning("%s has no meta/stats.json: its frames do not count in the normalization stats", source.url)
    with_stats = [s.stats for s in sources if s.stats]
    if len(with_stats) <= 1:
        return with_stats[0] if with_stats else {}
    from lerobot.datasets.compute_stats import aggregate_stats

    arrays = [
        {k: {name: np.asarray(v) for name, v in feature.items()} for k, feature in st.items()} for st in with_stats
    ]
    return {
        k: {name: np.asarray(v).tolist() for name, v in feature.items()}
        for k, feature in aggregate_stats(arrays).items()
    }


class DatasetSource:
    """One LeRobot v3 dataset in a bucket, as committed so far.

    Raises (on construction):
        NotFound: no `meta/info.json` under `url` (nothing committed yet, or a wrong URL).
        DatasetMismatch: the dataset stores images in parquet (only video features are streamed).
    """

    def __init__(self, client: BucketClient, url: BucketUrl) -> None:
        self.client, self.url = client, url
        self._prefix = f"{url.path}/" if url.path else ""  # bucket paths of the dataset's files start with it
        try:
            self.info = json.loads(self._read_small(url / "meta" / "info.json"))
        except NotFound:
            client.ls(url)  # a missing bucket raises here, with its own message
            raise NotFound(
                f"{url} holds no LeRobot dataset: no meta/info.json (nothing recorded there yet, or "
                f"another folder: `robotloop bucket ls {url}`)"
            ) from None
        try:
            self.stats = json.loads(self._read_small(url / "meta" / "stats.json"))
        except NotFound:
            self.stats = {}
        self.fps = int(self.info["fps"])
        self.features = {k: v for k, v in self.info["features"].items() if k not in _DEFAULT_KEYS}
        images = [k for k, v in self.features.items() if v["dtype"] == "image"]
        if images:
            raise DatasetMismatch(f"{url}: features {images} are images stored in parquet; only video features stream.")
        self.video_keys = sorted(k for k, v in self.features.items() if v["dtype"] == "video")
        self.role = role_of(self.features)
        flags = {k: v for k, v in self.features.items() if k in (SUCCESS_KEY, INTERVENTION_KEY)}
        for key, feature in flags.items():
            if feature["dtype"] != "bool" or list(feature["shape"]) != [1]:
                raise DatasetMismatch(f"{url}: '{key}' is {feature['dtype']} {feature['shape']}, expected bool [1]")
        self.flag_columns = tuple(sorted(flags))
        self._meta_files: dict[str, tuple[str, list[dict]]] = {}  # episodes parquet path -> (xet hash, rows)
        self.episodes: list[EpisodeRef] = []
        self.refresh()

    def _read_small(self, url: BucketUrl) -> bytes:
        # Metadata is small and changes under us (the live loop): read it whole, uncached.
        size = self.client.stat(url).size
        return self.client.read_range(url, 0, size) if size else b""

    def refresh(self) -> list[EpisodeRef]:
        """Re-read the episodes metadata; returns the episodes committed since the last call.

        One listing of the dataset gives every file's Xet hash; only episodes parquet files whose hash is
        new are read. The recorder commits data and video files before metadata, so an episode named by
        metadata in this listing has its files in it too (one that does not is skipped until next time).
        """
        entries = {e.url.path: e for e in self.client.ls(self.url, recursive=True) if isinstance(e, Entry)}
        meta_prefix = f"{self._prefix}meta/episodes/"
        for path, entry in sorted(entries.items()):
            is_meta = path.startswith(meta_prefix) and path.endswith(".parquet")
            if is_meta and self._meta_files.get(path, ("",))[0] != entry.xet_hash:
                self._meta_files[path] = (entry.xet_hash, self._read_episode_rows(entry))
        rows = self.episode_rows()
        users: dict[str, int] = {}  # file path -> how many episodes read it
        for row in rows.values():
            for path in self._paths(row).values():
                users[path] = users.get(path, 0) + 1
        known = {e.index for e in self.episodes}
        new = []
        for index in sorted(set(rows) - known):
            ref = self._episode(rows[index], entries, users)
            if ref is not None:
                new.append(ref)
        self.episodes = sorted(self.episodes + new, key=lambda e: e.index)
        return new

    def episode_rows(self) -> dict[int, dict]:
        """The episodes metadata as last refreshed, by episode index: LeRobot v3's `meta/episodes` columns (tasks,
        length, each video's from/to timestamps, ...), without the per-episode stats columns."""
        return {row["episode_index"]: row for _, rows in self._meta_files.values() for row in rows}

    def _read_episode_rows(self, entry: Entry) -> list[dict]:
        """Raises StorageError (retried by the caller's next refresh) when the file was rewritten since it was
        listed: the recorder rewrites episodes metadata on every commit, and a read by path gets the new bytes."""
        # LeRobot v3's per-episode stats are most of the file (100 of a 1,000-episode dataset's 113 columns): not
        # parsed at all (1.2 s of 2 cores for that dataset). ParquetFile, not read_table: no pandas import.
        try:
            parquet = pq.ParquetFile(io.BytesIO(self.client.read_range(entry.url, 0, entry.size)))
            keep = [c for c in parquet.schema_arrow.names if not c.startswith("stats/")]
            keep += [c for c in (_SUCCESS_MAX, _INTERVENTION_MEAN) if c in parquet.schema_arrow.names]
            return parquet.read(columns=keep, use_threads=False).to_pylist()
        except (pa.ArrowException, ValueError) as error:
            raise StorageError(f"{entry.url} changed while it was read ({error}); read again next time") from None

    def _paths(self, row: dict) -> dict[str, str]:
        """Bucket paths of an episode's data file and video files (key "" for data)."""
        return {key: self._prefix + rel for key, rel in episode_files(self.info, row, self.video_keys).items()}

    def _episode(self, row: dict, entries: dict[str, Entry], users: dict[str, int]) -> EpisodeRef | None:
        files = {}
        for key, path in self._paths(row).items():
            entry = entries.get(path)
            if entry is None:
                return None
            files[key] = FileRef(str(entry.url), entry.xet_hash, entry.size, users[path] > 1)
        videos = {k: (files[k], float(row[f"videos/{k}/from_timestamp"])) for k in self.video_keys}
        length = int(row["length"])
        return EpisodeRef(
            str(self.url),
            int(row["episode_index"]),
            length,
            int(row["dataset_from_index"]),
            int(row["dataset_to_index"]),
            files[""],
            videos,
            self.role,
            *self._outcome(row, length),
            self.flag_columns,
        )

    def _outcome(self, row: dict, length: int) -> tuple[bool | None, int | None]:
        """(success, expert frames) of an episode from its metadata row: any `next.success` (a dataset without the
        feature: never), frames with `intervention` (a demo's: all of them). None: the stats that say are missing."""

        def stat(key: str) -> float | None:
            value = row.get(key)
            return None if value is None else float(np.asarray(value).reshape(-1)[0])

        success: bool | None = False
        if SUCCESS_KEY in self.features:
            top = stat(_SUCCESS_MAX)
            success = None if top is None else top > 0
        if self.role == "demo":
            return success, length
        share = stat(_INTERVENTION_MEAN)
        return success, None if share is None else round(share * length)


class EpisodeCatalog:
    """The datasets one sampler trains on, and the episodes of them that are this rank's (`known`).

    Owns one `DatasetSource` per URL, checks that they share one feature layout and frame rate (a batch stacks
    frames of every dataset), and says what a frame holds (`features`, `frame_shapes`). Rank `rank` of
    `world_size` takes episode i of the d-th dataset when (i + d) % world_size == rank: disjoint, balanced, and
    stable as episodes are appended. `known` keeps the order in which episodes became known, which the decode
    schedule and the checkpoint rely on. An episode `keep` refuses (its every frame weighs 0, as its metadata says)
    is never known: it goes to `dropped`, never decoded nor buffered, only counted.

    Not thread-safe: the sampler changes `known` under its lock (a source's `refresh` reads the network and runs
    outside it).

    Raises (on construction):
        NotFound: a dataset URL holds no committed dataset.
        DatasetMismatch: datasets differ in features or fps, or lack `observation.state`/`action`.
    """

    def __init__(
        self,
        client: BucketClient,
        urls: list[BucketUrl],
        rank: int,
        world_size: int,
        keep: Callable[[EpisodeRef], bool] = lambda ref: True,
    ) -> None:
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self.sources = [DatasetSource(client, url) for url in urls]
        self._check_features()
        first = self.sources[0]
        self.fps, self.video_keys, self.stats = first.fps, first.video_keys, _combined_stats(self.sources)
        # What the sampler streams, and so what the policy may read (other features, e.g. an environment state,
        # would make ACT expect an input that no batch carries).
        self.features = {k: v for k, v in first.features.items() if k in (*first.video_keys, STATE_KEY, ACTION_KEY)}
        self.known: dict[EpisodeKey, EpisodeRef] = {}
        self.dropped: dict[EpisodeKey, EpisodeRef] = {}  # this rank's episodes `keep` refused

    def frame_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per feature streamed, the shape and dtype of one frame's value: images uint8 [3,H,W], vectors float32."""
        features = self.features
        shapes = {k: ((3, *features[k]["shape"][:2]), torch.uint8) for k in self.video_keys}
        shapes[STATE_KEY] = ((features[STATE_KEY]["shape"][0],), torch.float32)
        shapes[ACTION_KEY] = ((features[ACTION_KEY]["shape"][0],), torch.float32)
        return shapes

    def take(self, refs: list[EpisodeRef], d: int) -> list[EpisodeKey]:
        """Of `refs` (episodes of the d-th dataset), the keys of this rank's not seen before that `keep` takes; they
        are known now (the others dropped)."""
        seen = self.known.keys() | self.dropped.keys()
        mine = [r for r in refs if (r.index + d) % self.world_size == self.rank and r.key not in seen]
        for r in mine:
            (self.known if self.keep(r) else self.dropped)[r.key] = r
        return [r.key for r in mine if r.key in self.known]

    def share_frames(self) -> int:
        """Frames in this rank's known episodes."""
        return sum(e.length for e in self.known.values())

    def refs(self, all_ranks: bool = False, dropped: bool = False) -> list[EpisodeRef]:
        """This rank's known episodes (or, `all_ranks`, every rank's; `dropped`, those `keep` refused too), sorted
        by dataset and index."""
        if all_ranks:
            refs = [e for source in self.sources for e in source.episodes if dropped or self.keep(e)]
        else:
            refs = [*self.known.values(), *(self.dropped.values() if dropped else ())]
        return sorted(refs, key=lambda e: (e.dataset, e.index))

    def _check_features(self) -> None:
        # What a batch stacks must agree; the rest may differ (a fleet dataset's intervention, a demo's reward).
        def signature(src: DatasetSource) -> dict:
            streamed = (STATE_KEY, ACTION_KEY)
            return {  # a camera's rendering too: a sim's frames with other shadow maps are other pixels
                k: (v["dtype"], list(v["shape"]), camera_shadow_map(v))
                for k, v in src.features.items()
                if k in streamed or v["dtype"] == "video"
            }

        first = self.sources[0]
        for key in (STATE_KEY, ACTION_KEY):
            if key not in first.features:
                raise DatasetMismatch(f"{first.url} has no '{key}' feature; ACT training needs it")
        for src in self.sources[1:]:
            if signature(src) != signature(first) or src.fps != first.fps:
                raise DatasetMismatch(
                    f"{src.url} differs from {first.url}: features {signature(src)} at {src.fps} fps vs "
                    f"{signature(first)} at {first.fps} fps. Train on datasets recorded with one DatasetSpec's "
                    "cameras, state and action."
                )


class DecodeSchedule:
    """Which known episode to decode next, and so (results are buffered in job order) the buffer's composition.

    Decode order is a seeded permutation per pass over the rank's share; episodes found by a refresh go first (the
    live loop wants the newest data in the buffer soon). A new pass starts only when the share does not fit the
    buffer. After a resume, `restore` (the saved buffer composition) is decoded before anything else, in its
    order, even where those episodes are buffered or in flight. `queue` and `passes` are checkpoint state.

    Not thread-safe: the sampler calls it under its lock.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.queue: deque[EpisodeKey] = deque()  # episodes to decode next, in order
        self.passes = 0
        self.restore: list[EpisodeKey] = []  # after a resume: the composition to rebuild first

    def add(self, keys: list[EpisodeKey], fresh: bool = False) -> None:
        """Schedule newly known episodes: `fresh` ones (found by a refresh) first, in their order."""
        if fresh:
            self.queue.extendleft(reversed(keys))
        else:
            self.queue.extend(self._permuted(keys))

    def next(self, known: dict[EpisodeKey, EpisodeRef], busy: set[EpisodeKey], bound: int) -> EpisodeKey | None:
        """The next episode to decode, skipping `busy` ones (buffered or in flight) unless they are to be restored.
        None: everything is (or is about to be) buffered, nothing to stream. A share larger than the buffer
        (`bound` frames) starts a new pass over the episodes not busy."""
        while self.queue:
            key = self.queue.popleft()
            if key not in busy or key in self.restore:
                return key
        fits = sum(e.length for e in known.values()) <= bound
        rest = [k for k in known if k not in busy]
        if fits or not rest:
            return None
        self.passes += 1
        self.queue.extend(self._permuted(sorted(rest)))
        return self.queue.popleft()

    def restart(self, restore: list[EpisodeKey], then: list[EpisodeKey]) -> None:
        """Resume: decode `restore` first (and wait for it), then `then`, then what later passes bring."""
        self.restore = list(restore)
        self.queue = deque(restore + then)

    def restored(self, key: EpisodeKey) -> None:
        """`key` is buffered: if it was the next episode of the composition to rebuild, that one is done."""
        if self.restore and self.restore[0] == key:
            self.restore.pop(0)

    def _permuted(self, keys: list[EpisodeKey]) -> list[EpisodeKey]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.passes)
        return [keys[i] for i in torch.randperm(len(keys), generator=g).tolist()]
