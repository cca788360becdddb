"""The sampler: seeded, resumable ACT batches sampled from the frame buffer on the device.

`StreamingSampler` composes the pieces of the data path: the `EpisodeCatalog` (what to train on), the
`FrameArena` (where decoded frames wait on the device) and the `BufferFeed` (the background thread that decodes
episodes in schedule order into the arena). What is left to it is the public API: `next_batch` (pure tensor
indexing on the device, behind a seeded generator), readiness, lineage, and the checkpoint state.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

import torch

from ...errors import BadValue
from ...features import ACTION_KEY, STATE_KEY
from ...storage import BucketClient, BucketUrl
from .arena import FrameArena, GatherClock, buffer_bytes, frame_bytes
from .catalog import EpisodeCatalog, EpisodeKey
from .decode import resolve_video_backend
from .errors import NotBuffered, NothingToTrain, StaleState
from .feed import BufferFeed
from .settings import WEIGHT_KEY, DataSettings
from .weighting import SourceFrames, Weighting

log = logging.getLogger(__name__)


class StreamingSampler:
    """Seeded, resumable batches of ACT training samples streamed from one or more bucket datasets.

    Each frame is drawn with probability proportional to its weight (`settings.weights`: demo, expert, autonomous
    frames of successful and of failed episodes, per dataset; `robotloop.train.weights`); a frame of weight 0 is
    never drawn, though a drawn frame's action chunk reads the frames after it whatever they weigh.

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

    Owns the sampling generator and the GPU events around each batch's gathers (`GatherClock`); the buffer's
    state is the feed's, read under the feed's lock.

    Raises (on construction):
        BadValue: no dataset URL, a rank outside the world, or no episode for this rank with refresh off.
        NotFound: a dataset URL holds no committed dataset.
        DatasetMismatch: datasets differ in cameras, state, action or fps, or lack `observation.state`/`action`.
        NothingToTrain (a BadInput): every frame of this rank's episodes weighs 0 (e.g. fleet data with no success
            and no expert frame, and no demos).
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
            raise BadValue("StreamingSampler needs at least one dataset URL")
        if not 0 <= rank < world_size:
            raise BadValue(f"rank {rank} is not in [0, {world_size})")
        self.settings = s = settings or DataSettings()
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(s.device)
        # An episode whose every frame weighs 0 (as its metadata says) is never decoded nor buffered.
        weighting = Weighting(s.weights)
        self.catalog = catalog = EpisodeCatalog(
            client, dataset_urls, rank, world_size, keep=lambda ref: weighting.planned(ref) != 0
        )
        self.sources, self.fps, self.video_keys = catalog.sources, catalog.fps, catalog.video_keys
        self.stats, self.features = catalog.stats, catalog.features
        shapes = catalog.frame_shapes() | {WEIGHT_KEY: ((), torch.float32)}
        bound = s.buffer_frames or max(1, buffer_bytes(s, self.device) // frame_bytes(shapes))
        self.arena = FrameArena(shapes, bound, self.device)

        self.wait_s = 0.0  # seconds spent inside next_batch: what the trainer loses to data, blocked or not
        self.blocked_s = 0.0  # the part of wait_s spent blocked on an empty (or restoring) buffer
        self.batches = 0
        self._generator = torch.Generator(device=self.device).manual_seed(s.seed)
        self._chunk = torch.arange(s.chunk_size, device=self.device)
        self._clock = GatherClock(self.device)
        self._feed = feed = BufferFeed(client, catalog, self.arena, self._clock, s, weighting)
        for d, source in enumerate(self.sources):
            feed.add(source.episodes, d)
            if not source.episodes:
                log.warning("%s holds no committed episode yet: batches wait for the first one", source.url)
        if feed.nothing_to_train():  # before any decode: training would learn nothing, or the failures
            raise self._nothing_to_train()
        if not catalog.known and s.refresh_every_s <= 0:  # nothing to sample, and nothing will ever come
            total = sum(len(src.episodes) for src in self.sources)
            raise BadValue(
                f"rank {rank} of {world_size} has no episode to train on ({total} in the datasets) and "
                "refresh is off: use fewer ranks, more episodes, or refresh_every_s > 0"
            )
        if rank == 0:
            self._say_what_weighs_nothing()
        self.video_backend = resolve_video_backend(s.video_backend)
        feed.start(self.video_backend)

    def _say_what_weighs_nothing(self) -> None:
        """A warning per dataset with frames that weigh 0; the fleet's datasets summed in one line (a round's
        ten would each say that the policy's own frames are left out, as the round's weights mean them to be)."""
        dropped = [src for src in self._source_frames(all_ranks=True) if src.dropped]
        fleet = [src for src in dropped if src.role == "fleet"]
        if len(fleet) > 1:
            dropped = [src for src in dropped if src.role != "fleet"] + [SourceFrames.summed(fleet)]
            for src in fleet:
                log.debug("%s, not trained on", src.describe())
        for src in dropped:
            log.warning("%s, not trained on", src.describe())

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
        feed = self._feed
        with feed.lock:
            if feed.schedule.restore or feed.view.weight <= 0:
                feed.ready.wait_for(
                    lambda: (
                        feed.error
                        or feed.closed.is_set()
                        or feed.nothing_to_train()
                        or (not feed.schedule.restore and feed.view.weight > 0)
                    )
                )
                self.blocked_s += time.perf_counter() - t0
            feed.raise_if_failed()
            if feed.view.weight <= 0:  # woken with nothing to draw: every episode turned out to weigh 0
                raise self._nothing_to_train()
            view, arena = feed.view, self.arena
            view.materialize(self.device, arena.tensors[WEIGHT_KEY])
            start = self._clock.start()
            # Inverse-CDF over the buffered frames' weights: O(batch log frames), no host sync.
            u = torch.rand(batch_size, generator=self._generator, device=self.device, dtype=torch.float64)
            frame = torch.searchsorted(view.cumulative, u * view.cumulative[-1], right=True)
            slot = view.slots[torch.minimum(frame, view.last_kept)]
            last = arena.last[slot]
            ahead = slot[:, None] + self._chunk
            batch = {k: arena.tensors[k][slot] for k in self.video_keys}
            batch[STATE_KEY] = arena.tensors[STATE_KEY][slot]
            batch[ACTION_KEY] = arena.tensors[ACTION_KEY][torch.minimum(ahead, last[:, None])]
            batch["action_is_pad"] = ahead > last[:, None]
            self._clock.end(start)  # the ingest stream must not overwrite slots these gathers still read
            self.batches += 1
        self.wait_s += time.perf_counter() - t0
        return batch

    @property
    def gpu_s(self) -> float:
        """GPU seconds spent on sampling so far (CUDA; 0 on CPU): from each batch's first gather to its last, so
        a GPU left idle while the host prepares a batch counts too. Counts batches the GPU has finished; never
        blocks. With `blocked_s` it says what the data path costs the GPU, which `wait_s` (host time) cannot
        when the host runs ahead of a busy GPU and waits on the launch queue inside `next_batch`."""
        return self._clock.gpu_s

    def wait_ready(self, timeout_s: float = 600.0, min_frames: int | None = None) -> None:
        """Block until the buffer holds `min_frames` frames, or (None) every known episode of this rank's share
        that fits the buffer. Use it before a run that must be bit-for-bit reproducible.

        Raises:
            NotBuffered (an Unavailable and a TimeoutError): not reached in `timeout_s`.
            DataError: an episode failed.
        """
        feed, known = self._feed, self.catalog.known

        def done() -> bool:
            if feed.error or feed.closed.is_set():
                return True
            if min_frames is not None:
                return feed.view.total >= min_frames
            if feed.schedule.restore:
                return False
            if self.catalog.share_frames() <= self.arena.bound:
                return set(feed.view.keys) == set(known)
            longest = max(e.length for e in known.values())
            return feed.view.total >= self.arena.bound - longest

        with feed.lock:
            t0 = time.perf_counter()
            ok = feed.ready.wait_for(done, timeout_s)
            self.blocked_s += time.perf_counter() - t0
            self.wait_s += time.perf_counter() - t0
            feed.raise_if_failed()
            if not ok:
                raise NotBuffered(f"buffer holds {feed.view.total} frames after {timeout_s} s")

    def frame_kinds(self, all_ranks: bool = False) -> list[dict]:
        """Per dataset, what this rank's episodes (or, `all_ranks`, every rank's) hold of each kind of frame and how
        many weigh 0, from the episodes' metadata (`robotloop.train.data.weighting.SourceFrames`)."""
        return [asdict(s) for s in self._source_frames(all_ranks)]

    def _source_frames(self, all_ranks: bool) -> list[SourceFrames]:
        with self._feed.lock:
            refs = self.catalog.refs(all_ranks, dropped=True)
        return self._feed.weighting.sources(refs)

    def _nothing_to_train(self) -> NothingToTrain:
        where = f"rank {self.rank} of {self.world_size}'s episodes: " if self.world_size > 1 else ""
        kinds = "; ".join(s.describe() for s in self._source_frames(all_ranks=False))
        return NothingToTrain(
            f"nothing to train on, every frame weighs 0: {where}{kinds}. Fleet data needs successful episodes or "
            "expert frames (takeovers, re-demonstrations): add the demos (--dataset), or weigh failed frames "
            "(--failed-weight)"
        )

    def refresh(self) -> int:
        """Look for episodes committed since the last look (the live loop); schedule them first. Returns how many
        of them are this rank's.
        """
        return self._feed.refresh()

    def episodes(self, all_ranks: bool = False) -> list[dict]:
        """Lineage: this rank's known episodes (or, `all_ranks`, every rank's) with their files and Xet hashes; not
        those dropped because their every frame weighs 0 (`frame_kinds` counts them)."""
        with self._feed.lock:
            refs = self.catalog.refs(all_ranks)
        return [e.lineage() for e in refs]

    @property
    def buffered_episodes(self) -> list[EpisodeKey]:
        """(dataset URL, episode index) of the buffered episodes, oldest first."""
        with self._feed.lock:
            return list(self._feed.view.keys)

    @property
    def buffered_frames(self) -> int:
        return self._feed.view.total

    def state_dict(self) -> dict:
        """Everything needed to resume sampling: generator state, known episodes, decode schedule, buffer
        composition. Plain Python and one uint8 tensor; safe for `torch.save(weights_only=True)`.
        """
        feed = self._feed
        with feed.lock:
            buffered = set(feed.view.keys)
            # Episodes being decoded (or decoded, waiting their turn) are not buffered yet: they go first in the
            # saved schedule, or a resumed run would never decode them again.
            in_flight = [k for k in feed.order.in_flight_keys() if k not in buffered]
            return {
                "generator": self._generator.get_state(),
                "known": [list(k) for k in self.catalog.known],
                "buffered": [list(k) for k in feed.view.keys],
                "queue": [list(k) for k in [*in_flight, *feed.schedule.queue]],
                "pass": feed.schedule.passes,
                "batches": self.batches,
                "world": [self.rank, self.world_size, self.settings.seed],
            }

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()`: the saved composition is decoded again (in its order) before anything
        else, and the first `next_batch` waits for it.

        Raises:
            BadValue: the state is from another rank/world size/seed. StaleState (a NotFound): it names episodes
                no longer in the datasets (e.g. a dataset was rewritten). Both are ValueErrors.
        """
        if list(state["world"]) != [self.rank, self.world_size, self.settings.seed]:
            raise BadValue(
                f"state is for rank/world/seed {state['world']}, "
                f"this sampler is {[self.rank, self.world_size, self.settings.seed]}"
            )
        known, dropped = self.catalog.known, self.catalog.dropped
        for _ in range(2):  # the state may name episodes committed after this sampler last looked
            # An episode this run's weights drop (resumed with other weights) is not missing: it is left out.
            missing = [tuple(k) for k in state["known"] if tuple(k) not in known and tuple(k) not in dropped]
            if not missing:
                break
            self.refresh()
        if missing:
            raise StaleState(f"state names episodes these datasets do not hold: {missing[:5]}")
        with self._feed.lock:
            self._generator.set_state(state["generator"])
            self._feed.schedule.passes, self.batches = state["pass"], state["batches"]
            restore = [tuple(k) for k in state["buffered"] if tuple(k) in known]
            saved_known = {tuple(k) for k in state["known"]}
            later = [k for k in known if k not in saved_known]  # committed after the save (or dropped then)
            rest = [tuple(k) for k in state["queue"] if tuple(k) not in set(restore) and tuple(k) in known]
            # The saved composition is rebuilt from scratch, in its order, then new episodes, then the saved
            # schedule.
            self._feed.restart(restore, later + rest)

    def close(self) -> None:
        """Stop the background thread and the decode workers, and free the frame buffer. Idempotent."""
        self._feed.close()

    def __enter__(self) -> StreamingSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if hasattr(self, "_feed"):
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: queues may already be gone
            pass
