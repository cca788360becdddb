"""Decoding episodes: a pool of worker processes, and the order their results enter the buffer.

Each episode's data parquet and mp4 are fetched on demand by the workers:

- a file that belongs to one episode only (what `robotloop.capture` writes: one parquet + one mp4 per
  committed episode) is downloaded through the client's content-addressed read cache: one request, and a
  later pass over the dataset reads it from local disk;
- a file shared by many episodes (lerobot's writer packs episodes up to 100/200 MB a file) is never
  downloaded: the parquet rows and the video frames of the episode are read with ranged requests
  (`BucketClient.open`), only the byte ranges the decoders ask for.

Workers decode every frame of an episode once (torchcodec, or PyAV where FFmpeg's libraries are missing;
uint8 [T,3,H,W]) and hand the tensors back through shared memory (torch.multiprocessing: local IPC only,
nothing crosses a network).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.multiprocessing as mp

from ...features import ACTION_KEY, STATE_KEY
from ...storage import BucketClient, BucketUrl
from .catalog import EpisodeKey, EpisodeRef, FileRef
from .errors import DataError

log = logging.getLogger(__name__)


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
    from ...storage.cache import ReadCache
    from ...workers import start_worker

    start_worker(parent_pid)  # a trainer killed with SIGKILL takes its decoders with it
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
    """Rows and every video frame of one episode: state/action float32 [T,D], frames uint8 [T,3,H,W], and the
    columns that weigh its frames (`ep.flag_columns`: next.success, intervention) bool [T]."""
    columns = [STATE_KEY, ACTION_KEY, "index", "timestamp", *ep.flag_columns]
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
    out |= {key: _flags(table[key]) for key in ep.flag_columns}
    timestamps = table["timestamp"].to_numpy()
    for key, (file, from_ts) in ep.videos.items():
        out[key] = _decode_video(client, file, [from_ts + float(ts) for ts in timestamps], scratch, frames_at)
    return out


def _matrix(column: pa.ChunkedArray) -> torch.Tensor:
    flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return torch.from_numpy(flat.reshape(len(column), -1).astype("float32"))  # a copy: arrow buffers are read-only


def _flags(column: pa.ChunkedArray) -> torch.Tensor:
    """A bool column (lerobot stores a bool of shape (1,) as a scalar; a list of one is read alike) as bool [T]."""
    flat = column.combine_chunks()
    if pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type):
        flat = flat.flatten()
    values = flat.to_numpy(zero_copy_only=False).astype(bool)
    return torch.from_numpy(values.reshape(len(column), -1).any(axis=1))


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
        log.warning("torchcodec cannot load FFmpeg's shared libraries here: decoding video with PyAV (--debug: why)")
        log.debug("torchcodec: %s", error)
        return "pyav"
    return "torchcodec"


class DecodePool:
    """The decode worker processes and the queues to and from them; `close()` ends them and removes their files.

    Workers are spawned, not forked (fork would copy CUDA state and the caller's threads), die with this process
    (a trainer killed with SIGKILL takes its decoders with it), open their own bucket client (nothing is
    shared), and decode one episode at a time, retrying `retries` times (reads cross a network). An episode
    that still fails comes back as an error message, which the sampler raises as `DataError`. Their scratch
    files live under one folder of ours, so that `close()` removes them even after terminating a worker
    (SIGTERM skips the worker's own cleanup).
    """

    def __init__(self, client: BucketClient, workers: int, retries: int, backend: str) -> None:
        ctx = mp.get_context("spawn")
        self.scratch = tempfile.mkdtemp(prefix="robotloop-decode-")
        self._jobs, self._results = ctx.Queue(), ctx.Queue()
        cache = (str(client.cache.root), client.cache.max_bytes) if client.cache else None
        self.workers = [
            ctx.Process(
                target=_decode_worker,
                args=(
                    client.endpoint,
                    client.token,
                    cache,
                    retries,
                    backend,
                    self._jobs,
                    self._results,
                    self.scratch,
                    os.getpid(),
                ),
                daemon=True,
                name=f"robotloop-decode-{i}",
            )
            for i in range(max(1, workers))
        ]
        for w in self.workers:
            w.start()

    def submit(self, seq: int, episode: EpisodeRef, fps: int) -> None:
        """Queue job `seq`: decode `episode`; its result comes back from `result()` with the same number."""
        self._jobs.put((seq, episode, fps))

    def result(self, timeout_s: float) -> tuple[int, dict[str, torch.Tensor] | None, str | None] | None:
        """(job number, decoded tensors, None) or (job number, None, error message); None after `timeout_s`."""
        try:
            return self._results.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def dead(self) -> list[str]:
        """Names of the workers that exited (out of memory, killed): the pool cannot recover them."""
        return [w.name for w in self.workers if not w.is_alive()]

    def close(self) -> None:
        """Stop the workers (terminating those that do not stop within 5 s) and remove their scratch files."""
        while True:  # jobs not started yet: a worker would decode them before it reads its stop
            try:
                self._jobs.get_nowait()
            except (queue.Empty, OSError, ValueError):
                break
        for _ in self.workers:
            self._jobs.put(None)
        for w in self.workers:
            w.join(timeout=5)
            if w.is_alive():
                w.terminate()
        for q in (self._jobs, self._results):
            q.cancel_join_thread()
            q.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


class DecodeOrder:
    """Numbers decode jobs and releases their results strictly in job order.

    Workers finish in any order; buffering results in job order (a slow episode holds back later ones) keeps the
    buffer's insertion order, and with it the sampling, independent of which worker finished first. `drop()`
    makes every job submitted so far stale (a resume rebuilds the buffer from scratch): their results are
    discarded as they arrive.

    Not thread-safe: the sampler calls it under its lock.
    """

    def __init__(self) -> None:
        self.next_seq = 0  # the next job's number
        self.next_ingest = 0  # the job whose result enters the buffer next; earlier ones are done or stale
        self.in_flight: dict[int, EpisodeKey] = {}  # job -> its episode, from submission until buffered
        self._pending: dict[int, tuple[dict | None, str | None]] = {}  # results that wait for an earlier job's

    def room(self, limit: int) -> bool:
        """Whether fewer than `limit` jobs are submitted and not yet buffered."""
        return self.next_seq - self.next_ingest < limit

    def number(self, key: EpisodeKey) -> int:
        """A number for a new job decoding `key`; the episode counts as in flight until its result is taken."""
        seq = self.next_seq
        self.in_flight[seq] = key
        self.next_seq += 1
        return seq

    def busy(self) -> set[EpisodeKey]:
        return set(self.in_flight.values())

    def in_flight_keys(self) -> list[EpisodeKey]:
        """Episodes in flight, in job order."""
        return [k for _, k in sorted(self.in_flight.items())]

    def hold(self, seq: int, episode: dict | None, error: str | None) -> bool:
        """Keep job `seq`'s result until its turn; False (and it is dropped) when the job is stale."""
        if seq < self.next_ingest:  # from before a drop(): stale
            self.in_flight.pop(seq, None)
            return False
        self._pending[seq] = (episode, error)
        return True

    def take_next(self) -> tuple[int, EpisodeKey, dict | None, str | None] | None:
        """The result whose turn it is, as (job, episode key, tensors, error), or None while it has not arrived.
        The job stays the next to ingest until `ingested(job)`: it still counts against `room`."""
        if self.next_ingest not in self._pending:
            return None
        seq = self.next_ingest
        episode, error = self._pending.pop(seq)
        return seq, self.in_flight.pop(seq), episode, error

    def ingested(self, seq: int) -> None:
        self.next_ingest = seq + 1

    def drop(self) -> None:
        """Make every job submitted so far stale, and forget the results held for them."""
        self.next_ingest = self.next_seq
        self._pending.clear()
        self.in_flight.clear()  # their keys are not busy any more: hold() drops stale results by number

    def discard_results(self) -> None:
        """Free the results held (shared memory with the workers) without touching the numbering."""
        self._pending.clear()
