"""The background thread that keeps the frame buffer fed: schedule, decode, reorder, copy in, publish.

`BufferFeed` owns everything the trainer's thread and the data thread share (the published `BufferView`, the
first error, the lock that guards them) and the pieces only the data thread drives: the decode schedule, the
decode pool, the decode order and the ingest stream.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback

from ...features import ACTION_KEY
from ...storage import BucketClient, StorageError
from .arena import BufferView, FrameArena, GatherClock, IngestStream
from .catalog import DecodeSchedule, EpisodeCatalog, EpisodeKey, EpisodeRef
from .decode import DecodeOrder, DecodePool
from .errors import DataError
from .settings import WEIGHT_KEY, DataSettings
from .weighting import Weighting

log = logging.getLogger(__name__)


class BufferFeed:
    """Decodes the catalog's episodes ahead, in schedule order, into the arena, and publishes what is buffered.

    The data thread submits decode jobs (at most `max_inflight` not yet buffered), takes results strictly in job
    order, weighs each episode's frames (`Weighting`), places it in the arena and copies it in outside the lock,
    then publishes a new `view`; every `refresh_every_s` it refreshes the catalog. A failure (an episode that did
    not decode, a dead worker) is kept in `error` and ends the thread; the trainer's thread raises it
    (`raise_if_failed`).

    `lock` (with the condition `ready`, notified on every change) guards `view`, `error`, the catalog's `known`,
    the schedule, the decode order and the arena's slots; the sampler holds it to sample and to checkpoint.
    `_refresh_lock` only keeps two refreshes (the thread's, a resume's) from reading metadata at once.
    """

    def __init__(
        self,
        client: BucketClient,
        catalog: EpisodeCatalog,
        arena: FrameArena,
        clock: GatherClock,
        settings: DataSettings,
        weighting: Weighting,
    ) -> None:
        self.catalog, self.arena, self.settings, self._clock = catalog, arena, settings, clock
        self.lock = threading.RLock()
        self.ready = threading.Condition(self.lock)
        self._refresh_lock = threading.Lock()
        self.schedule = DecodeSchedule(settings.seed)
        self.order = DecodeOrder()
        self.weighting = weighting
        self.decoded_weights: dict[EpisodeKey, float] = {}  # every episode decoded so far -> its summed weight
        self.view = BufferView()
        self.error: str | None = None
        self._generation = 0  # bumped by restart(): an ingest in progress across it is dropped
        self._last_refresh = time.monotonic()
        self._ingest = IngestStream(arena.device)
        self._client = client
        self.closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, video_backend: str) -> None:
        """Start the decode workers (decoding with `video_backend`) and the data thread."""
        s = self.settings
        self.pool = DecodePool(self._client, s.decode_workers, s.retries, video_backend)
        self._thread = threading.Thread(target=self._run, name="robotloop-data", daemon=True)
        self._thread.start()

    def add(self, refs: list[EpisodeRef], d: int, fresh: bool = False) -> int:
        """Make this rank's episodes among `refs` (of the d-th dataset) known and schedule them; how many they are.
        Call under `lock`."""
        keys = self.catalog.take(refs, d)
        self.schedule.add(keys, fresh)  # fresh episodes first: the live loop wants the newest data in the buffer
        return len(keys)

    def refresh(self) -> int:
        """Look for episodes committed since the last look; schedule them first. Returns how many are this rank's."""
        new = 0
        with self._refresh_lock:  # the data thread and load_state_dict both refresh
            for d, source in enumerate(self.catalog.sources):
                found = source.refresh()
                with self.lock:
                    new += self.add(found, d, fresh=True)
            self._last_refresh = time.monotonic()
        return new

    def nothing_to_train(self) -> bool:
        """Whether every episode of this rank's is known to weigh 0 (dropped for it, or as decoded where its
        metadata could not say): no batch can ever be drawn from them. False while there is no episode at all (one
        may be committed). Call under `lock`."""
        known = self.catalog.known
        if not known:
            return bool(self.catalog.dropped)
        for key, ref in known.items():
            weight = self.decoded_weights.get(key, self.weighting.planned(ref))
            if weight is None or weight > 0:
                return False
        return True

    def raise_if_failed(self) -> None:
        """Raises DataError: the data thread failed (the message says why), or the feed is closed."""
        if self.error:
            raise DataError(self.error)
        if self.closed.is_set():
            raise DataError("the sampler is closed")

    def restart(self, restore: list[EpisodeKey], then: list[EpisodeKey]) -> None:
        """Resume: drop what is buffered or in flight now and rebuild the buffer from scratch: `restore` in its
        order (until it is rebuilt, `schedule.restore` is not empty), then `then`. Call under `lock`."""
        self._generation += 1
        self.view = BufferView()
        self.arena.clear()
        self.order.drop()  # results of jobs submitted before now are stale
        self.schedule.restart(restore, then)
        self.ready.notify_all()

    def close(self) -> None:
        """Stop the data thread and the decode workers, and free the buffer. Idempotent; nothing to do before
        `start()`."""
        if self.closed.is_set() or self._thread is None:
            return
        self.closed.set()
        with self.lock:
            self.ready.notify_all()
        self._thread.join(timeout=10)
        self.pool.close()
        with self.lock:  # the frame buffer (GPU memory on CUDA) goes now, not when the last reference does
            self.arena.free()
            self.view = BufferView()
            self.order.discard_results()

    # -- the data thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        """Submit decode jobs, buffer results in job order, refresh periodically."""
        limit = self.settings.max_inflight or 2 * len(self.pool.workers)
        while not self.closed.is_set():
            try:
                with self.lock:
                    while self.order.room(limit) and (key := self._next_job()) is not None:
                        self.pool.submit(self.order.number(key), self.catalog.known[key], self.catalog.fps)
                result = self.pool.result(timeout_s=0.05)
                if result is not None:
                    self._receive(*result)
                elif dead := self.pool.dead():
                    raise DataError(f"decode worker(s) {dead} died (out of memory?); see their stderr")
                every = self.settings.refresh_every_s
                if every > 0 and time.monotonic() - self._last_refresh > every:
                    try:
                        self.refresh()
                    except (StorageError, OSError) as error:  # a flaky listing must not stop training
                        log.warning("refresh failed, will retry: %s", error)
                        self._last_refresh = time.monotonic()
            except Exception:  # noqa: BLE001 - surfaced to the trainer by next_batch
                with self.lock:
                    self.error = f"data thread failed:\n{traceback.format_exc()}"
                    self.ready.notify_all()
                return

    def _next_job(self) -> EpisodeKey | None:
        busy = self.order.busy() | set(self.view.keys)
        return self.schedule.next(self.catalog.known, busy, self.arena.bound)

    def _receive(self, seq: int, episode: dict | None, error: str | None) -> None:
        """Take one worker result; buffer every result whose turn has come, each copied in outside the lock."""
        with self.lock:
            if not self.order.hold(seq, episode, error):
                return
        while True:
            with self.lock:
                turn = self.order.take_next()
                if turn is None:
                    return
                seq, key, episode, error = turn
                if error:
                    self.error = error
                    self.ready.notify_all()
                    return
                episode, weight = self._weighed(key, episode)
                done, generation = self._clock.last_done, self._generation
                length = len(episode[ACTION_KEY])
                share = self.catalog.share_frames()
                if self.arena.grows(length):  # a growth copies the arena: after, never under, the trainer's gathers
                    with self._ingest.after(done):
                        start, _ = self.arena.place(key, length, share, weight)
                else:  # the usual case: only bookkeeping under the lock, the trainer is never held up by the GPU
                    start, _ = self.arena.place(key, length, share, weight)
                self.view = self.arena.view(exclude=key)  # evicted slots and the new one leave it before they change
            self._ingest.fill(self.arena, start, episode, done)
            with self.lock:
                if generation != self._generation:
                    return
                self.order.ingested(seq)
                self.schedule.restored(key)
                self.view = self.arena.view()
                self.ready.notify_all()

    def _weighed(self, key: EpisodeKey, episode: dict) -> tuple[dict, float]:
        """The decoded episode as the arena holds it: its frames' weights in place of the columns they come from;
        and their sum."""
        ref = self.catalog.known[key]
        weights = self.weighting.frames(ref, episode)
        kept = {k: v for k, v in episode.items() if k not in ref.flag_columns}
        self.decoded_weights[key] = total = float(weights.double().sum())
        return {**kept, WEIGHT_KEY: weights}, total
