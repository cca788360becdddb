"""A robot's episodes into a fleet dataset, without ever holding up its control loop.

The control thread calls `begin`, `frame` (each tick) and `end`; they put items on a bounded queue (ticks in groups
of `FRAME_BATCH`) and return.
A writer process streams the frames into a live episode of the fleet dataset (lerobot's streaming encoder, through
`DatasetRecorder.begin`) and, at the episode's end, commits it or drops it as `RecordChoice` says. When the queue is
full (the writer fell behind: a slow upload, a full disk), the episode in progress is dropped and counted, never a
tick; so is an episode whose commit fails (the bucket unreachable). A writer that dies (a crash in an encoder, say)
loses the episodes it held, counted as dropped with its exit code, and the next episode starts a new one. A robot
killed mid-episode loses that episode only: every committed one is a whole commit of the dataset.

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

import contextlib
import importlib.util
import logging
import multiprocessing as mp
import os
import queue
import random
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..capture import DatasetRecorder, DatasetSpec
from ..capture.episode import FleetTally
from ..capture.recorder import lerobot_frame
from ..config import RobotSettings
from ..errors import BadValue, RobotloopError
from ..features import INTERVENTION_KEY, POLICY_ACTION_KEY
from ..storage import BucketClient, BucketUrl

log = logging.getLogger(__name__)

# Ticks go to the writer in groups of this many (or fewer, at an episode's end): one put, one wake-up of the queue's
# feeder thread and of the writer per group instead of per tick. Each wake-up competes with the control thread (the
# feeder for its interpreter lock, the writer for its cores); 10 ticks of 480x640 frames are ~9 MB, a pickle short
# enough not to hold a 50 Hz tick up.
FRAME_BATCH = 10

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


class RecordingStats:
    """Episodes by outcome, counted by the control thread and the writer process alike (shared memory: read it from
    any thread; the heartbeat carries `as_dict()`)."""

    FIELDS = (
        "recorded",  # committed to the fleet dataset
        "dropped",  # lost: the queue was full, the frames did not fit, or the commit failed
        "unfinished",  # the robot stopped (or moved on) before the episode ended: never committed
        "not_kept",  # finished, but not what `RecordChoice` keeps (a success with `failures`), or no frames
        "not_sampled",  # not chosen by the sample share: never streamed
    )

    def __init__(self, ctx: Any) -> None:
        self._counts = {name: ctx.Value("q", 0) for name in self.FIELDS}
        self._error = ctx.Array("c", 400)  # the last error, UTF-8, cut to fit

    def __getattr__(self, name: str) -> int:
        counts = self.__dict__.get("_counts", {})
        if name not in counts:
            raise AttributeError(name)
        return counts[name].value

    def add(self, name: str, error: str | None = None, episodes: int = 1) -> None:
        with self._counts[name].get_lock():
            self._counts[name].value += episodes
        if error is not None:
            self.note(error)

    def note(self, error: str) -> None:
        """Keep `error` as the last one (what the heartbeat and the rounds' report show)."""
        self._error.value = error.encode()[: len(self._error) - 1]

    @property
    def last_error(self) -> str | None:
        return self._error.value.decode(errors="replace") or None

    @property
    def settled(self) -> int:
        """Episodes with an outcome: every field's count."""
        return sum(getattr(self, name) for name in self.FIELDS)

    def as_dict(self) -> dict[str, Any]:
        return {**{name: getattr(self, name) for name in self.FIELDS}, "last_error": self.last_error}


@dataclass
class _Open:
    """The episode the writer streams."""

    episode: int
    facts: EpisodeFacts
    shadow_map: int | None = None  # a sim camera's shadow-map side (`DatasetSpec.shadow_map`)
    live: Any = None  # robotloop.capture.LiveEpisode, begun at the episode's first frame
    tally: FleetTally = field(default_factory=FleetTally)


@dataclass
class _Tick:
    obs: dict
    action: np.ndarray
    policy_action: np.ndarray | None
    intervention: bool
    reward: float | None
    success: bool | None


@dataclass(frozen=True)
class _Target:
    """What the writer process needs to open the fleet dataset (picklable: no client, no lock)."""

    endpoint: str
    token: str | None
    url: str
    choice: RecordChoice
    fps: int
    robot_type: str | None
    vcodec: str
    staging: Path | None = None
    via: tuple[str, str] | None = None  # a capture service's (url, robot token): it writes the dataset


class FleetRecorder:
    """Records a robot's episodes into the fleet dataset at `url` as `choice` says. A writer *process* does the
    work (lerobot's writer, the encoder, the commits and uploads), fed by a queue of `queue_frames`: a thread of the
    robot's own process would share its interpreter lock with the control loop, and on one H200 it cut a 50 Hz
    loop to 38 Hz with 0.5 s gaps at each commit. The dataset is `fps`, `robot_type` and `vcodec`, its features
    the first frame's. `staging`: the writer's local folder (the dataset's meta/ and growing files, each episode's
    files while it records; default the recorder's own under the cache, `DatasetRecorder`). `via`: a capture
    service's (URL, robot token): the writer sends each episode's frames there in batches, and the service, on a
    full install, writes the dataset; so a slim install (no lerobot) records too. `client` is then not written to.

    `frame_batch`: ticks per put (`FRAME_BATCH`). `reserve_frames`: for a robot with time to spare between
    episodes (a sim robot run as fast as the machine, whose writer falls behind), `begin` waits up to
    `reserve_wait_s` for the queue to have room for an episode of this many frames, so that none is dropped for a
    full queue. 0 (a real robot's): `begin` never waits.

    Raises (on construction):
        BadValue: `queue_frames` or `frame_batch` under 1, or `reserve_frames` more than the queue holds.
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
        staging: Path | None = None,
        via: tuple[str, str] | None = None,
        frame_batch: int = FRAME_BATCH,
        reserve_frames: int = 0,
        reserve_wait_s: float = 60.0,
    ) -> None:
        if queue_frames < 1 or frame_batch < 1:
            raise BadValue(
                f"the recording queue takes at least 1 frame, in groups of at least 1: not {queue_frames} frames "
                f"in groups of {frame_batch}"
            )
        if not 0 <= reserve_frames <= queue_frames:
            raise BadValue(f"room for {reserve_frames} frames cannot be waited for in a queue of {queue_frames}")
        self.url, self.choice = url, choice
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: nothing of the robot's threads or CUDA state
        self.stats = RecordingStats(self._ctx)
        self._batch = min(frame_batch, queue_frames)  # a queue of 4 frames still holds no more than 4
        self._queue_items = max(1, queue_frames // self._batch)
        # The items an episode of `reserve_frames` takes: its groups of ticks, its begin and its end.
        self._reserve_items = min(self._queue_items, -(-reserve_frames // self._batch) + 2) if reserve_frames else 0
        self._reserve_wait_s = reserve_wait_s
        self._pending: list[_Tick] = []  # the current episode's ticks not yet put, fewer than `_batch`
        # The last episode the control thread gave up on (the queue was full): the writer skips what it queued of it
        # before. Only the last: which earlier ones were given up goes in band, with the next item put (`_put`).
        self._given_up = self._ctx.Value("q", 0)
        self._unreported: list[int] = []  # episodes given up since the last item put
        self._ready = self._ctx.Event()  # set by the writer once it can take an episode at full speed
        self._rng = random.Random(seed)
        self._episode = 0  # the control thread's current episode number
        self._streaming = False  # whether the control thread's current episode goes to the writer
        self._target = _Target(client.endpoint, client.token, str(url), choice, fps, robot_type, vcodec, staging, via)
        self._start_writer()

    def _start_writer(self) -> None:
        self._queue = self._ctx.Queue(maxsize=self._queue_items)
        self._process = self._ctx.Process(
            target=_writer_main,
            args=(self._target, self._queue, self.stats, self._given_up, self._ready, os.getpid()),
            name="robotloop-fleet-writer",
            daemon=True,
        )
        self._process.start()

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Wait until the writer process has started and imported what it records with (seconds of CPU, once);
        whether it has. Recording needs no wait: episodes queue meanwhile. For a benchmark of the steady state."""
        return self._ready.wait(timeout_s)

    # -- control thread: never waits (but `begin` with `reserve_frames`, between episodes) ----------------------
    def begin(self, facts: EpisodeFacts, shadow_map: int | None = None) -> None:
        """A new episode starts (an episode still open is dropped: its end never came). `shadow_map`: a sim
        camera's shadow-map side (None: gym-aloha's for the frame size), kept in the fleet dataset's features."""
        if not self._process.is_alive():  # a check of the child's status: no wait, at an episode's start only
            self._writer_died()
            # Its start is seconds of imports in its own process; episodes queue meanwhile. It dies with the thread
            # that starts it (`start_worker`): the control thread, which outlives its recording.
            self._start_writer()
        self._flush()  # the last episode's ticks go under its own number (the writer drops that episode)
        self._episode += 1
        self._streaming = self.choice.mode != "off" and self._rng.random() < self.choice.sample
        if self.choice.mode != "off" and not self._streaming:
            self.stats.add("not_sampled")
        if self._streaming:
            self._wait_for_room()
            self._put(("begin", (facts, shadow_map)))

    def _wait_for_room(self) -> None:
        """Up to `reserve_wait_s`, until the queue has room for `reserve_frames` (none asked: no wait)."""
        deadline = time.monotonic() + self._reserve_wait_s
        while self._reserve_items and time.monotonic() < deadline and self._process.is_alive():
            try:
                if self._queue_items - self._queue.qsize() >= self._reserve_items:
                    return
            except NotImplementedError:  # macOS has no qsize: no wait there
                return
            time.sleep(0.02)

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
            self._pending.append(_Tick(obs, action, policy_action, intervention, reward, success))
            if len(self._pending) >= self._batch:
                self._flush()

    def end(self) -> None:
        """The episode ended; the writer commits it if `choice` keeps it."""
        self._flush()
        if self._streaming:  # still: the flush found room
            self._put(("end", None))
            self._streaming = False

    def close(self, timeout_s: float = 120.0) -> None:
        """Finish what is queued (the last episode is committed if it ended), then stop the writer process."""
        self._flush()
        if self._process.is_alive():
            with contextlib.suppress(queue.Full):  # a writer that takes nothing more is killed below
                self._queue.put(("stop", 0, None, tuple(self._unreported)), timeout=timeout_s)
            self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        if self._process.exitcode != 0:
            self._writer_died()

    def _writer_died(self) -> None:
        """The writer process ended without being asked to (or was killed at `close`): the episodes it had not
        settled are counted as dropped, with its exit code."""
        self._pending = []
        # Its queue's feeder thread may be stuck writing into a pipe nobody reads: without this the robot's own
        # exit would wait on it forever (a fleet robot's process hung 10 s, until the driver killed it).
        self._queue.cancel_join_thread()
        lost = self._episode - self.stats.settled if self.choice.mode != "off" else 0
        why = f"the recording writer process died (exit code {self._process.exitcode})"
        if lost > 0:
            why += f": {lost} episode{'s' if lost > 1 else ''} it held never committed"
            self.stats.add("dropped", why, episodes=lost)
        else:
            self.stats.note(why)
        log.warning("fleet recording: %s; the robot goes on", why)

    def _flush(self) -> None:
        if self._pending:
            ticks, self._pending = self._pending, []
            self._put(("frames", ticks))

    def _put(self, item: tuple[str, Any]) -> None:
        """Queue `item` of the current episode, with the episodes given up since the last item put: the writer, which
        may still hold their first ticks, then knows they were counted here (dropped) and are not unfinished."""
        try:
            self._queue.put_nowait((item[0], self._episode, item[1], tuple(self._unreported)))
            self._unreported = []
        except queue.Full:  # the writer fell behind: this episode is given up, never a tick
            self._given_up.value = self._episode
            self._unreported.append(self._episode)
            self._streaming = False
            self.stats.add("dropped", "the recording queue was full")


def _writer_main(target: _Target, items, stats: RecordingStats, given_up, ready, parent_pid: int) -> None:
    """The writer process: stream each episode into the fleet dataset, commit or drop it at its end."""
    from ..workers import start_worker

    start_worker(parent_pid)  # it dies with the robot's process, and logs as it does
    # Only a writer that encodes video itself quiets the encoders: a slim install sending frames to a capture
    # service has no av.
    if target.via is None:
        from ..capture.recorder import import_episode_writer
        from ..output import quiet_encoders

        quiet_encoders()
        import_episode_writer()  # at the robot's start, not inside its first recorded episode
    writer = _Writer(target, stats, given_up)
    ready.set()
    writer.run(items)


class _Writer:
    def __init__(self, target: _Target, stats: RecordingStats, given_up) -> None:
        self.target, self.stats, self.given_up = target, stats, given_up
        self.client = BucketClient(target.endpoint, target.token)
        self.recorder: DatasetRecorder | None = None  # made at the first frame, from its shapes
        self.capture = None  # the capture service's client, with `target.via`
        if target.via is not None:
            from ..capture.client import CaptureClient

            self.capture = CaptureClient(*target.via)

    def run(self, items) -> None:
        current: _Open | None = None
        while True:
            try:
                kind, episode, payload, given_up_since = items.get(timeout=0.2)
            except queue.Empty:  # nothing queued after the episode: if it was given up, its end will never come
                if current is not None and current.episode == self.given_up.value:
                    current = self._abort(current, counted=True)
                continue
            # An episode whose end never came: given up by the control thread (counted there: the item after its last
            # says so), or the robot moved on. Equality, not "up to": the episodes queued whole before a give-up are
            # still committed (a `<=` here lost them uncounted: 9 of 60 in a round's fleet on an H100, 2026-12-06).
            if current is not None and (current.episode != episode or episode == self.given_up.value):
                given = current.episode in given_up_since or current.episode == self.given_up.value
                current = self._abort(current, counted=given)
            if kind == "stop":
                break
            if episode == self.given_up.value:  # the rest of what was queued of the last episode given up
                continue
            try:
                current = self._handle(current, episode, kind, payload)
            # Any error, not only ours and OSError (a frame that does not fit, the bucket, the disk): lerobot
            # reports its video encoder thread crashing (the disk full under it, ENOSPC) as a RuntimeError from
            # add_frame. Caught as (RobotloopError, OSError) only, that killed this process: every later episode
            # was lost, counted only once the queue filled, with no word of the disk (issue 29's disk-full test).
            # One episode's failure must cost that episode only; an error of an unexpected kind is logged whole.
            except Exception as error:
                why = f"{type(error).__name__}: {error}"
                self.stats.add("dropped", why)
                unexpected = not isinstance(error, (RobotloopError, OSError))
                log.warning("fleet recording: an episode was dropped (%s); the robot goes on", why, exc_info=unexpected)
                if current is not None:
                    _drop(current.live)
                current = None
        if current is not None:
            self._abort(current, counted=False)

    def _handle(self, current: _Open | None, episode: int, kind: str, payload: Any) -> _Open | None:
        if kind == "begin":
            return _Open(episode, *payload)
        if current is None:
            return None
        if kind == "frames":
            for tick in payload:
                self._add(current, tick)
            return current
        # end
        if current.live is None:  # an episode of no frames: nothing to keep
            self.stats.add("not_kept")
            return None
        if not self.target.choice.keeps(current.tally.success, current.tally.expert_frames):
            current.live.abort()
            self.stats.add("not_kept")
            return None
        if self.capture is not None:  # the service counts what the frames say itself: the robot's facts only
            current.live.commit({k: v for k, v in asdict(current.facts).items() if k != "task"})
        else:
            current.live.commit(facts=current.tally.facts(asdict(current.facts)))
        self.stats.add("recorded")
        return None

    def _add(self, current: _Open, tick: _Tick) -> None:
        """One tick into the episode's live writer, begun at its first tick."""
        if current.live is None:
            current.live = self._begin(tick, current.facts.task, current.shadow_map)
        if self.capture is not None:
            current.live.add(tick)
        else:
            current.live.add_frame(self._lerobot_frame(tick))
        current.tally.add(tick.intervention, tick.reward, tick.success)

    def _begin(self, tick: _Tick, task: str, shadow_map: int | None) -> Any:
        """The episode's live writer: lerobot's (`LiveEpisode`), or one open on the capture service."""
        if self.capture is None:
            return self._recorder_for(tick, shadow_map).begin(task)
        t = self.target
        cameras = {name: tuple(np.shape(image)) for name, image in tick.obs["pixels"].items()}
        episode_id = self.capture.open(
            t.url, cameras, len(tick.obs["agent_pos"]), len(tick.action), t.fps, t.robot_type, True, shadow_map
        )
        return _ServiceEpisode(self.capture, episode_id, task, t.fps)

    def _recorder_for(self, tick: _Tick, shadow_map: int | None) -> DatasetRecorder:
        """The fleet dataset's recorder, its features from the first frame and its episode's rendering (BadEpisode
        later if one differs)."""
        if self.recorder is None:
            t = self.target
            cameras = {name: tuple(np.shape(image)) for name, image in tick.obs["pixels"].items()}
            spec = DatasetSpec(
                cameras,
                len(tick.obs["agent_pos"]),
                len(tick.action),
                t.fps,
                t.robot_type,
                t.vcodec,
                fleet=True,
                shadow_map=shadow_map,
            )
            self.recorder = DatasetRecorder(self.client, BucketUrl.parse(t.url), spec, t.staging)
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

    def _abort(self, episode: _Open, counted: bool) -> None:
        """Drop an episode whose end never came: the robot stopped or began another (unfinished), or the control
        thread gave it up (`counted`: dropped, counted there)."""
        _drop(episode.live)
        if not counted:
            self.stats.add("unfinished")
        return None


class _ServiceEpisode:
    """An episode open on the capture service: frames go in batches of `BATCH` (one request each, not one a tick),
    the rest at the commit. Same calls as lerobot's `LiveEpisode` where the writer needs them: `commit`, `abort`."""

    BATCH = 50  # a second of a 50 Hz robot: ~46 MB of 480x640 frames in one request at most

    def __init__(self, capture: Any, episode_id: str, task: str, fps: int) -> None:
        self.capture, self.episode_id, self.task, self.fps = capture, episode_id, task, fps
        self.ticks: list[_Tick] = []
        self.sent = 0

    def add(self, tick: _Tick) -> None:
        self.ticks.append(tick)
        if len(self.ticks) >= self.BATCH:
            self._flush()

    def commit(self, facts: dict[str, Any]) -> None:
        self._flush()
        self.capture.close(self.episode_id, self.task, facts)

    def abort(self) -> None:
        self.capture.abort(self.episode_id)

    def _flush(self) -> None:
        if not self.ticks:
            return
        ticks, self.ticks = self.ticks, []
        action_dim = len(ticks[0].action)
        self.capture.send_frames(
            self.episode_id,
            timestamp=(self.sent + np.arange(len(ticks))) / self.fps,
            state=[t.obs["agent_pos"] for t in ticks],
            action=[t.action for t in ticks],
            images={name: np.stack([t.obs["pixels"][name] for t in ticks]) for name in ticks[0].obs["pixels"]},
            reward=[t.reward or 0.0 for t in ticks],
            success=[bool(t.success) for t in ticks],
            intervention=[t.intervention for t in ticks],
            policy_action=[t.policy_action if t.policy_action is not None else np.zeros(action_dim) for t in ticks],
        )
        self.sent += len(ticks)


def _drop(live: Any) -> None:
    """Abort a live episode (None: it had not begun). Its files go whatever happens (`LiveEpisode.abort` removes them
    in a `finally`); an encoder that already failed may fail again as it is stopped, and must not take the writer
    process down with it."""
    if live is not None:
        with contextlib.suppress(Exception):
            live.abort()


def fleet_recorder(
    settings: RobotSettings, client: BucketClient, fps: int = 50, robot_type: str | None = "aloha"
) -> FleetRecorder | None:
    """The recorder `settings` (a robot's: `record`, `record_to`, `record_sample`, `record_queue_frames`) ask for;
    None when the robot records nothing. The sample is drawn from a seed of the robot's id: reproducible per robot.

    Raises:
        BadValue: recording without `record_to`, or a bad URL there, or on a slim install (no lerobot).
    """
    if settings.record == "off":
        return None
    if not settings.record_to:
        raise BadValue("recording needs the fleet dataset's URL: robot.record_to (robot run --record-to)")
    via = None
    if settings.record_via:
        if settings.record_token is None:
            raise BadValue("recording through a capture service needs this robot's token there: robot.record_token")
        via = (settings.record_via, settings.record_token.get_secret_value())
    elif importlib.util.find_spec("lerobot") is None:  # the writer process would die on its first episode
        raise BadValue(
            "recording episodes writes LeRobot datasets, and lerobot is not installed here (a slim "
            "'robotloop[robot]' install): send them through a capture service (--record-via URL --record-token "
            "TOKEN), install 'robotloop[full]' on this robot, or run it with --record off"
        )
    return FleetRecorder(
        client,
        BucketUrl.parse(settings.record_to),
        RecordChoice(settings.record, settings.record_sample),
        fps=fps,
        robot_type=robot_type,
        queue_frames=settings.record_queue_frames,
        seed=zlib.crc32((settings.robot_id or "").encode()),
        via=via,
    )


__all__ = ["EpisodeFacts", "FleetRecorder", "RecordChoice", "RecordMode", "RecordingStats", "fleet_recorder"]
