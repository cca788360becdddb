"""Streaming training data: LeRobot v3 episodes from buckets, decoded ahead into a bounded frame buffer.

The data path never downloads a dataset. Metadata (`meta/info.json`, `meta/stats.json`, the episodes
parquet files) is small and read whole; each episode's data parquet and mp4 are fetched on demand by a
pool of decode worker processes:

- a file that belongs to one episode only (what `robotloop.capture` writes: one parquet + one mp4 per
  committed episode) is downloaded through the client's content-addressed read cache: one request, and a
  later pass over the dataset reads it from local disk;
- a file shared by many episodes (lerobot's writer packs episodes up to 100/200 MB a file) is never
  downloaded: the parquet rows and the video frames of the episode are read with ranged requests
  (`BucketClient.open`), only the byte ranges the decoders ask for.

Workers decode every frame of an episode once (torchcodec, or PyAV where FFmpeg's libraries are missing;
uint8 [T,3,H,W]) and hand the tensors back through shared memory (torch.multiprocessing: local IPC only,
nothing crosses a network). A background thread copies them into a ring buffer ("arena") of preallocated
tensors on the sampler's device (GPU memory on CUDA), evicting the oldest episodes when full, and schedules
more decode jobs. `next_batch` is then pure tensor indexing on the device.

Example:
    ```python
    >>> sampler = StreamingSampler(client, [BucketUrl.parse("hf://buckets/lab/demos/datasets/cube")],
    ...                            DataSettings(device="cuda", chunk_size=100))
    >>> batch = sampler.next_batch(8)
    >>> batch["action"].shape, batch["action_is_pad"].shape
    (torch.Size([8, 100, 14]), torch.Size([8, 100]))
    >>> sampler.wait_s   # seconds the trainer spent inside next_batch (data wait)
    ```
"""

from __future__ import annotations

import io
import json
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.multiprocessing as mp

from ..errors import BadInput, Unavailable
from ..storage import BucketClient, BucketUrl, Entry, NotFound, StorageError

log = logging.getLogger(__name__)

STATE_KEY, ACTION_KEY = "observation.state", "action"
_DEFAULT_KEYS = {"timestamp", "frame_index", "episode_index", "index", "task_index"}


class DatasetMismatch(BadInput, ValueError):
    """Datasets given to one sampler do not share features (or frame rate); the message says which."""


class DataError(Unavailable, RuntimeError):
    """An episode could not be read or decoded after retries; the message names the episode and the cause."""


@dataclass
class DataSettings:
    """How the streaming data path runs.

    The buffer bound is `buffer_frames` when set, else `buffer_bytes` divided by the bytes one frame takes
    (all cameras' uint8 images plus state and action). `buffer_bytes` None: on CUDA, `buffer_share` of the
    device's free memory when the sampler starts (on an H200 about 190 episodes of 480x640 frames, so nothing is
    evicted and decoded again); on CPU 8 GiB.
    """

    decode_workers: int = 4
    buffer_frames: int | None = None
    buffer_bytes: int | None = None
    buffer_share: float = 0.5
    chunk_size: int = 100  # ACT's action horizon
    refresh_every_s: float = 30.0  # the background thread looks for new episodes this often; 0: only on refresh()
    seed: int = 0
    device: str = "cpu"
    max_inflight: int | None = None  # decode jobs submitted but not yet in the buffer; None: 2 per worker
    retries: int = 3  # per episode, inside the worker: reads cross a network
    # "auto": torchcodec when its FFmpeg libraries load, else PyAV (whose wheel bundles FFmpeg), as lerobot does.
    video_backend: Literal["auto", "torchcodec", "pyav"] = "auto"

    def __post_init__(self) -> None:
        if self.video_backend not in ("auto", "torchcodec", "pyav"):
            raise ValueError(f"video_backend must be 'auto', 'torchcodec' or 'pyav', got {self.video_backend!r}")


# -- metadata ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileRef:
    """One file an episode reads: its URL, Xet hash (lineage), and whether other episodes share it."""

    url: str
    xet_hash: str
    size: int
    shared: bool


@dataclass(frozen=True)
class EpisodeRef:
    """One committed episode: where its rows and frames are."""

    dataset: str
    index: int
    length: int
    from_index: int  # the dataset-global `index` range of its rows, [from_index, to_index)
    to_index: int
    data: FileRef
    videos: dict[str, tuple[FileRef, float]]  # video key -> (file, from_timestamp)

    @property
    def key(self) -> tuple[str, int]:
        return (self.dataset, self.index)


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
        rows = {row["episode_index"]: row for _, rs in self._meta_files.values() for row in rs}
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

    def _read_episode_rows(self, entry: Entry) -> list[dict]:
        """Raises StorageError (retried by the caller's next refresh) when the file was rewritten since it was
        listed: the recorder rewrites episodes metadata on every commit, and a read by path gets the new bytes."""
        try:
            table = pq.read_table(io.BytesIO(self.client.read_range(entry.url, 0, entry.size)))
        except (pa.ArrowException, ValueError) as error:
            raise StorageError(f"{entry.url} changed while it was read ({error}); read again next time") from None
        keep = [c for c in table.column_names if not c.startswith("stats/")]  # stats are most of the bytes
        return table.select(keep).to_pylist()

    def _paths(self, row: dict) -> dict[str, str]:
        """Bucket paths of an episode's data file and video files (key "" for data)."""
        info, base = self.info, self._prefix
        paths = {
            "": base + info["data_path"].format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
        }
        for key in self.video_keys:
            rel = info["video_path"].format(
                video_key=key, chunk_index=row[f"videos/{key}/chunk_index"], file_index=row[f"videos/{key}/file_index"]
            )
            paths[key] = base + rel
        return paths

    def _episode(self, row: dict, entries: dict[str, Entry], users: dict[str, int]) -> EpisodeRef | None:
        files = {}
        for key, path in self._paths(row).items():
            entry = entries.get(path)
            if entry is None:
                return None
            files[key] = FileRef(str(entry.url), entry.xet_hash, entry.size, users[path] > 1)
        videos = {k: (files[k], float(row[f"videos/{k}/from_timestamp"])) for k in self.video_keys}
        return EpisodeRef(
            str(self.url),
            int(row["episode_index"]),
            int(row["length"]),
            int(row["dataset_from_index"]),
            int(row["dataset_to_index"]),
            files[""],
            videos,
        )


# -- decode workers ------------------------------------------------------------------------------------------
def _decode_worker(
    endpoint: str,
    token: str | None,
    cache: tuple[str, int] | None,
    retries: int,
    backend: str,
    jobs: mp.Queue,
    results: mp.Queue,
    scratch_root: str,
    parent_pid: int,
) -> None:
    """Worker process: decode episodes until a None job arrives. Opens its own client (nothing is shared)."""
    from ..storage.cache import ReadCache
    from ..workers import die_with_parent

    die_with_parent(parent_pid)  # a trainer killed with SIGKILL takes its decoders with it
    torch.set_num_threads(1)  # one episode per process; the pool is the parallelism
    client = BucketClient(endpoint, token, ReadCache(Path(cache[0]), cache[1]) if cache else None)
    frames_at = _FRAME_READERS[backend]
    scratch = Path(tempfile.mkdtemp(dir=scratch_root))
    try:
        while (job := jobs.get()) is not None:
            seq, episode, fps = job
            for attempt in range(retries):
                try:
                    results.put((seq, _decode_episode(client, episode, fps, scratch, frames_at), None))
                    break
                except Exception as error:  # noqa: BLE001 - reported to the main process, which raises it
                    if attempt == retries - 1:
                        results.put(
                            (
                                seq,
                                None,
                                f"{episode.dataset} episode {episode.index}: {error!r}\n{traceback.format_exc()}",
                            )
                        )
                    time.sleep(0.2 * 2**attempt)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _decode_episode(
    client: BucketClient, ep: EpisodeRef, fps: int, scratch: Path, frames_at: FrameReader
) -> dict[str, torch.Tensor]:
    """Rows and every video frame of one episode: state/action float32 [T,D], frames uint8 [T,3,H,W]."""
    columns = [STATE_KEY, ACTION_KEY, "index", "timestamp"]
    rows = (("index", ">=", ep.from_index), ("index", "<", ep.to_index))
    url = BucketUrl.parse(ep.data.url)
    if ep.data.shared:  # ranged reads: the footer, then only the row groups holding this episode
        with client.open(url) as f:
            table = pq.read_table(f, columns=columns, filters=list(rows))
    else:
        path = client.download(url, scratch / f"{os.getpid()}-{url.name}")
        table = pq.read_table(path, columns=columns, filters=list(rows))
        path.unlink(missing_ok=True)
    table = table.sort_by("index")
    if table.num_rows != ep.length:
        raise DataError(f"{ep.data.url} holds {table.num_rows} rows of episode {ep.index}, metadata says {ep.length}")
    out = {STATE_KEY: _matrix(table[STATE_KEY]), ACTION_KEY: _matrix(table[ACTION_KEY])}
    timestamps = table["timestamp"].to_numpy()
    for key, (file, from_ts) in ep.videos.items():
        out[key] = _decode_video(client, file, [from_ts + float(ts) for ts in timestamps], scratch, frames_at)
    return out


def _matrix(column: pa.ChunkedArray) -> torch.Tensor:
    flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return torch.from_numpy(flat.reshape(len(column), -1).astype("float32"))  # a copy: arrow buffers are read-only


def _decode_video(
    client: BucketClient, file: FileRef, timestamps: list[float], scratch: Path, frames_at: FrameReader
) -> torch.Tensor:
    url = BucketUrl.parse(file.url)
    if file.shared:  # ranged reads: the decoder seeks, so only the ranges around this episode's frames are fetched
        with client.open(url) as f:
            return frames_at(f, timestamps, True)
    path = client.download(url, scratch / f"{os.getpid()}-{url.name}")
    try:
        return frames_at(str(path), timestamps, False)
    finally:
        path.unlink(missing_ok=True)


FrameReader = Callable[[str | IO[bytes], list[float], bool], torch.Tensor]


def _frames_torchcodec(source: str | IO[bytes], timestamps: list[float], shared: bool) -> torch.Tensor:
    """The frames lerobot's torchcodec backend returns for these timestamps: index round(ts * average_fps).
    In a shared file, "approximate" seeks from the container index instead of scanning every packet."""
    from torchcodec.decoders import VideoDecoder

    decoder = VideoDecoder(source, seek_mode="approximate" if shared else "exact")
    fps = decoder.metadata.average_fps
    return decoder.get_frames_at([round(ts * fps) for ts in timestamps]).data.contiguous()


def _frames_pyav(source: str | IO[bytes], timestamps: list[float], shared: bool) -> torch.Tensor:
    """The same frames through PyAV: seek to the keyframe before the first one, decode forward to the last.
    Written here rather than calling lerobot's `decode_video_frames_pyav`, which keeps every decoded frame
    (400 frames of 480x640 are 370 MB) and matches by time tolerance instead of frame index."""
    import av

    with av.open(source) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # frame threads inside the codec; one episode per worker process
        fps = float(stream.average_rate or stream.guessed_rate)
        wanted = [round(ts * fps) for ts in timestamps]
        slots: dict[int, list[int]] = {}
        for slot, index in enumerate(wanted):
            slots.setdefault(index, []).append(slot)
        first, last = min(wanted), max(wanted)
        container.seek(int(first / fps / stream.time_base), stream=stream, backward=True, any_frame=False)
        out = torch.empty((len(wanted), 3, stream.height, stream.width), dtype=torch.uint8)
        index = -1  # no frame decoded at all
        for frame in container.decode(stream):
            index = round(float(frame.time) * fps) if frame.time is not None else -1
            for slot in slots.pop(index, ()):
                out[slot] = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)
            if index >= last:
                break
    if slots:
        raise DataError(f"frames {sorted(slots)[:5]} are missing from the video (it ends at frame {index})")
    return out


_FRAME_READERS: dict[str, FrameReader] = {"torchcodec": _frames_torchcodec, "pyav": _frames_pyav}


def resolve_video_backend(backend: str = "auto") -> str:
    """`auto` -> "torchcodec" when it loads (it needs FFmpeg's shared libraries on the system), else "pyav"."""
    if backend != "auto":
        return backend
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401 - loading it is the check
    except (ImportError, OSError, RuntimeError) as error:
        log.warning("torchcodec cannot load (%s): decoding video with PyAV", str(error).splitlines()[0][:200])
        return "pyav"
    return "torchcodec"


# -- the buffer ----------------------------------------------------------------------------------------------
def buffer_bytes(settings: DataSettings, device: torch.device) -> int:
    """The frame buffer's byte bound: `settings.buffer_bytes`, else a share of the GPU's free memory, else 8 GiB."""
    if settings.buffer_bytes is not None:
        return settings.buffer_bytes
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * settings.buffer_share)
    return 8 << 30


class _Arena:
    """Preallocated per-frame tensors on one device, filled as a ring: episodes are contiguous slices and a
    new episode overwrites (evicts) the oldest ones. Grows by doubling up to `bound` frames before the first
    wrap, so small datasets do not reserve the whole bound.
    """

    def __init__(
        self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], bound: int, device: torch.device
    ) -> None:
        self.shapes, self.bound, self.device = shapes, bound, device
        self.capacity, self.write = 0, 0
        self.tensors: dict[str, torch.Tensor] = {}
        self.last = torch.empty(0, dtype=torch.long, device=device)  # per slot: the slot of its episode's last frame
        self.slots: dict[tuple[str, int], tuple[int, int]] = {}  # episode key -> (start, length), insertion order

    def grows(self, length: int) -> bool:
        """Whether placing an episode of `length` frames reallocates the arena."""
        return self.write + length > self.capacity and self.capacity < self.bound

    def place(self, key: tuple[str, int], length: int, hint: int) -> tuple[int, list[tuple[str, int]]]:
        """Reserve `length` slots for `key`; returns the start and the episodes evicted for it."""
        if length > self.bound:
            raise DataError(
                f"episode {key} has {length} frames, more than the buffer holds ({self.bound}); "
                "raise buffer_frames/buffer_bytes"
            )
        if self.grows(length):
            self._grow(min(self.bound, max(2 * self.capacity, self.write + length, min(hint, self.bound))))
        if self.write + length > self.capacity:
            self.write = 0
        start, end = self.write, self.write + length
        evicted = [k for k, (s, n) in self.slots.items() if s < end and s + n > start]
        for k in evicted:
            del self.slots[k]
        self.slots[key] = (start, length)
        self.write = end
        return start, evicted

    def _grow(self, capacity: int) -> None:
        new = {
            k: torch.empty((capacity, *shape), dtype=dtype, device=self.device)
            for k, (shape, dtype) in self.shapes.items()
        }
        last = torch.zeros(capacity, dtype=torch.long, device=self.device)
        # Growth happens only before the first wrap, so every buffered frame lies in [0, write).
        for k, t in self.tensors.items():
            new[k][: self.write] = t[: self.write]
        last[: self.write] = self.last[: self.write]
        self.tensors, self.last, self.capacity = new, last, capacity

    def fill(self, start: int, episode: dict[str, torch.Tensor]) -> None:
        length = len(episode[ACTION_KEY])
        for k, t in episode.items():
            self.tensors[k][start : start + length].copy_(t, non_blocking=False)
        self.last[start : start + length] = start + length - 1


@dataclass
class _View:
    """What `next_batch` samples from: buffered episodes in insertion order (the canonical order, so a
    rebuilt buffer samples the same frames wherever the episodes landed in the arena).

    The background thread publishes plain lists; the trainer's thread turns them into device tensors on its
    own stream at the next batch (an async copy from pinned memory), so publishing never waits for the GPU.
    """

    keys: list[tuple[str, int]] = field(default_factory=list)
    start_list: list[int] = field(default_factory=list)  # arena slot of each episode's first frame
    offset_list: list[int] = field(default_factory=lambda: [0])  # cumulative frame counts, [0, n0, n0+n1, ...]
    starts: torch.Tensor | None = None
    offsets: torch.Tensor | None = None

    @property
    def total(self) -> int:
        return self.offset_list[-1]

    def materialize(self, device: torch.device) -> None:
        def put(values: list[int]) -> torch.Tensor:
            t = torch.tensor(values, dtype=torch.long)
            return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t

        if self.starts is None:
            self.starts, self.offsets = put(self.start_list), put(self.offset_list)


# -- the sampler ---------------------------------------------------------------------------------------------
class StreamingSampler:
    """Seeded, resumable batches of ACT training samples streamed from one or more bucket datasets.

    Rank `rank` of `world_size` takes episode i of the d-th dataset when (i + d) % world_size == rank: disjoint,
    balanced, and stable as episodes are appended. Decode order is a seeded permutation per pass over the
    share; a new pass starts (evicting the oldest episodes) only when the share does not fit the buffer.

    Determinism: batches are a function of the generator state and the buffer composition (episodes and their
    insertion order). When the buffer holds the rank's whole share and no new episodes arrive (call
    `wait_ready()` first), the batch sequence is bit-for-bit fixed by the seed, and `load_state_dict` resumes it
    bit-for-bit. While streaming (share larger than the buffer, or live episodes arriving), which episodes are
    buffered at a given step depends on decode timing: a resumed run starts from the saved composition (the first
    `next_batch` after `load_state_dict` waits for it) and is statistically, not bitwise, the same afterwards.
    Sequences are per device type: CPU and CUDA generators draw differently from the same seed. Results are
    buffered strictly in decode-job order (a slow episode holds back later ones) so that the insertion order,
    and with it the sampling, never depends on which worker finished first.

    Raises (on construction):
        NotFound: a dataset URL holds no committed dataset.
        DatasetMismatch: datasets differ in features or fps, or lack `observation.state`/`action`.
    """

    def __init__(
        self,
        client: BucketClient,
        dataset_urls: list[BucketUrl],
        settings: DataSettings | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not dataset_urls:
            raise ValueError("StreamingSampler needs at least one dataset URL")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.settings = s = settings or DataSettings()
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(s.device)
        self.sources = [DatasetSource(client, url) for url in dataset_urls]
        self._check_features()
        first = self.sources[0]
        self.fps, self.video_keys, self.stats = first.fps, first.video_keys, _combined_stats(self.sources)
        # What the sampler streams, and so what the policy may read (other features, e.g. an environment state,
        # would make ACT expect an input that no batch carries).
        self.features = {k: v for k, v in first.features.items() if k in (*first.video_keys, STATE_KEY, ACTION_KEY)}
        shapes = {k: ((3, *first.features[k]["shape"][:2]), torch.uint8) for k in self.video_keys}
        shapes[STATE_KEY] = ((first.features[STATE_KEY]["shape"][0],), torch.float32)
        shapes[ACTION_KEY] = ((first.features[ACTION_KEY]["shape"][0],), torch.float32)
        frame_bytes = (
            sum(torch.Size(sh).numel() * torch.empty(0, dtype=dt).element_size() for sh, dt in shapes.values()) + 8
        )
        self.arena = _Arena(shapes, s.buffer_frames or max(1, buffer_bytes(s, self.device) // frame_bytes), self.device)

        self.wait_s = 0.0  # seconds spent inside next_batch: what the trainer loses to data, blocked or not
        self.blocked_s = 0.0  # the part of wait_s spent blocked on an empty (or restoring) buffer
        self.batches = 0
        self._lock = threading.RLock()
        self._ready = threading.Condition(self._lock)
        self._known: dict[tuple[str, int], EpisodeRef] = {}
        self._queue: deque[tuple[str, int]] = deque()  # episodes to decode next, in order
        self._pass = 0
        self._seq = 0  # next job number; results are buffered strictly in job order
        self._next_ingest = 0
        self._jobs_by_seq: dict[int, tuple[str, int]] = {}
        self._refresh_lock = threading.Lock()
        self._pending: dict[int, tuple[dict | None, str | None]] = {}
        self._error: str | None = None
        self._view = _View()
        self._generation = 0  # bumped by load_state_dict: an ingest in progress across it is dropped
        self._restore: list[tuple[str, int]] = []  # after load_state_dict: the composition to rebuild first
        self._last_refresh = time.monotonic()
        self._generator = torch.Generator(device=self.device).manual_seed(s.seed)
        self._chunk = torch.arange(s.chunk_size, device=self.device)
        self._batch_done: torch.cuda.Event | None = None
        self._gpu_marks: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = (
            deque()
        )  # (start, end) of each batch's gathers
        self._gpu_s = 0.0
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        for d, source in enumerate(self.sources):
            self._add(source.episodes, d)
            if not source.episodes:
                log.warning("%s holds no committed episode yet: batches wait for the first one", source.url)
        if not self._known and s.refresh_every_s <= 0:  # nothing to sample, and nothing will ever come
            total = sum(len(src.episodes) for src in self.sources)
            raise ValueError(
                f"rank {rank} of {world_size} has no episode to train on ({total} in the datasets) and "
                "refresh is off: use fewer ranks, more episodes, or refresh_every_s > 0"
            )
        self.video_backend = resolve_video_backend(s.video_backend)
        ctx = mp.get_context("spawn")  # fork would copy CUDA state and the caller's threads
        # The workers' scratch lives under one folder of ours: close() removes it even after terminating a worker
        # (SIGTERM skips the worker's own cleanup).
        self._scratch = tempfile.mkdtemp(prefix="robotloop-decode-")
        self._jobs, self._results = ctx.Queue(), ctx.Queue()
        cache = (str(client.cache.root), client.cache.max_bytes) if client.cache else None
        self._workers = [
            ctx.Process(
                target=_decode_worker,
                args=(
                    client.endpoint,
                    client.token,
                    cache,
                    s.retries,
                    self.video_backend,
                    self._jobs,
                    self._results,
                    self._scratch,
                    os.getpid(),
                ),
                daemon=True,
                name=f"robotloop-decode-{i}",
            )
            for i in range(max(1, s.decode_workers))
        ]
        for w in self._workers:
            w.start()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="robotloop-data", daemon=True)
        self._thread.start()

    # -- public ------------------------------------------------------------------------------------------------
    def next_batch(self, batch_size: int) -> dict[str, torch.Tensor]:
        """A batch sampled uniformly over buffered frames, on the sampler's device.

        Keys: `observation.images.<cam>` uint8 [B,3,H,W], `observation.state` float32 [B,S], `action` float32
        [B,chunk,A] (actions t..t+chunk-1 of the frame's episode; past its end the last action repeats, as
        lerobot's `delta_timestamps` clamp) and `action_is_pad` bool [B,chunk]. Blocks only while the buffer is
        empty (or, after `load_state_dict`, until the saved composition is rebuilt); that time adds to `blocked_s`,
        and all time spent in here to `wait_s`. On CUDA the gathers are queued on the caller's current stream.

        Raises:
            DataError: an episode failed to download or decode after retries, or the sampler is closed.
        """
        t0 = time.perf_counter()
        with self._lock:
            if self._restore or self._view.total == 0:
                self._ready.wait_for(
                    lambda: self._error or self._closed.is_set() or (not self._restore and self._view.total > 0)
                )
                self.blocked_s += time.perf_counter() - t0
            self._raise_if_failed()
            view, arena = self._view, self.arena
            view.materialize(self.device)
            start = None
            if self._stream is not None:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            u = torch.randint(view.total, (batch_size,), generator=self._generator, device=self.device)
            episode = torch.searchsorted(view.offsets, u, right=True) - 1
            slot = view.starts[episode] + (u - view.offsets[episode])
            last = arena.last[slot]
            ahead = slot[:, None] + self._chunk
            batch = {k: arena.tensors[k][slot] for k in self.video_keys}
            batch[STATE_KEY] = arena.tensors[STATE_KEY][slot]
            batch[ACTION_KEY] = arena.tensors[ACTION_KEY][torch.minimum(ahead, last[:, None])]
            batch["action_is_pad"] = ahead > last[:, None]
            if start is not None:  # the ingest stream must not overwrite slots these gathers still read
                self._batch_done = torch.cuda.Event(enable_timing=True)
                self._batch_done.record()
                self._gpu_marks.append((start, self._batch_done))
                if len(self._gpu_marks) > 1024:  # nobody reads gpu_s: fold finished batches in, keep the queue short
                    self._fold_gpu_marks()
            self.batches += 1
        self.wait_s += time.perf_counter() - t0
        return batch

    @property
    def gpu_s(self) -> float:
        """GPU seconds spent on sampling so far (CUDA; 0 on CPU): from each batch's first gather to its last, so
        a GPU left idle while the host prepares a batch counts too. Counts batches the GPU has finished; never
        blocks. With `blocked_s` it says what the data path costs the GPU, which `wait_s` (host time) cannot
        when the host runs ahead of a busy GPU and waits on the launch queue inside `next_batch`."""
        self._fold_gpu_marks()
        return self._gpu_s

    def _fold_gpu_marks(self) -> None:
        while self._gpu_marks and self._gpu_marks[0][1].query():
            start, end = self._gpu_marks.popleft()
            self._gpu_s += start.elapsed_time(end) / 1e3

    def wait_ready(self, timeout_s: float = 600.0, min_frames: int | None = None) -> None:
        """Block until the buffer holds `min_frames` frames, or (None) every known episode of this rank's share
        that fits the buffer. Use it before a run that must be bit-for-bit reproducible.

        Raises:
            TimeoutError: not reached in `timeout_s`.
            DataError: an episode failed.
        """

        def done() -> bool:
            if self._error or self._closed.is_set():
                return True
            if min_frames is not None:
                return self._view.total >= min_frames
            if self._restore:
                return False
            if self._share_frames() <= self.arena.bound:
                return set(self._view.keys) == set(self._known)
            longest = max(e.length for e in self._known.values())
            return self._view.total >= self.arena.bound - longest

        with self._lock:
            t0 = time.perf_counter()
            ok = self._ready.wait_for(done, timeout_s)
            self.blocked_s += time.perf_counter() - t0
            self.wait_s += time.perf_counter() - t0
            self._raise_if_failed()
            if not ok:
                raise TimeoutError(f"buffer holds {self._view.total} frames after {timeout_s} s")

    def refresh(self) -> int:
        """Look for episodes committed since the last look (the live loop); schedule them first. Returns how many
        of them are this rank's.
        """
        new = 0
        with self._refresh_lock:  # the data thread and load_state_dict both refresh
            for d, source in enumerate(self.sources):
                found = source.refresh()
                with self._lock:
                    new += self._add(found, d, front=True)
            self._last_refresh = time.monotonic()
        return new

    def episodes(self, all_ranks: bool = False) -> list[dict]:
        """Lineage: this rank's known episodes (or, `all_ranks`, every rank's) with their files and Xet hashes."""
        with self._lock:
            known = [e for source in self.sources for e in source.episodes] if all_ranks else self._known.values()
            refs = sorted(known, key=lambda e: (e.dataset, e.index))
        out = []
        for e in refs:
            files = [{"url": e.data.url, "xet_hash": e.data.xet_hash}]
            files += [{"url": f.url, "xet_hash": f.xet_hash, "video_key": k} for k, (f, _) in e.videos.items()]
            out.append({"dataset": e.dataset, "episode_index": e.index, "length": e.length, "files": files})
        return out

    @property
    def buffered_episodes(self) -> list[tuple[str, int]]:
        """(dataset URL, episode index) of the buffered episodes, oldest first."""
        with self._lock:
            return list(self._view.keys)

    @property
    def buffered_frames(self) -> int:
        return self._view.total

    def state_dict(self) -> dict:
        """Everything needed to resume sampling: generator state, known episodes, decode schedule, buffer
        composition. Plain Python and one uint8 tensor; safe for `torch.save(weights_only=True)`.
        """
        with self._lock:
            buffered = set(self._view.keys)
            # Episodes being decoded (or decoded, waiting their turn) are not buffered yet: they go first in the
            # saved schedule, or a resumed run would never decode them again.
            in_flight = [k for _, k in sorted(self._jobs_by_seq.items()) if k not in buffered]
            return {
                "generator": self._generator.get_state(),
                "known": [list(k) for k in self._known],
                "buffered": [list(k) for k in self._view.keys],
                "queue": [list(k) for k in [*in_flight, *self._queue]],
                "pass": self._pass,
                "batches": self.batches,
                "world": [self.rank, self.world_size, self.settings.seed],
            }

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()`: the saved composition is decoded again (in its order) before anything
        else, and the first `next_batch` waits for it.

        Raises:
            ValueError: the state is from another rank/world size/seed, or names episodes no longer in the
                datasets (e.g. a dataset was rewritten).
        """
        if list(state["world"]) != [self.rank, self.world_size, self.settings.seed]:
            raise ValueError(
                f"state is for rank/world/seed {state['world']}, "
                f"this sampler is {[self.rank, self.world_size, self.settings.seed]}"
            )
        for _ in range(2):  # the state may name episodes committed after this sampler last looked
            missing = [tuple(k) for k in state["known"] if tuple(k) not in self._known]
            if not missing:
                break
            self.refresh()
        if missing:
            raise ValueError(f"state names episodes these datasets do not hold: {missing[:5]}")
        with self._lock:
            self._generator.set_state(state["generator"])
            self._pass, self.batches = state["pass"], state["batches"]
            restore = [tuple(k) for k in state["buffered"]]
            saved_known = {tuple(k) for k in state["known"]}
            later = [k for k in self._known if k not in saved_known]  # committed after the save
            rest = [tuple(k) for k in state["queue"] if tuple(k) not in set(restore)]
            # Drop what is buffered or in flight now; the saved composition is rebuilt from scratch, in its
            # order, then new episodes, then the saved schedule.
            self._generation += 1
            self._view = _View()
            self.arena.slots.clear()
            self.arena.write = 0
            self._next_ingest = self._seq  # results of jobs submitted before now are stale
            self._pending.clear()
            self._jobs_by_seq.clear()  # their keys are not busy any more: _receive drops stale results by seq
            self._restore = list(restore)
            self._queue = deque(restore + later + rest)
            self._ready.notify_all()

    def close(self) -> None:
        """Stop the background thread and the decode workers. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            self._ready.notify_all()
        self._thread.join(timeout=10)
        while True:  # jobs not started yet: a worker would decode them before it reads its stop
            try:
                self._jobs.get_nowait()
            except (queue.Empty, OSError, ValueError):
                break
        for _ in self._workers:
            self._jobs.put(None)
        for w in self._workers:
            w.join(timeout=5)
            if w.is_alive():
                w.terminate()
        for q in (self._jobs, self._results):
            q.cancel_join_thread()
            q.close()
        shutil.rmtree(self._scratch, ignore_errors=True)
        with self._lock:  # the frame buffer (GPU memory on CUDA) goes now, not when the last reference does
            self.arena.tensors, self._view, self._pending = {}, _View(), {}

    def __enter__(self) -> StreamingSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if hasattr(self, "_thread"):
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: queues may already be gone
            pass

    # -- internals ----------------------------------------------------------------------------------------------
    def _check_features(self) -> None:
        def signature(src: DatasetSource) -> dict:
            return {k: (v["dtype"], list(v["shape"])) for k, v in src.features.items()}

        first = self.sources[0]
        for key in (STATE_KEY, ACTION_KEY):
            if key not in first.features:
                raise DatasetMismatch(f"{first.url} has no '{key}' feature; ACT training needs it")
        for src in self.sources[1:]:
            if signature(src) != signature(first) or src.fps != first.fps:
                raise DatasetMismatch(
                    f"{src.url} differs from {first.url}: features {signature(src)} at {src.fps} fps vs "
                    f"{signature(first)} at {first.fps} fps. Train on datasets recorded with one DatasetSpec."
                )

    def _add(self, refs: list[EpisodeRef], d: int, front: bool = False) -> int:
        mine = [r for r in refs if (r.index + d) % self.world_size == self.rank and r.key not in self._known]
        for r in mine:
            self._known[r.key] = r
        keys = [r.key for r in mine]
        if front:  # fresh episodes first: the live loop wants the newest data in the buffer soon
            self._queue.extendleft(reversed(keys))
        else:
            self._queue.extend(self._permuted(keys))
        return len(mine)

    def _permuted(self, keys: list[tuple[str, int]]) -> list[tuple[str, int]]:
        g = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + self._pass)
        return [keys[i] for i in torch.randperm(len(keys), generator=g).tolist()]

    def _raise_if_failed(self) -> None:
        if self._error:
            raise DataError(self._error)
        if self._closed.is_set():
            raise DataError("the sampler is closed")

    def _run(self) -> None:
        """Background thread: submit decode jobs, buffer results in job order, refresh periodically."""
        limit = self.settings.max_inflight or 2 * len(self._workers)
        while not self._closed.is_set():
            try:
                with self._lock:
                    while self._seq - self._next_ingest < limit and (key := self._next_job()) is not None:
                        self._jobs_by_seq[self._seq] = key
                        self._jobs.put((self._seq, self._known[key], self.fps))
                        self._seq += 1
                try:
                    seq, episode, error = self._results.get(timeout=0.05)
                except queue.Empty:
                    seq = None
                if seq is not None:
                    self._receive(seq, episode, error)
                elif dead := [w.name for w in self._workers if not w.is_alive()]:
                    raise DataError(f"decode worker(s) {dead} died (out of memory?); see their stderr")
                every = self.settings.refresh_every_s
                if every > 0 and time.monotonic() - self._last_refresh > every:
                    try:
                        self.refresh()
                    except (StorageError, OSError) as error:  # a flaky listing must not stop training
                        log.warning("refresh failed, will retry: %s", error)
                        self._last_refresh = time.monotonic()
            except Exception:  # noqa: BLE001 - surfaced to the trainer by next_batch
                with self._lock:
                    self._error = f"data thread failed:\n{traceback.format_exc()}"
                    self._ready.notify_all()
                return

    def _next_job(self) -> tuple[str, int] | None:
        busy = set(self._jobs_by_seq.values()) | set(self._view.keys)
        while self._queue:
            key = self._queue.popleft()
            if key not in busy or key in self._restore:
                return key
        fits = sum(e.length for e in self._known.values()) <= self.arena.bound
        rest = [k for k in self._known if k not in busy]
        if fits or not rest:
            return None  # everything is (or is about to be) buffered: nothing to stream
        self._pass += 1
        self._queue.extend(self._permuted(sorted(rest)))
        return self._queue.popleft()

    def _receive(self, seq: int, episode: dict | None, error: str | None) -> None:
        with self._lock:
            if seq < self._next_ingest:  # from before a load_state_dict: stale
                self._jobs_by_seq.pop(seq, None)
                return
            self._pending[seq] = (episode, error)
        while True:
            with self._lock:
                if self._next_ingest not in self._pending:
                    return
                seq = self._next_ingest
                episode, error = self._pending.pop(seq)
                key = self._jobs_by_seq.pop(seq)
                if error:
                    self._error = error
                    self._ready.notify_all()
                    return
                done, generation = self._batch_done, self._generation
                length = len(episode[ACTION_KEY])
                if self.arena.grows(length):  # a growth copies the arena: after, never under, the trainer's gathers
                    with self._on_side_stream(done):
                        start, _ = self.arena.place(key, length, self._share_frames())
                else:  # the usual case: only bookkeeping under the lock, the trainer is never held up by the GPU
                    start, _ = self.arena.place(key, length, self._share_frames())
                self._publish(exclude=key)  # evicted slots and the new one leave the view before they change
            self._fill(start, episode, done)
            with self._lock:
                if generation != self._generation:
                    return
                self._next_ingest = seq + 1
                if self._restore and self._restore[0] == key:
                    self._restore.pop(0)
                self._publish()
                self._ready.notify_all()

    def _share_frames(self) -> int:
        return sum(e.length for e in self._known.values())

    def _fill(self, start: int, episode: dict[str, torch.Tensor], done: torch.cuda.Event | None) -> None:
        # Outside the lock: the trainer keeps sampling the other episodes while this one is copied in.
        with self._on_side_stream(done):
            pinned = self._stream is not None
            self.arena.fill(start, {k: v.pin_memory() if pinned else v for k, v in episode.items()})

    @contextmanager
    def _on_side_stream(self, done: torch.cuda.Event | None) -> Iterator[None]:
        """On CUDA: run the block's copies on the ingest stream, after the last batch's gathers (they may read
        slots about to be overwritten), and wait for them. The trainer's stream never waits on ingest."""
        if self._stream is None:
            yield
            return
        with torch.cuda.stream(self._stream):
            if done is not None:
                self._stream.wait_event(done)
            yield
        self._stream.synchronize()

    def _publish(self, exclude: tuple[str, int] | None = None) -> None:
        keys = [k for k in self.arena.slots if k != exclude]
        offsets = [0]
        for k in keys:
            offsets.append(offsets[-1] + self.arena.slots[k][1])
        self._view = _View(keys, [self.arena.slots[k][0] for k in keys], offsets)
