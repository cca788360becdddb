"""A robot's episodes into a fleet dataset, without ever holding up its control loop.

The control thread calls `begin`, `frame` (each tick) and `end`; each puts one item on a bounded queue and returns.
A writer thread streams the frames into a live episode of the fleet dataset (lerobot's streaming encoder, through
`DatasetRecorder.begin`) and, at the episode's end, commits it or drops it as `RecordChoice` says. When the queue is
full (the writer fell behind: a slow upload, a full disk), the episode in progress is dropped and counted, never a
tick; so is an episode whose commit fails (the bucket unreachable). A robot killed mid-episode loses that episode
only: every committed one is a whole commit of the dataset.

The dataset's features come from the robot's first frame (its cameras, state and action sizes), so a sim camera
sized by its first release records at that size: `DatasetSpec(..., fleet=True)`, the demos' features plus
`intervention` and `policy_action`.

Example:
    ```python
    >>> fleet = FleetRecorder(client, BucketUrl.parse("hf://buckets/lab/fleet/datasets/cube"), RecordChoice("all"))
    >>> fleet.begin(EpisodeFacts("r1", "v7", "transfer the cube", seed=12))
    >>> fleet.frame(obs, action, policy_action=action, intervention=False, reward=0.0, success=False)
    >>> fleet.end()
    >>> fleet.close(); fleet.stats.recorded
    ```
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from ..capture import DatasetRecorder, DatasetSpec
from ..capture.recorder import INTERVENTION_KEY, POLICY_ACTION_KEY, lerobot_frame
from ..config import RobotSettings
from ..errors import BadValue, RobotloopError
from ..storage import BucketClient, BucketUrl

log = logging.getLogger(__name__)

RecordMode = Literal["off", "failures", "all"]


@dataclass(frozen=True)
class RecordChoice:
    """Which episodes a robot records: `off`, only `failures` (an episode that did not succeed; without a reward,
    one in which the expert took over), or `all`; of those, a `sample` share chosen at random at each episode's
    start (an episode not chosen is never streamed)."""

    mode: RecordMode = "off"
    sample: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ("off", "failures", "all"):
            raise BadValue(f"record mode must be off, failures or all, not '{self.mode}'")
        if not 0.0 < self.sample <= 1.0:
            raise BadValue(f"the record sample is a share of episodes, in (0, 1], not {self.sample}")

    def keeps(self, success: bool | None, expert_frames: int) -> bool:
        """Whether a finished episode is committed."""
        if self.mode == "all":
            return True
        if self.mode == "failures":
            return expert_frames > 0 if success is None else not success
        return False


@dataclass(frozen=True)
class EpisodeFacts:
    """What the fleet dataset says of an episode beside its frames (`meta/fleet_episodes.jsonl`)."""

    robot_id: str
    release: str | None
    task: str
    seed: int | None = None  # the sim's seed, or a scene id


@dataclass
class RecordingStats:
    """Episodes by outcome (read from any thread; the heartbeat carries them)."""

    recorded: int = 0  # committed to the fleet dataset
    dropped: int = 0  # lost: the queue was full, the frames did not fit, or the commit failed
    unfinished: int = 0  # the robot stopped (or moved on) before the episode ended: never committed
    not_kept: int = 0  # finished, but not what `RecordChoice` keeps (a success with `failures`)
    not_sampled: int = 0  # not chosen by the sample share: never streamed
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Open:
    """The episode the writer streams."""

    episode: int
    facts: EpisodeFacts
    live: Any = None  # robotloop.capture.LiveEpisode, begun at the episode's first frame
    expert_frames: int = 0
    max_reward: float | None = None
    success: bool | None = None
    frames: int = 0


@dataclass
class _Tick:
    obs: dict
    action: np.ndarray
    policy_action: np.ndarray | None
    intervention: bool
    reward: float | None
    success: bool | None


class FleetRecorder:
    """Records a robot's episodes into the fleet dataset at `url` as `choice` says, through a writer thread fed by
    a queue of `queue_frames`; the dataset is `fps`, `robot_type` and `vcodec`, its features the first frame's.

    Raises (on construction):
        BadValue: `queue_frames` under 1.
    """

    def __init__(
        self,
        client: BucketClient,
        url: BucketUrl,
        choice: RecordChoice,
        fps: int = 50,
        robot_type: str | None = "aloha",
        vcodec: str = "h264",
        queue_frames: int = 1000,
        seed: int = 0,
    ) -> None:
        if queue_frames < 1:
            raise BadValue(f"the recording queue holds at least 1 frame, not {queue_frames}")
        self.client, self.url, self.choice = client, url, choice
        self._dataset = dict(fps=fps, robot_type=robot_type, vcodec=vcodec)
        self.recorder: DatasetRecorder | None = None  # made at the first frame, from its shapes
        self.stats = RecordingStats()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_frames)
        self._rng = random.Random(seed)
        self._episode = 0  # the control thread's current episode number
        self._streaming = False  # whether the control thread's current episode goes to the writer
        self._dropped: set[int] = set()  # episodes the control thread gave up on (the queue was full)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, name="robotloop-fleet-recorder", daemon=True)
        self._thread.start()

    # -- control thread: never waits ----------------------------------------------------------------------------
    def begin(self, facts: EpisodeFacts) -> None:
        """A new episode starts (an episode still open is dropped: its end never came)."""
        self._episode += 1
        self._streaming = self.choice.mode != "off" and self._rng.random() < self.choice.sample
        if self.choice.mode != "off" and not self._streaming:
            self.stats.not_sampled += 1
        if self._streaming:
            self._put(("begin", facts))

    def frame(
        self,
        obs: dict,
        action: np.ndarray,
        policy_action: np.ndarray | None,
        intervention: bool,
        reward: float | None,
        success: bool | None,
    ) -> None:
        """The tick's observation (before `action`), the action sent, what the policy proposed (None: it did not
        run), whether the expert drove, and the reward and success after the action (None without a reward)."""
        if self._streaming:
            self._put(("frame", _Tick(obs, action, policy_action, intervention, reward, success)))

    def end(self) -> None:
        """The episode ended; the writer commits it if `choice` keeps it."""
        if self._streaming:
            self._put(("end", None))
            self._streaming = False

    def close(self, timeout_s: float = 60.0) -> None:
        """Finish what is queued (the last episode is committed if it ended), then stop the writer."""
        self._stop.set()
        self._thread.join(timeout_s)

    def _put(self, item: tuple[str, Any]) -> None:
        try:
            self._queue.put_nowait((self._episode, *item))
        except queue.Full:  # the writer fell behind: this episode is given up, never a tick
            self._dropped.add(self._episode)
            self._streaming = False
            self.stats.dropped += 1
            self.stats.last_error = "the recording queue was full"

    # -- writer thread ------------------------------------------------------------------------------------------
    def _write(self) -> None:
        current: _Open | None = None
        while True:
            try:
                episode, kind, payload = self._queue.get(timeout=0.2)
            except queue.Empty:
                if current is not None and current.episode in self._dropped:
                    current = self._abort(current)
                if self._stop.is_set():
                    break
                continue
            if current is not None and (current.episode != episode or current.episode in self._dropped):
                current = self._abort(current)  # its end never came: dropped, or the robot moved on
            if episode in self._dropped:
                continue
            try:
                current = self._handle(current, episode, kind, payload)
            except (RobotloopError, OSError) as error:  # a frame that does not fit, the bucket, the disk
                self._count_drop(f"{type(error).__name__}: {error}")
                if current is not None and current.live is not None:
                    current.live.abort()
                current = None
        if current is not None:
            self._abort(current)

    def _handle(self, current: _Open | None, episode: int, kind: str, payload: Any) -> _Open | None:
        if kind == "begin":
            return _Open(episode, payload)
        if current is None:
            return None
        if kind == "frame":
            if current.live is None:
                current.live = self._recorder_for(payload).begin(current.facts.task)
            current.live.add_frame(self._lerobot_frame(payload))
            current.frames += 1
            current.expert_frames += int(payload.intervention)
            if payload.reward is not None:
                current.max_reward = max(current.max_reward or 0.0, payload.reward)
            if payload.success is not None:
                current.success = bool(current.success) or payload.success
            return current
        # end
        if current.live is None:  # an episode of no frames
            return None
        if not self.choice.keeps(current.success, current.expert_frames):
            current.live.abort()
            self.stats.not_kept += 1
            return None
        current.live.commit(facts=self._facts(current))
        self.stats.recorded += 1
        return None

    def _recorder_for(self, tick: _Tick) -> DatasetRecorder:
        """The fleet dataset's recorder, its features from the first frame (BadEpisode later if one differs)."""
        if self.recorder is None:
            cameras = {name: tuple(np.shape(image)) for name, image in tick.obs["pixels"].items()}
            spec = DatasetSpec(
                cameras, len(tick.obs["agent_pos"]), len(tick.action), **self._dataset, with_reward=True, fleet=True
            )
            self.recorder = DatasetRecorder(self.client, self.url, spec)
            self.recorder.committed_episodes()  # BadEpisode now if the bucket's dataset has other features
        return self.recorder

    def _lerobot_frame(self, tick: _Tick) -> dict:
        spec = self.recorder.spec
        success = bool(tick.success) if tick.success is not None else False
        frame = lerobot_frame(spec, tick.obs["pixels"], tick.obs["agent_pos"], tick.action, tick.reward or 0.0, success)
        frame[INTERVENTION_KEY] = np.array([tick.intervention])
        policy = tick.policy_action if tick.policy_action is not None else np.zeros(spec.action_dim, np.float32)
        frame[POLICY_ACTION_KEY] = np.asarray(policy, np.float32)
        return frame

    @staticmethod
    def _facts(episode: _Open) -> dict[str, Any]:
        kind = "takeover" if 0 < episode.expert_frames < episode.frames else "autonomous"
        if episode.frames and episode.expert_frames == episode.frames:
            kind = "expert"
        return {
            **asdict(episode.facts),
            "success": episode.success,
            "max_reward": episode.max_reward,
            "frames": episode.frames,
            "expert_frames": episode.expert_frames,
            "kind": kind,
        }

    def _abort(self, episode: _Open) -> None:
        """Drop an episode whose end never came: the robot stopped or began another (unfinished), or the control
        thread gave it up (dropped, counted there)."""
        if episode.live is not None:
            episode.live.abort()
        if episode.episode not in self._dropped:
            self.stats.unfinished += 1
        return None

    def _count_drop(self, why: str) -> None:
        self.stats.dropped += 1
        self.stats.last_error = why
        log.warning("fleet recording: an episode was dropped (%s); the robot goes on", why)


def fleet_recorder(
    settings: RobotSettings, client: BucketClient, fps: int = 50, robot_type: str | None = "aloha"
) -> FleetRecorder | None:
    """The recorder `settings` (a robot's: `record`, `record_to`, `record_sample`, `record_queue_frames`) ask for;
    None when the robot records nothing. The sample is drawn from a seed of the robot's id: reproducible per robot.

    Raises:
        BadValue: recording without `record_to`, or a bad URL there.
    """
    if settings.record == "off":
        return None
    if not settings.record_to:
        raise BadValue("recording needs the fleet dataset's URL: robot.record_to (robot run --record-to)")
    return FleetRecorder(
        client,
        BucketUrl.parse(settings.record_to),
        RecordChoice(settings.record, settings.record_sample),
        fps=fps,
        robot_type=robot_type,
        queue_frames=settings.record_queue_frames,
        seed=zlib.crc32((settings.robot_id or "").encode()),
    )


__all__ = ["EpisodeFacts", "FleetRecorder", "RecordChoice", "RecordMode", "RecordingStats", "fleet_recorder"]
