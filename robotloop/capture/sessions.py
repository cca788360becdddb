"""Open episodes of the capture service: streamed into the recorder's live episodes batch by batch, committed on close.

A robot that does not run `DatasetRecorder` itself opens an episode, streams frame batches, and closes it. Each
open episode is a `LiveEpisode` of the dataset's one `DatasetRecorder`, as a local robot records: every checked
batch goes straight to lerobot's streaming video encoder, so the service holds only the frames waiting for the
encoder (`Limits.encoder_queue_s`), and a close finishes only the encode's tail before the commit. Until the close
succeeds nothing of the episode is in the bucket, so a rejected batch, an abort, an idle timeout or a failed
commit never leaves half an episode behind.

Wire format of one frame batch (what `encode_frames` writes and `decode_frames` reads; no pickle, no numpy
headers, so a robot in any language can write it):

    <one line of UTF-8 JSON> b"\\n" <raw image bytes>

* The JSON line holds the small per-frame fields of N frames (N >= 1):
  `{"timestamp": [N floats], "state": [N x state_dim floats], "action": [N x action_dim floats],
    "reward": [N floats] (optional, default 0), "success": [N bools] (optional, default false)}`;
  a fleet dataset's frames (opened with `fleet`: `DatasetSpec(fleet=True)`) also have, and only they,
  `"intervention": [N bools]` (the expert drove) and `"policy_action": [N x action_dim floats]` (what the policy
  proposed).
  Timestamps are seconds from the episode start: >= 0 and strictly increasing across the whole episode
  (they catch reordered or repeated frames; the dataset stores frame_index / fps, as lerobot's recorder does).
* The raw bytes are the images as uint8 RGB, H x W x 3 in C order: frame 0's cameras in sorted name order,
  then frame 1's, ...: exactly N * sum(H * W * 3) bytes. Raw bytes avoid base64's third more of traffic
  and its decode; the request's body limit bounds the JSON line too.

Example:
    ```python
    >>> sessions = EpisodeSessions(client, Limits())     # client: a BucketClient that may write the bucket
    >>> url = BucketUrl.parse("hf://buckets/lab/demos/datasets/cube")
    >>> eid = sessions.open("robot-1", url, {"top": (480, 640, 3)}, state_dim=14, action_dim=14)
    >>> sessions.add_frames("robot-1", eid, encode_frames(timestamp, state, action, images))
    >>> sessions.close("robot-1", eid, "pick up the cube").episode_index
    >>> fleet = sessions.open("robot-1", fleet_url, {"top": (480, 640, 3)}, 14, 14, fleet=True)   # a fleet dataset
    >>> sessions.add_frames("robot-1", fleet, encode_frames(timestamp, state, action, images,
    ...                     intervention=expert_drove, policy_action=proposed))
    >>> sessions.close("robot-1", fleet, "pick up the cube", facts={"robot_id": "r1", "release": "v7", "seed": 3})
    ```
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import errors
from ..errors import Busy, Conflict
from ..sim.constants import describe_shadow_map
from ..storage import BucketClient, BucketUrl, NotFound, StorageError
from .episode import BadEpisode, FleetTally
from .recorder import CommitReport, DatasetRecorder, DatasetSpec, LiveEpisode, episode_frame, spec_mismatch

MAX_TASK_CHARS = 1000
Fact = str | int | float | bool | None  # a fleet episode's fact: flat JSON values (the service refuses others)
log = logging.getLogger("robotloop.capture")  # the capture service's log


class UnknownEpisode(errors.NotFound, LookupError):
    """No open episode with this id for this robot (never opened, closed, aborted, expired, or another robot's)."""


class EpisodeExpired(UnknownEpisode):
    """The robot's episode was dropped, uncommitted, after `Limits.idle_timeout_s` without a request."""


@dataclass(frozen=True)
class Abandoned:
    """An episode `EpisodeSessions.expire` dropped: its robot sent nothing for `idle_s` seconds."""

    episode_id: str
    robot: str
    url: BucketUrl
    frames: int  # accepted, and now discarded: nothing of the episode was committed
    idle_s: float


# Ids of dropped-for-idleness episodes kept to answer a late request with why (ids are 32 hex digits: 1024 of them
# are a few tens of kB); the oldest are forgotten first, and a forgotten one reads like any unknown episode.
REMEMBERED_EXPIRED = 1024


class TooLarge(errors.TooLarge, ValueError):
    """A batch would take an episode past its frame or byte cap."""


class TooManyEpisodes(Busy, RuntimeError):
    """The robot already has as many open episodes as it may."""


class SpecConflict(Conflict, ValueError):
    """The dataset exists (in the bucket or open here) with other features than the ones asked for."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what robots may hold in the service (memory, encoder threads, staging disk)."""

    max_frames: int = 30_000
    max_bytes: int = 2 * 2**30  # image bytes of one episode (as sent: raw; encoded to video as they arrive)
    max_open_per_robot: int = 4
    idle_timeout_s: float = 300.0  # then an open episode without a request is dropped (`expire`)
    # Frames an open episode holds in memory, waiting for its video encoder: a batch sent faster than the encoder
    # encodes waits for room (its request takes longer), so no frame is dropped whatever this is.
    encoder_queue_s: float = 1.0


@dataclass
class Frames:
    """One decoded batch of N frames: `images[name]` uint8 [N, H, W, 3], the rest float32/bool with N rows
    (`reward` float64 as sent: the dataset stores it as float32, a fleet episode's facts its value). `reward` and
    `success` are None when the batch did not say; `intervention` and `policy_action` are a fleet dataset's."""

    timestamp: np.ndarray
    state: np.ndarray
    action: np.ndarray
    images: dict[str, np.ndarray]
    reward: np.ndarray | None = None
    success: np.ndarray | None = None
    intervention: np.ndarray | None = None
    policy_action: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.timestamp)

    @property
    def image_bytes(self) -> int:
        return sum(a.nbytes for a in self.images.values())


class _FramesJson(BaseModel):
    """The JSON line of a batch; strict, so `"1.0"` or `true` is not silently taken for a number."""

    model_config = ConfigDict(extra="forbid", strict=True)
    timestamp: list[float] = Field(min_length=1)
    state: list[list[float]]
    action: list[list[float]]
    reward: list[float] | None = None
    success: list[bool] | None = None
    intervention: list[bool] | None = None
    policy_action: list[list[float]] | None = None


def frame_bytes(spec: DatasetSpec) -> int:
    """Image bytes of one frame: all cameras."""
    return sum(h * w * c for h, w, c in spec.cameras.values())


def encode_frames(
    timestamp: ArrayLike,
    state: ArrayLike,
    action: ArrayLike,
    images: dict[str, np.ndarray],
    reward: ArrayLike | None = None,
    success: ArrayLike | None = None,
    intervention: ArrayLike | None = None,
    policy_action: ArrayLike | None = None,
) -> bytes:
    """Write a batch of N frames in the wire format (see the module docstring); `images[name]` is [N, H, W, 3].
    `intervention` and `policy_action` are for a fleet dataset's episode (and required there).

    Arrays are converted, not checked: the service checks them, so a robot learns exactly what was wrong.
    """
    fields = {
        "timestamp": np.asarray(timestamp, np.float64).tolist(),
        "state": np.asarray(state, np.float64).tolist(),
        "action": np.asarray(action, np.float64).tolist(),
    }
    if reward is not None:
        fields["reward"] = np.asarray(reward, np.float64).tolist()
    if success is not None:
        fields["success"] = np.asarray(success, bool).tolist()
    if intervention is not None:
        fields["intervention"] = np.asarray(intervention, bool).tolist()
    if policy_action is not None:
        fields["policy_action"] = np.asarray(policy_action, np.float64).tolist()
    n = len(fields["timestamp"])
    # Frame-major: frame t's cameras, in sorted name order, then frame t+1's.
    per_frame = [np.ascontiguousarray(images[name]).reshape(n, -1) for name in sorted(images)]
    raw = np.concatenate(per_frame, axis=1).tobytes() if per_frame else b""
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n" + raw


def decode_frames(body: bytes, spec: DatasetSpec) -> Frames:
    """Read and check one batch against the dataset's spec.

    Raises:
        BadEpisode: no JSON line, malformed JSON or fields, wrong row counts or sizes, NaN/inf,
            timestamps not strictly increasing or negative, image bytes that do not add up to N frames, or a
            fleet dataset's batch without its fleet columns (a demo dataset's with them); the message names the
            field.
    """
    line_end = body.find(b"\n")
    if line_end < 0:
        raise BadEpisode("a frames body is one JSON line, a newline, then the raw uint8 image bytes; no newline found")
    try:
        meta = _FramesJson.model_validate(json.loads(body[:line_end]))
    except (ValueError, ValidationError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise BadEpisode(f"bad frames JSON: {_short(err)}") from None
    n = len(meta.timestamp)
    timestamp = np.asarray(meta.timestamp, np.float64)
    state = _rows(meta.state, n, spec.state_dim, "state")
    action = _rows(meta.action, n, spec.action_dim, "action")
    reward = None if meta.reward is None else _rows([[r] for r in meta.reward], n, 1, "reward", np.float64)[:, 0]
    success = _flags(meta.success, n, "success")
    intervention = _flags(meta.intervention, n, "intervention")
    policy_action = None
    if meta.policy_action is not None:
        policy_action = _rows(meta.policy_action, n, spec.action_dim, "policy_action")
    _check_finite(timestamp, "timestamp")
    if timestamp[0] < 0 or (np.diff(timestamp) <= 0).any():
        raise BadEpisode(f"timestamps must be >= 0 and strictly increasing; got {timestamp[:8].tolist()}...")
    batch = Frames(timestamp, state, action, {}, reward, success, intervention, policy_action)
    _check_fleet_columns(batch, spec)  # before the images are copied out
    batch.images = _images(memoryview(body)[line_end + 1 :], n, spec)
    return batch


def _check_fleet_columns(batch: Frames, spec: DatasetSpec) -> None:
    """A fleet dataset's frames carry `intervention` and `policy_action`, a demo dataset's neither: without them a
    fleet frame would be stored with made-up flags, and with them a demo frame would silently lose them.

    Raises:
        BadEpisode: naming the column missing, or sent to a dataset opened without fleet.
    """
    for name in ("intervention", "policy_action"):
        sent = getattr(batch, name) is not None
        if spec.fleet and not sent:
            raise BadEpisode(
                f"{name!r} is missing: this episode's dataset is a fleet dataset, whose every frame has "
                "'intervention' (N bools: the expert drove) and 'policy_action' (N x action_dim floats)"
            )
        if sent and not spec.fleet:
            raise BadEpisode(
                f"{name!r} is a fleet dataset's feature, and this episode's dataset was opened without fleet: "
                "leave it out, or record into a fleet dataset (open with fleet)"
            )


def _flags(values: list[bool] | None, n: int, name: str) -> np.ndarray | None:
    """`values` as bool [n] (None: not sent). Raises BadEpisode when there are not `n`."""
    if values is None:
        return None
    if len(values) != n:
        raise BadEpisode(f"{name} has {len(values)} values for {n} timestamps")
    return np.asarray(values, bool)


def _rows(values: list[list[float]], n: int, dim: int, name: str, dtype: type = np.float32) -> np.ndarray:
    """`values` as `dtype` [n, dim], finite and within float32's range (the dataset's). Raises BadEpisode naming
    the first bad row."""
    if len(values) != n:
        raise BadEpisode(f"{name} has {len(values)} rows for {n} timestamps")
    for i, row in enumerate(values):
        if len(row) != dim:
            raise BadEpisode(f"{name} of frame {i} has {len(row)} values, the dataset's {name} has {dim}")
    array = np.asarray(values, np.float64).reshape(n, dim)
    _check_finite(array, name)
    if (np.abs(array) > np.finfo(np.float32).max).any():  # would turn into inf in the float32 dataset
        raise BadEpisode(f"{name} holds values too large for float32")
    return array.astype(dtype)


def _check_finite(array: np.ndarray, name: str) -> None:
    bad = ~np.isfinite(array)
    if bad.any():
        frame = int(np.argwhere(bad)[0][0])
        raise BadEpisode(f"{name} of frame {frame} (in this batch) holds NaN or infinite values")


def _images(raw: memoryview, n: int, spec: DatasetSpec) -> dict[str, np.ndarray]:
    """Split the raw bytes into uint8 [n, H, W, 3] per camera. Copied out of the request body: views would keep
    the whole body (JSON line included, which the episode's byte limit does not count) alive with the episode."""
    per_frame = frame_bytes(spec)
    if len(raw) != n * per_frame:
        shapes = ", ".join(f"{k} {h}x{w}x{c}" for k, (h, w, c) in sorted(spec.cameras.items()))
        raise BadEpisode(
            f"got {len(raw)} image bytes; {n} frames of uint8 images ({shapes}) are "
            f"{n} x {per_frame} = {n * per_frame} bytes"
        )
    flat = np.frombuffer(raw, np.uint8).reshape(n, per_frame).copy()
    out, offset = {}, 0
    for name in sorted(spec.cameras):
        h, w, c = spec.cameras[name]
        out[name] = flat[:, offset : offset + h * w * c].reshape(n, h, w, c)
        offset += h * w * c
    return out


def _short(err: Exception) -> str:
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors()[:3])
    return str(err)[:300]


@dataclass
class _Session:
    robot: str
    url: BucketUrl
    spec: DatasetSpec
    touched: float
    live: LiveEpisode
    # One request at a time feeds, closes or drops an episode (its encoder takes frames in order); held while a
    # batch waits for the encoder, so the service-wide lock never is.
    lock: threading.Lock = field(default_factory=threading.Lock)
    frames: int = 0
    image_bytes: int = 0
    last_timestamp: float = -1.0
    committing: bool = False  # encoded for a close whose upload failed: only another close or an abort now
    tally: FleetTally | None = None  # a fleet episode's: what its accepted frames say, for its facts line


@dataclass
class _Dataset:
    recorder: DatasetRecorder
    lock: threading.Lock = field(default_factory=threading.Lock)


class EpisodeSessions:
    """Open episodes per robot, and one `DatasetRecorder` per dataset whose commits are serialized.

    Thread-safe: the service calls it from a thread pool. Several robots may record into one dataset: their
    closes commit one after another under the dataset's lock, and the recorder re-reads the bucket's metadata
    before each commit, so no episode overwrites another.
    """

    def __init__(
        self,
        client: BucketClient,
        limits: Limits = Limits(),
        vcodec: str = "libsvtav1",
        clock: Callable[[], float] = time.monotonic,
        staging: Path | None = None,
    ) -> None:
        """`staging`: where recorders keep their local meta/ (a folder per dataset); default the recorder's own."""
        self.client, self.limits, self.vcodec, self.clock, self.staging = client, limits, vcodec, clock, staging
        self._sessions: dict[str, _Session] = {}
        self._datasets: dict[str, _Dataset] = {}
        self._expired: OrderedDict[str, str] = OrderedDict()  # episode id -> its robot, for `EpisodeExpired`
        self._ended = Counter()  # "committed", "aborted", "abandoned": how episodes left, since the start
        self._lock = threading.Lock()  # guards the dicts, the counts and every session's `touched`

    def open(
        self,
        robot: str,
        url: BucketUrl,
        cameras: dict[str, tuple[int, int, int]],
        state_dim: int,
        action_dim: int,
        fps: int = 50,
        robot_type: str | None = None,
        fleet: bool = False,
        shadow_map: int | None = None,
    ) -> str:
        """Open an episode of `robot` in the dataset at `url`; returns its id. `fleet`: the dataset is a fleet
        dataset (`DatasetSpec(fleet=True)`: every frame also has `intervention` and `policy_action`, and each
        episode a line of facts). `shadow_map`: a sim's cameras render with shadow maps of this side
        (`DatasetSpec.shadow_map`).

        Raises:
            BadEpisode: no camera, or an image shape that is not (H, W, 3).
            TooManyEpisodes: `robot` already has `limits.max_open_per_robot` episodes open.
            SpecConflict: the dataset exists with other cameras, dims, fps or shadow maps, or is a fleet dataset
                and `fleet` is not asked for (or the reverse).
            robotloop.storage.StorageError: the service cannot create or read the bucket.
        """
        if not cameras or any(len(s) != 3 or s[2] != 3 or min(s) < 1 for s in cameras.values()):
            raise BadEpisode(f"cameras must map names to (height, width, 3) RGB shapes; got {cameras}")
        cameras = {k: tuple(v) for k, v in cameras.items()}
        spec = DatasetSpec(
            cameras, state_dim, action_dim, fps, robot_type, self.vcodec, fleet=fleet, shadow_map=shadow_map
        )
        self.expire()
        recorder = self._dataset(url, spec).recorder  # outside the lock: it may talk to the bucket
        episode_id = secrets.token_hex(16)  # unguessable: ids are never a capability, but need not leak either
        live = recorder.begin(encoder_queue_frames=max(1, round(self.limits.encoder_queue_s * fps)))  # task: at close
        with self._lock:  # count and insert in one step, so concurrent opens cannot pass the cap
            mine = sum(s.robot == robot for s in self._sessions.values())
            if mine < self.limits.max_open_per_robot:
                tally = FleetTally() if fleet else None
                self._sessions[episode_id] = _Session(robot, url, spec, self.clock(), live, tally=tally)
                return episode_id
        live.abort()
        raise TooManyEpisodes(f"robot {robot} already has {mine} open episodes (the limit); close or abort one first")

    def add_frames(self, robot: str, episode_id: str, frames: bytes | Frames) -> int:
        """Check a batch (wire bytes or decoded `Frames`) and feed it to the episode's video encoder; returns the
        episode's frame count. Waits while the encoder's queue is full (a robot sending faster than real time).

        A rejected batch changes nothing: the episode keeps its earlier frames and stays open.

        Raises:
            UnknownEpisode: no such open episode for `robot`.
            BadEpisode: see `decode_frames` and `check_frame`; or timestamps not after the episode's last one.
            TooLarge: the episode would pass `limits.max_frames` frames or `limits.max_bytes` image bytes.
            Conflict: the episode's close failed to upload: close it again or abort it.
        """
        session = self._get(robot, episode_id)
        if isinstance(frames, bytes | bytearray):
            batch = decode_frames(frames, session.spec)
        else:
            batch = frames
            _check_fleet_columns(batch, session.spec)  # decode_frames checks its own
        with self._held(session, robot, episode_id):  # continuity, caps and feeding in one step per episode
            if session.committing:
                raise Conflict(
                    "this episode was encoded for a close whose upload failed: close it again or abort it; it "
                    "takes no more frames"
                )
            if batch.timestamp[0] <= session.last_timestamp:
                raise BadEpisode(
                    f"timestamp {batch.timestamp[0]} is not after the episode's last frame "
                    f"({session.last_timestamp}); frames must arrive in time order"
                )
            _check_frame_rate(batch.timestamp, session.last_timestamp if session.frames else None, session.spec.fps)
            if session.frames + len(batch) > self.limits.max_frames:
                raise TooLarge(
                    f"episode would hold {session.frames + len(batch)} frames; the limit is "
                    f"{self.limits.max_frames}. Close it and open another"
                )
            if session.image_bytes + batch.image_bytes > self.limits.max_bytes:
                raise TooLarge(
                    f"episode would hold {session.image_bytes + batch.image_bytes} image bytes; the limit "
                    f"is {self.limits.max_bytes}. Close it and open another"
                )
            session.live.add_frames([episode_frame(session.spec, batch, t) for t in range(len(batch))])
            if session.tally is not None:
                session.tally.add(batch.intervention, batch.reward, batch.success)
            session.frames += len(batch)
            session.image_bytes += batch.image_bytes
            session.last_timestamp = float(batch.timestamp[-1])
            self._touch(session)
            return session.frames

    def close(self, robot: str, episode_id: str, task: str, facts: dict[str, Fact] | None = None) -> CommitReport:
        """Commit the episode to its dataset: the encoder's tail, then the append and upload. Bad input (an empty
        or too long task, no frames, facts it cannot take) leaves the episode open, to be closed again; so does a
        failed upload (its encoded files are kept). Once committed, or refused by the recorder, it is gone.

        A fleet episode is committed with its line of `meta/fleet_episodes.jsonl`, as `FleetRecorder` writes it:
        `facts` (JSON values: the robot's id, release, seed...), the task, then what its frames say
        (`FleetTally`: success, max_reward, frames, expert_frames, kind), which the robot may not give itself.

        Raises:
            UnknownEpisode: no such open episode for `robot`.
            BadEpisode: no frames, a bad task, facts for a demo (non-fleet) episode, or facts naming what the frames
                say or the line's index or task (the episode stays open); or, from the recorder, an episode it
                refuses (dropped).
            robotloop.storage.StorageError: the upload failed; the bucket still holds its previous commit and the
                episode stays open: close it again.
        """
        task = task.strip()
        session = self._get(robot, episode_id)
        with self._held(session, robot, episode_id):
            if not task or len(task) > MAX_TASK_CHARS or not task.isprintable():
                raise BadEpisode(
                    f"task must be 1 to {MAX_TASK_CHARS} printable characters of instruction text (one "
                    "line, no control characters); the episode "
                    "is still open"
                )
            if not session.frames:
                raise BadEpisode("the episode has no frames; nothing was committed and it is still open")
            line = _facts_line(session, task, facts)
            session.committing = True
            try:
                with self._datasets[str(session.url)].lock:  # the recorder's file lock covers processes; threads too
                    report = session.live.commit(task, facts=line)
            except (StorageError, OSError):
                self._touch(session)  # transient: the encoded episode is kept for another close
                raise
            except BaseException:
                self._drop(episode_id, session, "aborted")
                session.live.abort()  # refused (or a bug): nothing of it may stay in staging
                raise
            self._drop(episode_id, session, "committed")
            return report

    def abort(self, robot: str, episode_id: str) -> None:
        """Drop an open episode and what was encoded of it.

        Raises:
            UnknownEpisode: no such open episode for `robot`.
        """
        session = self._get(robot, episode_id)
        with self._held(session, robot, episode_id):
            self._drop(episode_id, session, "aborted")
            session.live.abort()

    def expire(self) -> list[Abandoned]:
        """Drop the episodes without a request for longer than `limits.idle_timeout_s` (their robot vanished, or
        stopped without closing them): never committed, their encoder stopped and their frames and staging files
        freed. A later request of their robot on one is told why (`EpisodeExpired`). Returns what was dropped.

        An episode a request is working on (feeding, closing) is not idle, however long that request takes.
        """
        now = self.clock()
        deadline = now - self.limits.idle_timeout_s
        with self._lock:
            idle = [(eid, s) for eid, s in self._sessions.items() if s.touched < deadline]
        gone = []
        for eid, session in idle:
            if not session.lock.acquire(blocking=False):
                continue  # a request is feeding or closing it right now: not idle
            try:
                with self._lock:
                    if self._sessions.get(eid) is not session or session.touched >= deadline:
                        continue
                    del self._sessions[eid]
                    self._expired[eid] = session.robot
                    while len(self._expired) > REMEMBERED_EXPIRED:
                        self._expired.popitem(last=False)
                session.live.abort()
                with self._lock:  # counted once its encoder and files are gone
                    self._ended["abandoned"] += 1
            finally:
                session.lock.release()
            gone.append(Abandoned(eid, session.robot, session.url, session.frames, now - session.touched))
            log.warning(
                "%s's episode %s in %s dropped after %.0f s without a request (idle timeout %g s): %d frame(s) "
                "discarded, nothing committed",
                *(session.robot, eid, session.url, now - session.touched, self.limits.idle_timeout_s, session.frames),
            )
        return gone

    def open_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def stats(self) -> dict[str, int | float]:
        """What the open episodes hold and how episodes ended since the start:

        * `open_episodes`, `open_frames`: episodes open now and the frames they accepted so far;
        * `queued_frames`: frames of theirs in memory, waiting for their video encoders (the rest are encoded);
        * `episodes_committed`, `episodes_aborted`: closed into the bucket; dropped by their robot or refused at
          close;
        * `episodes_abandoned`: dropped after `idle_timeout_s` without a request, uncommitted.
        """
        with self._lock:
            sessions = list(self._sessions.values())
            ended = dict(self._ended)
        return {
            "open_episodes": len(sessions),
            "open_frames": sum(s.frames for s in sessions),
            "queued_frames": sum(s.live.queued_frames() for s in sessions),
            **{f"episodes_{how}": ended.get(how, 0) for how in ("committed", "aborted", "abandoned")},
            "idle_timeout_s": self.limits.idle_timeout_s,
        }

    # -- helpers -----------------------------------------------------------------------------------------
    def _get(self, robot: str, episode_id: str) -> _Session:
        with self._lock:
            return self._get_locked(robot, episode_id)

    @contextlib.contextmanager
    def _held(self, session: _Session, robot: str, episode_id: str) -> Iterator[None]:
        """Hold `session`'s lock, once sure it is still open (it may have been closed or dropped while waiting)."""
        with session.lock:
            self._touch(session)  # a request is working on it: it is not idle, even while it waits for the encoder
            if self._get(robot, episode_id) is not session:
                raise UnknownEpisode(f"no open episode {episode_id!r} for this robot: it was closed or aborted")
            yield

    def _touch(self, session: _Session) -> None:
        with self._lock:
            session.touched = self.clock()

    def _drop(self, episode_id: str, session: _Session, how: str) -> None:
        with self._lock:
            if self._sessions.get(episode_id) is session:
                del self._sessions[episode_id]
                self._ended[how] += 1

    def _get_locked(self, robot: str, episode_id: str) -> _Session:
        session = self._sessions.get(episode_id)
        # Another robot's episode reads exactly like a missing one: ids of others are not even confirmed.
        if session is None or session.robot != robot:
            if self._expired.get(episode_id) == robot:
                raise EpisodeExpired(
                    f"episode {episode_id!r} was dropped after {self.limits.idle_timeout_s:g} s without a request "
                    "(the service's idle timeout): nothing of it was committed. Open a new episode, and send its "
                    "frames or close it within that time"
                )
            raise UnknownEpisode(
                f"no open episode {episode_id!r} for this robot: never opened, already closed or "
                f"aborted, or dropped after {self.limits.idle_timeout_s:g} s idle"
            )
        return session

    def _dataset(self, url: BucketUrl, spec: DatasetSpec) -> _Dataset:
        """The one recorder of `url`, created on first use after checking the bucket's dataset fits `spec`."""
        key = str(url)
        with self._lock:
            dataset = self._datasets.get(key)
        if dataset is None:
            staging = self.staging / hashlib.sha256(key.encode()).hexdigest()[:16] if self.staging else None
            recorder = DatasetRecorder(
                self.client, url, spec, staging
            )  # creates the bucket: fails early without access
            _check_remote_spec(self.client, url, spec)
            with self._lock:
                dataset = self._datasets.setdefault(key, _Dataset(recorder))
        if dataset.recorder.spec != spec:
            raise SpecConflict(
                f"{url} is recorded here with {_describe(dataset.recorder.spec)}; this episode asks for "
                f"{_describe(spec)}. Use the same features or another dataset URL"
            )
        return dataset


def _check_frame_rate(timestamps: np.ndarray, previous: float | None, fps: int) -> None:
    """The dataset stores frame k at k/fps: a dropped frame or another rate would silently shift every later frame
    against its actions. Steps between frames must be within half a period of 1/fps (a slowly drifting clock
    passes; a gap or a 30 Hz stream into a 50 Hz dataset does not).

    Raises:
        BadEpisode: a step off the dataset's rate (the batch is not added).
    """
    times = np.concatenate([[previous], timestamps]) if previous is not None else np.asarray(timestamps)
    steps = np.diff(times) * fps
    if len(steps) and (bad := np.flatnonzero(np.abs(steps - 1) > 0.5)).size:
        j = int(bad[0])
        raise BadEpisode(
            f"frames {times[j]:.4f} s and {times[j + 1]:.4f} s are {steps[j]:.2f} frame periods apart; "
            f"the dataset records at {fps} fps and stores frame k at k/{fps} s: send every frame at "
            "that rate (a dropped frame would shift all later ones against their actions)"
        )


def _facts_line(session: _Session, task: str, facts: dict[str, Fact] | None) -> dict[str, Any] | None:
    """The episode's line of `meta/fleet_episodes.jsonl` (None: a demo episode has none).

    Raises:
        BadEpisode: facts for a demo episode, or facts naming what the service says itself (the episode is open).
    """
    if session.tally is None:
        if facts is not None:
            raise BadEpisode(
                "facts are a fleet dataset's (meta/fleet_episodes.jsonl), and this episode's dataset was opened "
                "without fleet: close it without facts; the episode is still open"
            )
        return None
    if taken := sorted(set(facts or {}) & {"episode_index", "task", *FleetTally.COUNTED}):
        raise BadEpisode(
            f"facts {taken} are the service's to write: the episode's index, the close's task, and what its frames "
            "say (intervention, reward, success); leave them out. The episode is still open"
        )
    return session.tally.facts({**(facts or {}), "task": task})


def _describe(spec: DatasetSpec) -> str:
    fleet = "fleet columns 'intervention' and 'policy_action'" if spec.fleet else "no fleet columns (not fleet)"
    return (
        f"cameras {spec.cameras}, state_dim {spec.state_dim}, action_dim {spec.action_dim}, fps {spec.fps}, "
        f"robot type {spec.robot_type!r}, {fleet}"
        + (f", {describe_shadow_map(spec.shadow_map)}" if spec.shadow_map is not None else "")
    )


def _check_remote_spec(client: BucketClient, url: BucketUrl, spec: DatasetSpec) -> None:
    """Refuse at open, not after minutes of streaming, a dataset that cannot take episodes of `spec`.

    Raises:
        SpecConflict: the bucket holds a dataset at `url` with another robot type, fps or features.
    """
    with tempfile.TemporaryDirectory() as tmp:
        try:
            info = json.loads(client.download(url / "meta" / "info.json", Path(tmp) / "info.json").read_text())
        except NotFound:
            return  # a new dataset
        except (ValueError, RecursionError):  # not JSON: JSONDecodeError, UnicodeDecodeError
            info = None
    try:
        why = spec_mismatch(info, spec)
    except (AttributeError, KeyError, TypeError):
        raise SpecConflict(
            f"{url} holds a meta/info.json that is not a LeRobot dataset's; use another dataset URL"
        ) from None
    if why is not None:
        raise SpecConflict(f"{url} {why}. Use the same features or another dataset URL")
