"""Crash-safe recording into a bucket: every finished episode is one commit of a complete LeRobot v3 dataset.

LeRobot's own recorder writes the parquet footer only at `finalize()`, so a crash can cost a whole session.
Here each episode is written with lerobot's writer into a one-episode dataset of its own (videos encoded as
lerobot does, while the episode runs), then appended to the bucket's dataset, growing its current data and
video files as lerobot packs them (`append.py`), and committed: the grown data and video files first,
metadata last. A reader therefore always sees a dataset whose metadata names only bytes that exist, and
Xet dedup makes each upload cost about the episode's own bytes. A crash loses at most the episode in
flight; a restart reads the bucket's metadata back and continues the numbering.

Locally only `meta/` and the files the next append grows are kept (checked against the bucket by Xet hash).
Commits to one dataset are serialized by a lock file, so several recorders on one machine can share a
dataset; recorders on different machines should use a dataset each, or the capture service.

Example:
    ```python
    >>> recorder = DatasetRecorder(client, BucketUrl.parse("hf://buckets/lab/demos/datasets/cube"),
    ...                            DatasetSpec.aloha(image_size=(480, 640)))
    >>> report = recorder.commit(episode)   # an Episode; returns the CommitReport
    >>> report.episode_index, report.bytes_sent
    ```
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..compat import dropped_video_frames, embed_images_only_where_needed, video_encoder_queues
from ..config import cache_home
from ..errors import BadValue
from ..features import (
    ACTION_KEY,
    INTERVENTION_KEY,
    POLICY_ACTION_KEY,
    REWARD_KEY,
    STATE_KEY,
    SUCCESS_KEY,
    image_key,
)
from ..sim.constants import check_shadow_map, describe_shadow_map, shadow_map_size
from ..storage import BucketClient, BucketUrl, Entry, NotFound, StorageError, private_dir
from .episode import BadEpisode, Episode, check_array

log = logging.getLogger(__name__)
# One JSON object per committed episode that came with facts of its own (a fleet robot's id, release, seed, kind):
# beside lerobot's metadata, which has no place for them; lerobot's readers ignore the file.
EPISODE_FACTS_FILE = "meta/fleet_episodes.jsonl"
# A sim camera's rendering, in its feature's `info` (lerobot keeps keys it does not know there): the side of the
# lights' shadow maps, written only where it is not gym-aloha's for the frame size (`shadow_map_size`).
SHADOW_MAP_INFO = "sim.shadow_map"
COMMIT_ATTEMPTS = 5  # syncs and appends again when another recorder committed meanwhile
_DTYPES = {"video": np.uint8, "float32": np.float32, "bool": np.bool_}  # lerobot's dtype names -> numpy's


@dataclass(frozen=True)
class DatasetSpec:
    """The dataset's shape: cameras, state and action sizes, frame rate, video codec."""

    cameras: dict[str, tuple[int, int, int]]
    state_dim: int
    action_dim: int
    fps: int = 50
    robot_type: str | None = None
    vcodec: str = "libsvtav1"  # lerobot's default; "h264" encodes faster on CPU
    vpreset: int | str | None = None  # encoder speed preset (None: lerobot's default for the codec)
    with_reward: bool = True  # next.reward and next.success columns, as lerobot's sim datasets have
    # A fleet dataset's per-frame `intervention` (bool: the expert's action) and `policy_action` (what the policy
    # proposed) columns; a dataset without them is scripted demos, every frame the expert's.
    fleet: bool = False
    # A sim's cameras: the side of the shadow maps they render with (None: `shadow_map_size` of the frame, as
    # gym-aloha renders). Training reads it back and saves it with the policy, so evaluation renders the same.
    shadow_map: int | None = None

    def __post_init__(self) -> None:
        """Raises ValueError for a codec lerobot cannot encode with or a bad shadow-map side, here rather than
        after a recorded episode."""
        from lerobot.configs.video import VALID_VIDEO_CODECS, VIDEO_CODECS_ALIASES

        check_shadow_map(self.shadow_map)
        if VIDEO_CODECS_ALIASES.get(self.vcodec, self.vcodec) not in VALID_VIDEO_CODECS:
            raise BadValue(f"video codec {self.vcodec!r}: lerobot encodes with one of {sorted(VALID_VIDEO_CODECS)}")

    @classmethod
    def aloha(
        cls, image_size: tuple[int, int] = (480, 640), vcodec: str = "libsvtav1", shadow_map: int | None = None
    ) -> DatasetSpec:
        """ALOHA bimanual: the `top` camera, 14-d joint state and action, 50 Hz, as gym-aloha."""
        h, w = image_size
        return cls({"top": (h, w, 3)}, 14, 14, 50, "aloha", vcodec, shadow_map=shadow_map)

    def features(self) -> dict[str, dict]:
        feats = {}
        for name, shape in self.cameras.items():
            feats[image_key(name)] = {
                "dtype": "video",
                "shape": shape,
                "names": ["height", "width", "channels"],
            }
            if (side := self.rendered_shadow_map(shape[:2])) is not None:
                feats[image_key(name)]["info"] = {SHADOW_MAP_INFO: side}
        feats[STATE_KEY] = {"dtype": "float32", "shape": (self.state_dim,), "names": None}
        feats[ACTION_KEY] = {"dtype": "float32", "shape": (self.action_dim,), "names": None}
        if self.with_reward:
            feats[REWARD_KEY] = {"dtype": "float32", "shape": (1,), "names": None}
            feats[SUCCESS_KEY] = {"dtype": "bool", "shape": (1,), "names": None}
        if self.fleet:
            feats[INTERVENTION_KEY] = {"dtype": "bool", "shape": (1,), "names": None}
            feats[POLICY_ACTION_KEY] = {"dtype": "float32", "shape": (self.action_dim,), "names": None}
        return feats

    def rendered_shadow_map(self, size: tuple[int, int]) -> int | None:
        """What a camera of this frame size stores of its rendering: `shadow_map`, or None where that is the
        default for the size (so a dataset rendered as gym-aloha renders says nothing new)."""
        if self.shadow_map is None or self.shadow_map == shadow_map_size(*size):
            return None
        return self.shadow_map


def camera_shadow_map(feature: dict) -> int | None:
    """The shadow-map side a dataset's camera feature (meta/info.json) was rendered with, when it is not the
    default for its frame size (`DatasetSpec.shadow_map`); None otherwise, and for real cameras."""
    side = (feature.get("info") or {}).get(SHADOW_MAP_INFO)
    return int(side) if side is not None else None


@dataclass(frozen=True)
class CommitReport:
    """What one committed episode cost and when it became visible."""

    episode_index: int
    frames: int
    episode_bytes: int  # the episode's own files (data + video) as written
    bytes_sent: int  # what went over the wire, metadata included (after Xet dedup)
    encode_s: float  # video encoding left after the last frame (for a whole episode given at once: all of it)
    upload_s: float  # data/video then metadata uploads; the episode is visible when this ends
    files: list[str] = field(default_factory=list)


class DatasetRecorder:
    """Commits episodes, one at a time, to a LeRobot v3 dataset in a bucket."""

    def __init__(self, client: BucketClient, url: BucketUrl, spec: DatasetSpec, staging: Path | None = None) -> None:
        self.client, self.url, self.spec = client, url, spec
        key = hashlib.sha256(f"{client.endpoint}|{url}".encode()).hexdigest()[:16]
        self.staging = private_dir(staging or cache_home() / "recordings" / key)
        self.root = self.staging / "dataset"
        self._synced_info: str | None = None  # the bucket's meta/info.json Xet hash when this recorder last synced
        self.client.create_bucket(url)

    def commit(self, episode: Episode) -> CommitReport:
        """Write a whole `episode` with lerobot's writer and commit it to the bucket.

        Raises:
            BadEpisode: the episode does not fit the dataset (nothing is written or uploaded).
            robotloop.storage.StorageError: the upload failed; the bucket still holds the previous commit.
        """
        return self.commit_written(write_episode(self.spec, self.url.bucket_id, self.staging, episode))

    def commit_written(self, written: WrittenEpisode) -> CommitReport:
        """Commit an episode `write_episode` encoded (in this process or a worker's) into this recorder's staging.

        Raises:
            BadEpisode: `written` is not in this recorder's staging folder. robotloop.storage.StorageError: the
                upload failed; the bucket still holds the previous commit.
        """
        root = Path(written.root)
        if root.parent.parent != self.staging:
            raise BadEpisode(f"{root} was not written into this recorder's staging folder {self.staging}")
        report = self._push_episode(root, written.frames)
        return dataclasses.replace(report, encode_s=written.encode_s)

    def begin(self, task: str | None = None, encoder_queue_frames: int | None = None) -> LiveEpisode:
        """Start an episode that is written while it happens (robots, the capture service).

        Frames go to lerobot's streaming video encoder as they arrive, into a one-episode dataset of its own,
        so when the episode ends only the encoder's tail is left before the commit appends it.
        `encoder_queue_frames` bounds the frames waiting for the encoder (default: 5 s of frames). lerobot drops
        a frame that finds the queue full; such an episode is refused at commit (its video would be shorter
        than its data). `task` may be left out when it is known only at the end: then `commit(task)` gives it.
        """
        dataset = _episode_dataset(self.spec, self.url.bucket_id, self.staging, encoder_queue_frames)
        return LiveEpisode(self, dataset, task)

    def committed_episodes(self) -> int:
        """How many episodes the bucket's dataset holds (0 when it does not exist yet).

        Raises:
            BadEpisode: the bucket's dataset has other features than this recorder writes (checked here, so a
                recording session stops before its first episode, not after it).
        """
        with self._lock():
            if not self._sync_tail():
                return 0
            self._check_same_features()
            return self._read_info().get("total_episodes", 0)

    # -- steps ---------------------------------------------------------------------------------------------
    def _sync_tail(self) -> bool:
        """Make the local copy hold the bucket's meta/ and the files the next append grows (the last
        episode's data and video files); other recorders may have committed since. Files already here with
        the bucket's Xet hash are kept. Returns whether the bucket holds a dataset."""
        prefix = len(self.url.path) + 1 if self.url.path else 0
        remote = {e.url.path[prefix:]: e for e in self.client.ls(self.url, recursive=True) if isinstance(e, Entry)}
        if self._appending.exists():  # a commit died between its local append and its upload: start afresh
            log.warning("%s: a commit was cut short here; the local copy is read from the bucket again", self.url)
            if self._point_back_cut_commit({rel: e.xet_hash for rel, e in remote.items()}):
                remote = {
                    e.url.path[prefix:]: e for e in self.client.ls(self.url, recursive=True) if isinstance(e, Entry)
                }
            self._forget_local_copy()
        self._synced_info = remote["meta/info.json"].xet_hash if "meta/info.json" in remote else None
        if "meta/info.json" not in remote:
            shutil.rmtree(self.root, ignore_errors=True)
            return False
        known = self._known_hashes()
        for rel in [r for r in remote if r.startswith("meta/")]:
            self._ensure(rel, remote[rel], known)
        tail = self._tail_files()
        for rel in tail:
            self._ensure(rel, remote[rel], known)
        keep = set(tail) | {r for r in remote if r.startswith("meta/")}
        for path in [p for p in self.root.rglob("*") if p.is_file()]:
            if path.relative_to(self.root).as_posix() not in keep:
                path.unlink()  # bounded local disk: only meta/ and the growing files
        self._save_known({rel: known[rel] for rel in keep if rel in known})
        return True

    def _point_back_cut_commit(self, remote: dict[str, str]) -> bool:
        """A commit cut short after uploading grown data or video files but before meta/ left rows and frames that
        no metadata names, which the next append would keep: point those files back at the bytes this copy last
        synced, when nobody committed since (the bucket's meta/info.json is still that sync's). Returns whether
        anything was pointed back."""
        known = self._known_hashes()
        if "meta/info.json" not in known or remote.get("meta/info.json") != known["meta/info.json"]:
            return False
        grown = {rel: h for rel, h in known.items() if not rel.startswith("meta/") and remote.get(rel) != h}
        if not grown:
            return False
        base = f"{self.url.path}/" if self.url.path else ""
        self.client.point_back(self.url, {base + rel: h for rel, h in grown.items()})
        return True

    def _ensure(self, rel: str, entry: Entry, known: dict[str, str]) -> None:
        if (self.root / rel).exists() and known.get(rel) == entry.xet_hash:
            return
        self.client.download(entry, self.root / rel)
        known[rel] = entry.xet_hash

    def _tail_files(self) -> list[str]:
        from .append import growing_files

        return growing_files(self.root)

    def _known_hashes(self) -> dict[str, str]:
        path = self.staging / "hashes.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _save_known(self, hashes: dict[str, str]) -> None:
        (self.staging / "hashes.json").write_text(json.dumps(hashes))

    def _check_same_features(self) -> None:
        if (why := spec_mismatch(self._read_info(), self.spec)) is not None:
            raise BadEpisode(f"{self.url} {why}. Use another dataset URL")

    def _read_info(self) -> dict:
        path = self.root / "meta" / "info.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _push_episode(
        self, episode_root: Path, frames: int, keep_on_failure: bool = False, facts: dict | None = None
    ) -> CommitReport:
        """Append the encoded one-episode dataset at `episode_root` to the bucket's dataset; upload what changed.
        Its files go once committed; after a failure too, unless `keep_on_failure` (a live episode, whose frames
        exist nowhere else, keeps them for another try). `facts`: a line of `EPISODE_FACTS_FILE`, committed with
        the episode (its index added)."""
        episode_bytes = sum(
            p.stat().st_size for sub in ("data", "videos") for p in (episode_root / sub).rglob("*") if p.is_file()
        )
        t1 = time.perf_counter()
        try:
            with self._lock():
                for attempt in range(1, COMMIT_ATTEMPTS + 1):
                    try:
                        index, sent, paths = self._append_and_push(episode_root, facts)
                        break
                    except _CommittedMeanwhile:
                        self._forget_local_copy()
                        if attempt == COMMIT_ATTEMPTS:
                            raise StorageError(
                                f"{self.url}: other recorders kept committing while this one tried "
                                f"{COMMIT_ATTEMPTS} times; nothing of this episode was uploaded"
                            ) from None
                    except BaseException:
                        self._forget_local_copy()  # half-appended files must not be trusted by the next commit
                        raise
            t2 = time.perf_counter()
        except BaseException:
            if not keep_on_failure:
                shutil.rmtree(episode_root.parent, ignore_errors=True)
            raise
        shutil.rmtree(episode_root.parent, ignore_errors=True)
        return CommitReport(index, frames, episode_bytes, sent, 0.0, t2 - t1, paths)

    def _append_and_push(self, episode_root: Path, facts: dict | None = None) -> tuple[int, int, list[str]]:
        from .append import append_episode

        synced = self._sync_tail()
        # From here until the upload is done the local copy is neither the bucket's nor this episode's whole: a
        # process killed meanwhile (a Ray worker, a recorder under kill -9) leaves the mark for the next commit.
        self._appending.touch()
        if synced:
            self._check_same_features()
            before = _snapshot(self.root)
            append_episode(self.root, episode_root, self.url.bucket_id)
        else:
            before = {}
            shutil.copytree(episode_root, self.root)
        index = self._read_info()["total_episodes"] - 1
        if facts is not None:  # meta/ goes up after the data, whole: the line is visible with the episode
            with (self.root / EPISODE_FACTS_FILE).open("a", encoding="utf-8") as f:
                f.write(json.dumps({"episode_index": index, **facts}) + "\n")
        changed = [
            p for p, stamp in _snapshot(self.root).items() if before.get(p) != stamp and not p.startswith("meta/")
        ]
        self._check_not_committed_meanwhile()
        sent, paths = self._push(changed)
        self._appending.unlink()
        return index, sent, paths

    def _check_not_committed_meanwhile(self) -> None:
        """Another recorder whose lock is not ours (another machine, another staging folder) may have committed
        since this one synced: uploading now would overwrite its grown files. Checked just before the upload;
        the window left is the upload itself (a bucket has no compare-and-swap to close it)."""
        try:
            now = self.client.stat(self.url / "meta" / "info.json").xet_hash
        except NotFound:
            now = None
        if now != self._synced_info:
            raise _CommittedMeanwhile

    def _forget_local_copy(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        (self.staging / "hashes.json").unlink(missing_ok=True)
        self._appending.unlink(missing_ok=True)

    @property
    def _appending(self) -> Path:
        """The mark of a local append not uploaded yet (see `_append_and_push`)."""
        return self.staging / "appending"

    def _push(self, changed: list[str]) -> tuple[int, list[str]]:
        """Upload the changed data and video files, then meta/ (so readers never see metadata naming bytes
        that are not there yet). Returns (bytes sent, paths)."""
        staged = self.staging / "push"
        shutil.rmtree(staged, ignore_errors=True)
        for rel in changed:  # hard links: the upload sees exactly these files
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            (staged / rel).hardlink_to(self.root / rel)
        known = self._known_hashes()  # the bucket's files as synced: what to point back at if meta/ fails
        data = self.client.upload(staged, self.url)
        try:
            meta = self.client.upload(self.root / "meta", self.url / "meta")
        except BaseException:
            # Grown data files without the metadata naming their new rows would be appended after by the next
            # commit, out of step with its metadata: point them back at the bytes they held.
            base = f"{self.url.path}/" if self.url.path else ""
            try:
                self.client.point_back(self.url, {base + rel: known.get(rel) for rel in changed})
            except StorageError as error:
                log.error("%s: could not restore the data files after a failed metadata upload: %s", self.url, error)
            raise
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        prefix = len(self.url.path) + 1 if self.url.path else 0
        known.update({f.path[prefix:]: f.xet_hash for f in data.files + meta.files})
        self._save_known(known)
        return data.bytes_sent + meta.bytes_sent, [f.path for f in data.files + meta.files]

    @contextmanager
    def _lock(self) -> Iterator[None]:
        lock = _FileLock(self.staging / ".lock")
        try:
            yield
        finally:
            lock.release()


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    }


class LiveEpisode:
    """An episode being recorded: `add_frame` per frame (or `add_frames` per batch), then `commit()` (or `abort()`
    to drop it). Each frame is checked once, as a frame (`check_frame`), and goes straight to the encoder."""

    def __init__(self, recorder: DatasetRecorder, dataset, task: str | None) -> None:
        self.recorder, self.dataset, self.task = recorder, dataset, task
        self.frames = 0
        self._encode_s: float | None = None  # set once the encoder is flushed (a failed upload may be retried)
        self._aborted = False

    def add_frame(self, frame: dict) -> None:
        """Add one frame in lerobot's frame format (feature name -> array; a "task" in it is ignored). A frame
        that finds the encoder's queue full is dropped, as lerobot does, and the episode refused at commit: a
        robot's control loop must not wait for the encoder.

        Raises:
            BadEpisode: a value does not fit the dataset's features (the episode so far is kept).
        """
        check_frame(self.recorder.spec, frame)
        self._add(frame)

    def add_frames(self, frames: Sequence[dict], wait_s: float = 60.0) -> None:
        """Add frames that arrived together (a batch from the network). All are checked before any is added, so
        a bad one adds none; each then waits (up to `wait_s`) for room in the encoder's queue instead of being
        dropped, so a sender faster than the encoder is slowed down rather than losing its episode.

        Raises:
            BadEpisode: a frame does not fit the dataset's features (none of the batch is added).
        """
        for i, frame in enumerate(frames):
            try:
                check_frame(self.recorder.spec, frame)
            except BadEpisode as error:
                raise BadEpisode(f"frame {i} of the batch: {error}") from None
        for frame in frames:
            deadline = time.monotonic() + wait_s
            while any(q.full() for q in video_encoder_queues(self.dataset.writer)) and time.monotonic() < deadline:
                time.sleep(0.002)
            self._add(frame)

    def _add(self, frame: dict) -> None:
        if self._encode_s is not None:
            raise BadEpisode("the episode is already encoded for its commit: commit it again or abort it")
        self.dataset.add_frame({**frame, "task": self.task or "-"})  # the task is set at commit when not known yet
        self.frames += 1

    def commit(self, task: str | None = None, facts: dict | None = None) -> CommitReport:
        """Finish the episode and commit it; the bucket's dataset then includes it. `task`: the instruction for
        every frame, when it was not known at `begin` (the capture service learns it at close). `facts`: what the
        dataset should say of this episode beside its frames (JSON values: a fleet robot's id, release, seed),
        one line of `meta/fleet_episodes.jsonl` with the episode's index.

        A failed upload keeps the encoded episode: `commit()` may be called again, or `abort()`.

        Raises:
            BadEpisode: no frames were added, no task, or the encoder dropped frames (the episode is dropped).
            robotloop.storage.StorageError: the upload failed (the episode is kept).
        """
        if self._encode_s is None:
            task = task or self.task
            problem = None if task else "the episode has no task"
            if self.frames == 0:
                problem = "the episode has no frames"
            elif dropped := self.dropped_frames():
                problem = (
                    f"the video encoder fell behind and dropped {dropped} frame(s): the episode is not "
                    "committed, since its video would be shorter than its data (record at a lower rate or "
                    "image size, or with a faster codec)"
                )
            if problem:
                self.abort()
                raise BadEpisode(problem)
            t0 = time.perf_counter()
            try:
                _flush(self.dataset, task)
            except BaseException:
                self.abort()
                raise
            self._encode_s = time.perf_counter() - t0
        report = self.recorder._push_episode(Path(self.dataset.root), self.frames, keep_on_failure=True, facts=facts)
        return dataclasses.replace(report, encode_s=self._encode_s)

    def dropped_frames(self) -> int:
        """Frames lerobot's streaming encoder dropped so far (it drops rather than block when its queue is full).
        Read from lerobot's private encoder state (see robotloop.compat): it offers no public counter."""
        return dropped_video_frames(self.dataset.writer)

    def queued_frames(self) -> int:
        """Frames in memory waiting for the video encoder (per camera, summed); 0 once committed or aborted."""
        return sum(q.qsize() for q in video_encoder_queues(self.dataset.writer))

    def abort(self) -> None:
        """Drop the episode: nothing of it reaches the bucket (idempotent)."""
        if self._aborted:
            return
        self._aborted = True
        _drop_episode(self.dataset, writing=self._encode_s is None)


def check_frame(spec: DatasetSpec, frame: dict) -> None:
    """Check one frame in lerobot's frame format against `spec`'s features: exactly its features (plus an optional
    "task"), each with the feature's shape and dtype, floats finite. Done here rather than left to lerobot, whose
    `add_frame` says ValueError for a bad frame and does not look for NaN.

    Raises:
        BadEpisode: naming the first feature that is missing, unknown or does not fit.
    """
    features = spec.features()
    have = set(frame) - {"task"}
    if have != set(features):
        missing, unknown = sorted(set(features) - have), sorted(have - set(features))
        raise BadEpisode(f"frame features do not match the dataset's: missing {missing}, unknown {unknown}")
    for key, feature in features.items():
        name = key.removeprefix("observation.")
        check_array(frame[key], tuple(feature["shape"]), _DTYPES[feature["dtype"]], name)


@dataclass(frozen=True)
class WrittenEpisode:
    """A one-episode dataset `write_episode` encoded, waiting for `DatasetRecorder.commit_written` (picklable)."""

    root: str
    frames: int
    encode_s: float


def write_episode(spec: DatasetSpec, repo_id: str, staging: Path, episode: Episode) -> WrittenEpisode:
    """Encode a whole `episode` with lerobot's writer into a one-episode dataset under `staging`: the expensive part
    of a commit (the video encode), with no bucket involved, so sim workers run it in parallel and the committing
    process only appends and uploads (`DatasetRecorder.commit_written`). `staging` is the recorder's.

    Raises:
        BadEpisode: the episode does not fit `spec` (nothing is written).
    """
    episode.validate(spec.cameras, spec.state_dim, spec.action_dim, spec.fleet)
    t0 = time.perf_counter()
    writer = EpisodeWriter(spec, repo_id, staging, max_frames=len(episode))
    for t in range(len(episode)):
        writer.add(episode_frame(spec, episode, t), check=False)  # validated whole above
    written = writer.finish()
    return dataclasses.replace(written, encode_s=time.perf_counter() - t0)  # a whole episode: all of its encode


class EpisodeWriter:
    """One episode written as it happens, into a one-episode dataset under `staging` (what `write_episode` does for
    a whole one): frames go to lerobot's streaming encoder as they come, so `finish` is left with the encoder's
    tail only. A sim worker streams its demo's frames while it renders them. `max_frames` bounds the encoder's
    queue: up to that many frames never wait for (nor are dropped by) the encoder."""

    def __init__(self, spec: DatasetSpec, repo_id: str, staging: Path, max_frames: int) -> None:
        self.spec, self.frames = spec, 0
        self.dataset = _episode_dataset(spec, repo_id, staging, encoder_queue_frames=max_frames)

    def add(self, frame: dict, check: bool = True) -> None:
        """Add one frame in lerobot's frame format (see `episode_frame`); `check=False` for frames of an `Episode`
        already validated whole.

        Raises:
            BadEpisode: the frame does not fit the spec (the episode is discarded).
        """
        try:
            if check:
                check_frame(self.spec, frame)
            self.dataset.add_frame(frame)
        except BaseException:
            self.discard()
            raise
        self.frames += 1

    def finish(self) -> WrittenEpisode:
        """Flush the encoder's tail and the episode's files; `encode_s` is that tail's time."""
        t0 = time.perf_counter()
        try:
            _flush(self.dataset)
        except BaseException:
            self.discard()
            raise
        return WrittenEpisode(str(self.dataset.root), self.frames, time.perf_counter() - t0)

    def discard(self) -> None:
        """Drop what was written (a failed demo, or an error), as `LiveEpisode.abort` does."""
        with contextlib.suppress(Exception):  # an error may have left lerobot's writer half-closed already
            _drop_episode(self.dataset, writing=True)


def _drop_episode(dataset, writing: bool) -> None:
    """Remove a one-episode dataset's files, stopping its encoder first while it is still `writing`."""
    try:
        if writing:
            dataset.clear_episode_buffer()
            dataset.finalize()
    finally:
        shutil.rmtree(Path(dataset.root).parent, ignore_errors=True)


def import_episode_writer() -> None:
    """Import now what recording an episode imports at its first use: lerobot's dataset writer and the aggregation
    the append uses (~3.5 CPU seconds). A long-lived writer (a robot's fleet recorder) calls it at its start, so
    that the cost falls beside the robot's own start and not inside its first recorded episode."""
    import lerobot.datasets.aggregate  # noqa: F401 - imported for its side effect: loaded once, here
    import lerobot.datasets.lerobot_dataset  # noqa: F401


def _episode_dataset(spec: DatasetSpec, repo_id: str, staging: Path, encoder_queue_frames: int | None):
    """A fresh one-episode lerobot dataset under `staging` whose frames stream into lerobot's video encoder."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    embed_images_only_where_needed()
    root = Path(tempfile.mkdtemp(prefix="episode-", dir=staging)) / "dataset"
    # streaming_encoding: frames go straight to the encoder instead of through temporary PNG files,
    # which cost more than the encode itself (measured: 5.8 s of a 400-frame 480x640 commit).
    return LeRobotDataset.create(
        repo_id,
        fps=spec.fps,
        features=spec.features(),
        root=root,
        robot_type=spec.robot_type,
        streaming_encoding=True,
        encoder_queue_maxsize=encoder_queue_frames or 5 * spec.fps,
        rgb_encoder=RGBEncoderConfig(vcodec=spec.vcodec, preset=spec.vpreset),
    )


def _flush(dataset, task: str | None = None) -> None:
    """Finish the episode's files: the encoder's tail, the parquet footer, the metadata. `task`, when given,
    becomes every frame's task (lerobot takes a task with each frame; a live episode may learn it only at the end)."""
    if task is not None:
        buffer = dataset.writer.episode_buffer
        buffer["task"] = [task] * buffer["size"]
    dataset.save_episode()
    dataset.finalize()


def episode_frame(spec: DatasetSpec, episode: Episode, t: int) -> dict:
    """Frame `t` of `episode` in lerobot's frame format (what `LiveEpisode.add_frame` takes). `episode` may be any
    frames with an Episode's arrays (images, state, action, reward, success), such as a capture batch; the frame
    then has no task. A fleet `spec`'s frames take the episode's intervention and policy action."""
    frame = lerobot_frame(
        spec,
        {name: frames[t] for name, frames in episode.images.items()},
        episode.state[t],
        episode.action[t],
        0.0 if episode.reward is None else float(episode.reward[t]),
        episode.success is not None and bool(episode.success[t]),
        getattr(episode, "task", None),
    )
    if spec.fleet:
        frame[INTERVENTION_KEY] = np.array([bool(episode.intervention[t])])
        frame[POLICY_ACTION_KEY] = np.asarray(episode.policy_action[t], np.float32)
    return frame


def lerobot_frame(
    spec: DatasetSpec, images: dict, state, action, reward: float, success: bool, task: str | None = None
) -> dict:
    """One frame in lerobot's frame format from its parts (reward and success only if `spec` records them)."""
    frame = {image_key(name): image for name, image in images.items()}
    frame[STATE_KEY] = np.asarray(state, np.float32)
    frame[ACTION_KEY] = np.asarray(action, np.float32)
    if spec.with_reward:
        frame[REWARD_KEY] = np.array([reward], np.float32)
        frame[SUCCESS_KEY] = np.array([success])
    if task is not None:
        frame["task"] = task
    return frame


def spec_mismatch(info: dict, spec: DatasetSpec) -> str | None:
    """Why a dataset with this `meta/info.json` cannot take episodes of `spec` (robot type, fps, feature shapes),
    or None when it can. The recorder checks it before each commit; the capture service at open.

    Raises:
        KeyError, TypeError, AttributeError: `info` is not a LeRobot dataset's.
    """
    from lerobot.utils.constants import DEFAULT_FEATURES, OBS_IMAGES

    features = spec.features()
    have = {k: list(v["shape"]) for k, v in info["features"].items() if k not in DEFAULT_FEATURES}
    want = {k: list(v["shape"]) for k, v in features.items()}
    if info.get("robot_type") != spec.robot_type:
        return (
            f"holds episodes of robot type {info.get('robot_type')!r}, not {spec.robot_type!r}: one dataset, one "
            "robot type (lerobot refuses to mix them)"
        )
    if have != want or info.get("fps") != spec.fps:
        return (
            f"holds a dataset with features {have} at {info.get('fps')} fps; episodes here have {want} at "
            f"{spec.fps} fps{_feature_differences(have, want)}"
        )
    cameras = [k for k in features if k.startswith(f"{OBS_IMAGES}.")]
    for key in cameras:
        have_side, want_side = camera_shadow_map(info["features"][key]), camera_shadow_map(features[key])
        if have_side != want_side:
            return (
                f"holds {key} frames rendered with {describe_shadow_map(have_side)}; these episodes are rendered "
                f"with {describe_shadow_map(want_side)}: one dataset, one rendering, so record with the dataset's "
                "shadow map or into a new dataset"
            )
    stored = {(info["features"][k].get("info") or {}).get("video.codec") for k in cameras}
    stored.discard(None)
    ours = stream_codec(spec.vcodec)
    if ours and stored and stored != {ours}:
        return (
            f"holds {'/'.join(sorted(stored))} video; these episodes would be {ours} ({spec.vcodec}): one dataset, "
            "one codec (lerobot refuses to mix them), so record with the dataset's codec or into a new dataset"
        )
    return None


def _feature_differences(have: dict[str, list], want: dict[str, list]) -> str:
    """Which features differ, named (the whole lists are long): " (only the dataset has [...]; ...)", or ""."""
    parts = []
    if only := sorted(set(have) - set(want)):
        parts.append(f"only the dataset has {only}")
    if only := sorted(set(want) - set(have)):
        parts.append(f"only these episodes have {only}")
    if other := sorted(k for k in set(have) & set(want) if have[k] != want[k]):
        parts.append(f"{other} have other shapes")
    if {INTERVENTION_KEY, POLICY_ACTION_KEY} & (set(have) ^ set(want)):
        parts.append(f"{INTERVENTION_KEY!r} and {POLICY_ACTION_KEY!r} are a fleet dataset's columns (fleet=True)")
    return f" ({'; '.join(parts)})" if parts else ""


def stream_codec(vcodec: str) -> str | None:
    """The codec name LeRobot stores in info.json for an encoder name (libsvtav1 -> av1, h264_nvenc -> h264), or
    None where the encoder is chosen at run time ("auto")."""
    from lerobot.configs.video import VIDEO_CODECS_ALIASES

    name = VIDEO_CODECS_ALIASES.get(vcodec, vcodec)
    return next((c for c in ("av1", "h264", "hevc") if c in name), None)


class _CommittedMeanwhile(Exception):
    """Another recorder committed to the dataset after this one synced its local copy."""


class _FileLock:
    """An exclusive lock on a file, held from construction until `release()` (idempotent)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "w")  # noqa: SIM115 - held open for the lock's lifetime, closed in release()
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def release(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
