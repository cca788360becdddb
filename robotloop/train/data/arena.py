"""The frame buffer on the sampler's device: a ring of preallocated tensors ("arena") that decoded episodes are
copied into, the view of it that batches sample from, and, on CUDA, the stream and events that keep those
copies off the trainer's stream without racing its gathers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from ...features import ACTION_KEY
from .catalog import EpisodeKey
from .errors import DataError

if TYPE_CHECKING:
    from .settings import DataSettings

FrameShapes = dict[str, tuple[tuple[int, ...], torch.dtype]]  # feature -> (shape of one frame's value, dtype)
GROWTH_HEADROOM = 0.1  # of the GPU's memory, left free when a growth is cut to what fits: the trainer's own peaks

log = logging.getLogger(__name__)


def buffer_bytes(settings: DataSettings, device: torch.device) -> int:
    """The frame buffer's byte bound: `settings.buffer_bytes`, else a share of the GPU's free memory, else 8 GiB."""
    if settings.buffer_bytes is not None:
        return settings.buffer_bytes
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * settings.buffer_share)
    return 8 << 30


def frame_bytes(shapes: FrameShapes) -> int:
    """Bytes one buffered frame takes: every feature's value, plus the arena's 8-byte `last` index."""
    return sum(torch.Size(sh).numel() * torch.empty(0, dtype=dt).element_size() for sh, dt in shapes.values()) + 8


@dataclass
class BufferView:
    """What `next_batch` samples from: buffered episodes in insertion order (the canonical order, so a
    rebuilt buffer samples the same frames wherever the episodes landed in the arena).

    The background thread publishes plain lists; the trainer's thread turns them into device tensors on its
    own stream at the next batch (an async copy from pinned memory, then a gather and a cumulative sum over the
    buffered frames' weights), so publishing never waits for the GPU. Sampling is then a search of `cumulative`:
    a frame of weight 0 spans an empty interval and is never drawn.
    """

    keys: list[EpisodeKey] = field(default_factory=list)
    start_list: list[int] = field(default_factory=list)  # arena slot of each episode's first frame
    offset_list: list[int] = field(default_factory=lambda: [0])  # cumulative frame counts, [0, n0, n0+n1, ...]
    weight_list: list[float] = field(default_factory=list)  # each episode's summed frame weight
    slots: torch.Tensor | None = None  # arena slot of each buffered frame, in canonical order [total]
    cumulative: torch.Tensor | None = None  # float64 cumulative sum of those frames' weights [total]
    last_kept: torch.Tensor | None = None  # canonical index of the last frame of positive weight (a 0-d tensor)

    @property
    def total(self) -> int:
        return self.offset_list[-1]

    @cached_property
    def weight(self) -> float:
        """The buffered frames' summed weight: 0 when there is nothing to draw."""
        return sum(self.weight_list)

    def materialize(self, device: torch.device, weights: torch.Tensor) -> None:
        """The device tensors sampling reads, from the arena's per-slot `weights` (once per published view)."""
        if self.slots is not None:
            return

        def put(values: list[int]) -> torch.Tensor:
            t = torch.tensor(values, dtype=torch.long)
            return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t

        starts, offsets = put(self.start_list), put(self.offset_list)
        # Frame i of the canonical order lies in episode e at slot starts[e] + (i - offsets[e]).
        frame = torch.arange(self.total, device=device)
        shift = torch.repeat_interleave(starts - offsets[:-1], offsets.diff(), output_size=self.total)
        self.slots = frame + shift
        kept = weights[self.slots].double()
        self.cumulative = kept.cumsum(0)
        # A draw that rounds up to the total weight lands past the end: it falls back on the last kept frame.
        self.last_kept = self.total - 1 - torch.argmax((kept.flip(0) > 0).to(torch.int32))


class FrameArena:
    """Preallocated per-frame tensors on one device, filled as a ring: episodes are contiguous slices and a
    new episode overwrites (evicts) the oldest ones. Grows by doubling up to `bound` frames before the first
    wrap, so small datasets do not reserve the whole bound. A growth holds the old tensors and the new ones at
    once: where the GPU has no room for both, the arena grows to what fits and stops growing there (`bound`
    becomes its capacity; later episodes evict older ones, which are decoded again when drawn).

    Owns the tensors (`tensors`, and `last`: per slot, the slot of its episode's last frame, which bounds action
    chunks) and where each buffered episode lies (`slots`, in insertion order). Not thread-safe: the sampler
    places episodes under its lock and fills them outside it, in slots no published view names.

    Raises (`place`):
        DataError: an episode longer than the whole buffer.
    """

    def __init__(self, shapes: FrameShapes, bound: int, device: torch.device) -> None:
        self.shapes, self.bound, self.device = shapes, bound, device
        self.capacity, self.write = 0, 0
        self.tensors: dict[str, torch.Tensor] = {}
        self.last = torch.empty(0, dtype=torch.long, device=device)  # per slot: the slot of its episode's last frame
        self.slots: dict[EpisodeKey, tuple[int, int]] = {}  # episode key -> (start, length), insertion order
        self.weights: dict[EpisodeKey, float] = {}  # buffered episode -> its summed frame weight

    def grows(self, length: int) -> bool:
        """Whether placing an episode of `length` frames reallocates the arena."""
        return self.write + length > self.capacity and self.capacity < self.bound

    def place(self, key: EpisodeKey, length: int, hint: int, weight: float = 1.0) -> tuple[int, list[EpisodeKey]]:
        """Reserve `length` slots for `key`, whose frames weigh `weight` together; returns the start and the
        episodes evicted for it. A growth sizes the arena for `hint` frames (the whole share) at once where the
        bound allows."""
        if length > self.bound:
            raise DataError(
                f"episode {key} has {length} frames, more than the buffer holds ({self.bound}); "
                "raise buffer_frames/buffer_bytes"
            )
        if self.grows(length):
            target = min(self.bound, max(2 * self.capacity, self.write + length, min(hint, self.bound)))
            self._grow(target, needed=self.write + length)
            if length > self.capacity:  # the device had no room to grow even for this one
                raise DataError(
                    f"episode {key} has {length} frames, more than the buffer holds ({self.capacity}) with the "
                    f"room {self.device} has left; lower buffer_frames/buffer_bytes or decode onto the CPU"
                )
        if self.write + length > self.capacity:
            self.write = 0
        start, end = self.write, self.write + length
        evicted = [k for k, (s, n) in self.slots.items() if s < end and s + n > start]
        for k in evicted:
            del self.slots[k]
            del self.weights[k]
        self.slots[key] = (start, length)
        self.weights[key] = weight
        self.write = end
        return start, evicted

    def _grow(self, capacity: int, needed: int) -> None:
        try:
            new = self._allocate(capacity)
        except torch.OutOfMemoryError:
            new = self._allocate_what_fits(capacity, needed)
            if new is None:
                return
        last = new.pop("last")
        capacity = len(last)
        # Growth happens only before the first wrap, so every buffered frame lies in [0, write).
        for k, t in self.tensors.items():
            new[k][: self.write] = t[: self.write]
        last[: self.write] = self.last[: self.write]
        self.tensors, self.last, self.capacity = new, last, capacity

    def _allocate(self, capacity: int) -> dict[str, torch.Tensor]:
        new = {
            k: torch.empty((capacity, *shape), dtype=dtype, device=self.device)
            for k, (shape, dtype) in self.shapes.items()
        }
        new["last"] = torch.zeros(capacity, dtype=torch.long, device=self.device)
        return new

    def _allocate_what_fits(self, capacity: int, needed: int) -> dict[str, torch.Tensor] | None:
        """After an out-of-memory growth: the largest arena between `needed` and `capacity` frames that the
        device has room for beside the current one, with `bound` lowered to it; None (and `bound` at today's
        capacity, so the next episode wraps) where not even `needed` fits.

        Raises:
            DataError: nothing is buffered yet and not even `needed` frames fit.
        """
        fits = self._frames_free()
        size = min(capacity, fits)
        try:
            new = self._allocate(size) if size >= needed else None
        except torch.OutOfMemoryError:
            new = None
        if new is None and self.capacity == 0:
            raise DataError(
                f"the {self.device} has no room for {needed} frames of the buffer; "
                "lower buffer_frames/buffer_bytes or decode onto the CPU (data device cpu)"
            )
        self.bound = size if new is not None else self.capacity
        log.warning(
            "frame buffer: no room on %s for %d frames beside the %d buffered; it stops growing at %d frames "
            "(older episodes are evicted and decoded again when drawn)",
            self.device,
            capacity,
            self.write,
            self.bound,
        )
        return new

    def _frames_free(self) -> int:
        """Frames a new arena could hold on the device now, keeping `GROWTH_HEADROOM` of its memory free."""
        one = frame_bytes(self.shapes)
        if self.device.type != "cuda":
            return self.bound  # host memory: the bound already says what may be used
        torch.cuda.empty_cache()  # blocks cached but unused count as free for this
        free, total = torch.cuda.mem_get_info(self.device)
        return max(0, int(free - GROWTH_HEADROOM * total) // one)

    def fill(self, start: int, episode: dict[str, torch.Tensor]) -> None:
        length = len(episode[ACTION_KEY])
        for k, t in episode.items():
            self.tensors[k][start : start + length].copy_(t, non_blocking=False)
        self.last[start : start + length] = start + length - 1

    def view(self, exclude: EpisodeKey | None = None) -> BufferView:
        """The buffered episodes (but `exclude`, one still being copied in) as a view to sample from."""
        keys = [k for k in self.slots if k != exclude]
        offsets = [0]
        for k in keys:
            offsets.append(offsets[-1] + self.slots[k][1])
        return BufferView(keys, [self.slots[k][0] for k in keys], offsets, [self.weights[k] for k in keys])

    def clear(self) -> None:
        """Forget every buffered episode (the tensors stay allocated): the next one is placed at slot 0."""
        self.slots.clear()
        self.weights.clear()
        self.write = 0

    def free(self) -> None:
        """Release the tensors now (GPU memory on CUDA), not when the last reference goes."""
        self.tensors = {}


class IngestStream:
    """Where decoded episodes are copied into the arena: on CUDA a side stream, from pinned memory; on CPU inline.

    The copies run after the last batch's gathers (they may read slots about to be overwritten), and the ingest
    thread waits for them before it publishes the episode; the trainer's stream never waits on ingest.
    """

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextmanager
    def after(self, done: torch.cuda.Event | None) -> Iterator[None]:
        """Run the block's copies on the ingest stream after `done` (the last batch's gathers), and wait for them."""
        if self.stream is None:
            yield
            return
        with torch.cuda.stream(self.stream):
            if done is not None:
                self.stream.wait_event(done)
            yield
        self.stream.synchronize()

    def fill(self, arena: FrameArena, start: int, episode: dict[str, torch.Tensor], done: torch.cuda.Event | None):
        """Copy `episode` into the arena at `start`. Called outside the sampler's lock: the trainer keeps sampling
        the other episodes while this one is copied in."""
        with self.after(done):
            pinned = self.stream is not None
            arena.fill(start, {k: v.pin_memory() if pinned else v for k, v in episode.items()})


class GatherClock:
    """On CUDA, events around each batch's gathers: the last one orders ingest after them (`last_done`), and
    together they count the GPU time sampling takes (`gpu_s`) without ever blocking. On CPU it records nothing."""

    def __init__(self, device: torch.device) -> None:
        self.enabled = device.type == "cuda"
        self.last_done: torch.cuda.Event | None = None
        self._marks: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()  # (start, end) of each batch
        self._gpu_s = 0.0

    def start(self) -> torch.cuda.Event | None:
        if not self.enabled:
            return None
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start

    def end(self, start: torch.cuda.Event | None) -> None:
        if start is None:
            return
        self.last_done = torch.cuda.Event(enable_timing=True)
        self.last_done.record()
        self._marks.append((start, self.last_done))
        if len(self._marks) > 1024:  # nobody reads gpu_s: fold finished batches in, keep the queue short
            self._fold()

    @property
    def gpu_s(self) -> float:
        self._fold()
        return self._gpu_s

    def _fold(self) -> None:
        while self._marks and self._marks[0][1].query():
            start, end = self._marks.popleft()
            self._gpu_s += start.elapsed_time(end) / 1e3
