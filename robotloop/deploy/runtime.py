"""The robot runtime: run the assigned release at the control rate, hot-swap new ones, roll back on trouble.

Three threads:
- control (the caller's): one action per tick at `env.rate_hz`. At a chunk boundary of the running policy it
  swaps in a loaded standby policy (a pointer swap: no tick is skipped), and it rolls back by itself when the
  running release produces a non-finite action or fails its health check.
- updater: long-polls the deploy service for this robot's assignment; on a change it pulls the release into the
  local store (signature, then hashes, checked before anything is loaded; only missing bytes travel), verifies
  it again, loads it with `load_policy` (its ONNX export on ONNX Runtime or its checkpoint on torch, as
  `robot.backend` says) and runs one warm-up pass, then hands it to the control thread. The control thread runs
  either alike (`robotloop.deploy.policy.Policy`).
- reporter (`Reporter`, in `robotloop.deploy.reporter`): heartbeats (running release, control rate, longest tick
  gap, health) and swap/rollback/refused events, so the control thread never waits on the network.

What the robot learns about each release (refused, skipped, failing to fetch, scored, the last good one) is kept
in one `ReleaseLedger` (`robotloop.deploy.ledger`); the loaded policies and the swap between them in
`PolicySlots`, and the probation's verdict in `HealthCheck` (`robotloop.deploy.swap`); the updater thread is an
`Updater` (`robotloop.deploy.updater`).

Health check (plain): every finished episode gets a score, by default its highest staged sim reward (0-4 for
ALOHA; 4 = success). A new release is on probation for its first `health_window` whole episodes (episodes that a
swap cut in two count for neither release); if their mean score is below the previous release's mean over its
last `health_window` episodes by more than `health_margin`, the robot rolls back. With no score (hardware
without a reward) only load failures and non-finite actions trigger a rollback.

A refused or rolled-back release is not tried again by this robot (the list survives restarts, in
`<store>/runtime.json`); publish a fixed one under a new name. A release whose inputs do not fit the robot's
observations (camera size, state size) is skipped only until the robot restarts: that is often the robot's setup.
A sim robot started without a camera size (`SimControlEnv(image_size=FROM_POLICY)`) renders at the size of the first
release it loads (what its policy takes, `PolicyRunner.image_size`), then keeps that size, as a camera would.

Example:
    ```python
    >>> runtime = RobotRuntime(SimControlEnv("transfer_cube", (48, 64)), DeployClient(url, robot_token),
    ...                        ReleaseStore(store_dir), load_public_keys([Path("deploy.pub")]),
    ...                        RobotSettings(robot_id="r1"), fetcher_for=lambda bucket: XetFetcher(ep, tok, bucket))
    >>> runtime.run(duration_s=60)
    ```
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import RobotSettings
from ..errors import BadValue
from ..fleet import EpisodeFacts, FleetRecorder, Takeovers
from .client import DeployClient, describe_event
from .envs import StepResult
from .fetch import XetFetcher
from .ledger import ReleaseLedger
from .reporter import Reporter
from .store import PullReport, ReleaseStore
from .swap import HealthCheck, PolicySlots, Snapshot
from .updater import Updater

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeResult:
    """One whole episode of one release. `max_reward`/`success` are None on hardware."""

    release: str
    steps: int
    max_reward: float | None
    success: bool | None
    action_jerk: float  # mean |a_t - a_{t-1}| over the episode: how smooth the commands were


def default_score(result: EpisodeResult) -> float | None:
    """The episode's highest staged reward (ALOHA: 0-4, 4 = success); None without a reward."""
    return result.max_reward


@dataclass
class _EpisodeTally:
    """The episode in progress: what its `EpisodeResult` will say."""

    release: str | None
    mixed: bool  # started with nothing to run, or a swap or rollback cut it in two: it counts for no release
    steps: int = 0
    max_reward: float | None = None
    success: bool | None = None
    jerk: float = 0.0  # sum of |a_t - a_{t-1}|
    last: np.ndarray | None = None

    def track(self, action: np.ndarray, result: StepResult) -> None:
        self.steps += 1
        if self.last is not None:
            self.jerk += float(np.abs(action - self.last).mean())
        self.last = np.array(action, copy=True)
        if result.reward is not None:
            self.max_reward = max(self.max_reward or 0.0, result.reward)
            self.success = bool(self.success) or bool(result.success)

    def result(self) -> EpisodeResult | None:
        """The whole episode of one release; None for one that counts for no release."""
        if self.mixed or self.release is None:
            return None
        return EpisodeResult(
            self.release, self.steps, self.max_reward, self.success, self.jerk / max(1, self.steps - 1)
        )


@dataclass
class RuntimeStats:
    """What the runtime did; read it from another thread for tests and benchmarks."""

    steps: int = 0
    episodes: list[EpisodeResult] = field(default_factory=list)
    # release, previous, at (monotonic), gap_s, mid_episode, max_gap_before_s
    swaps: list[dict[str, Any]] = field(default_factory=list)
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # release (back to), previous, reason
    refused: list[dict[str, Any]] = field(default_factory=list)  # release, reason
    pulls: list[PullReport] = field(default_factory=list)
    assigned_at: dict[str, float] = field(default_factory=dict)  # release -> monotonic time the assignment arrived
    pulled_at: dict[str, float] = field(default_factory=dict)  # release -> fetched and verified, not yet loaded
    loaded_at: dict[str, float] = field(default_factory=dict)  # release -> its policy loaded, not yet warmed up
    ready_at: dict[str, float] = field(default_factory=dict)  # release -> loaded and warmed up, waiting to swap
    max_gap_s: float = 0.0  # longest interval between two actions within an episode
    control_hz: float | None = None  # the rate actually reached over the last window (RateWatch)
    recording: Any = None  # the fleet recorder's RecordingStats, when the robot records its episodes
    takeovers: Any = None  # the expert's TakeoverStats, when an expert may take over
    finished: int = 0  # episodes of a release run to their end (mixed ones and takeovers included)


@dataclass
class RateWatch:
    """The control rate actually reached, over windows of `window_s` within an episode; warns (at most once a
    minute) when it falls under 90% of the target: each tick (policy, robot I/O) takes longer than its period."""

    target_hz: float
    window_s: float = 5.0
    last_hz: float | None = None
    _t0: float = field(default_factory=time.monotonic)
    _steps: int = 0
    _warned_at: float = -math.inf

    def restart(self) -> None:
        """A new episode, or a tick with nothing to run: an episode's reset and time spent holding still (waiting
        for the first release, or after a rollback to none) are not control time."""
        self._t0, self._steps = time.monotonic(), 0

    def tick(self) -> None:
        self._steps += 1
        now = time.monotonic()
        if now - self._t0 < self.window_s:
            return
        self.last_hz = self._steps / (now - self._t0)
        self._t0, self._steps = now, 0
        slow = math.isfinite(self.target_hz) and self.last_hz < 0.9 * self.target_hz
        if slow and now - self._warned_at > 60.0:
            self._warned_at = now
            log.warning(
                "control runs at %.1f Hz, under the %g Hz it should: a tick (policy step and robot I/O) takes "
                "longer than its %.0f ms period",
                self.last_hz,
                self.target_hz,
                1e3 / self.target_hz,
            )


class RobotRuntime:
    """Runs the release assigned to one robot, and moves it to the next one safely (see the module docstring).

    It is made of parts that each hold one concern, wired here:

    - `slots` (`PolicySlots`): the loaded policies (active, standby, previous) and the swap between them;
    - `health` (`HealthCheck`): whether a release on probation passes, from its episodes' scores;
    - `ledger` (`ReleaseLedger`): what the robot knows of each release (refused, skipped, failing, scored);
    - the `Updater` (its own thread): assignment, pull, verify, load, warm up, offer as standby;
    - the `Reporter` (its own thread): events and heartbeats to the deploy service;
    - `stats` (`RuntimeStats`): what happened, for tests, benchmarks and `robotloop robot run`'s summary.

    The runtime itself is the control loop (`run()` runs it in the caller's thread and starts and joins the other
    two), and the one place a refusal or a rollback is recorded and reported (`_refuse`).

    Raises (on construction):
        BadValue: `options.robot_id` is empty.
    """

    def __init__(
        self,
        env: Any,
        deploy: DeployClient,
        store: ReleaseStore,
        trusted: dict,
        options: RobotSettings,
        fetcher_for: Callable[[str], XetFetcher],
        score: Callable[[EpisodeResult], float | None] = default_score,
        recording: FleetRecorder | None = None,
        takeovers: Takeovers | None = None,
    ) -> None:
        if not options.robot_id:
            raise BadValue("a robot runtime needs RobotSettings.robot_id (the id registered with the deploy service)")
        self.env, self.deploy, self.store, self.options, self.score = env, deploy, store, options, score
        # Every episode run goes to the fleet recorder (which keeps what its RecordChoice says); it never waits.
        self.recording = recording
        # Who drives each tick: the policy, or the expert after a stall (its episodes count for no release's health).
        self.takeovers = takeovers
        self.stats = RuntimeStats(
            recording=recording.stats if recording is not None else None,
            takeovers=takeovers.stats if takeovers is not None else None,
        )
        self._stop = threading.Event()
        self._episodes_wanted: int | None = None
        self._stop_when_refused = False
        self._latest_obs: dict | None = None
        self._first_frame = threading.Event()  # set with the first observation: warm-ups wait for it
        # A sim camera sized by the first policy (`SimControlEnv(image_size=FROM_POLICY)`): the updater asks for a
        # size, the control thread (the one that renders) builds the sim and renders the first frame.
        self._camera_wanted: tuple[tuple[int, int] | None, int | None] | None = None  # size, shadow map
        self._camera_error: Exception | None = None
        self.slots = PolicySlots()
        self.ledger = ReleaseLedger.load(store.root / "runtime.json", options.health_window)
        self.health = HealthCheck(self.slots, self.ledger, options.health_window, options.health_margin)
        self._reporter = Reporter(deploy, options, self.stats, self.ledger, self._snapshot, self._stop)
        self._updater = Updater(
            deploy,
            store,
            trusted,
            options,
            fetcher_for,
            self.slots,
            self.ledger,
            self.stats,
            self._observation_for,
            self._refuse,
            self._stop,
        )

    # -- public ----------------------------------------------------------------------------------------------
    @property
    def running(self) -> str | None:
        return self.slots.running

    @property
    def backend(self) -> str | None:
        """What runs the running release, e.g. ``onnx (CPUExecutionProvider)`` or ``torch (cpu)``; None: nothing."""
        active = self.slots.active
        return f"{active.runner.backend} ({active.runner.runs_on})" if active is not None else None

    def stop(self) -> None:
        """End `run()`: the control loop after its step, a pull in progress at its next block (staged pieces
        are kept, so the next start resumes it)."""
        self._stop.set()

    def run(
        self, duration_s: float | None = None, episodes: int | None = None, stop_when_refused: bool = False
    ) -> RuntimeStats:
        """Run until `stop()` (or `duration_s`, or `episodes` finished episodes of a release: a sim robot's
        share of a fleet round); starts and joins the updater and reporter threads. With `stop_when_refused`, a
        release refused or rolled back also stops the robot (its `stats` say why): a robot given one release to run
        (a fleet round's) would otherwise hold still, waiting for another that never comes."""
        self._episodes_wanted = episodes
        self._stop_when_refused = stop_when_refused
        threads = [
            threading.Thread(target=self._updater.run, name="robotloop-updater", daemon=True),
            threading.Thread(target=self._reporter.run, name="robotloop-reporter", daemon=True),
        ]
        self._updater.resume_installed()
        for thread in threads:
            thread.start()
        try:
            self._control(time.monotonic() + duration_s if duration_s else None)
        finally:
            self._stop.set()
            for thread in threads:  # a long-poll in flight is not waited for: the threads are daemons
                thread.join(timeout=2.0)
        return self.stats

    # -- control thread --------------------------------------------------------------------------------------
    def _control(self, deadline: float | None) -> None:
        period = 1.0 / self.env.rate_hz  # 0 for a sim run as fast as it goes (rate_hz inf)
        idle = max(period, 0.02)  # holding still (nothing to run yet) never spins
        rate = RateWatch(self.env.rate_hz)
        obs, episode = self._new_episode() if _sized(self.env) else (None, None)
        tick, last_action = time.monotonic(), None
        while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
            if obs is None:  # a camera waiting for the first policy's size: nothing renders until it is asked for
                obs, episode = self._fit_camera()
                if obs is None:
                    tick = _sleep_until(tick + idle)
                    continue
            swapped = self._maybe_swap(last_action)
            if swapped and episode.release is None and episode.steps == 0:
                obs, episode = self._new_episode()  # the first release: its first episode starts with it, whole
            elif swapped:
                episode.mixed = True
            active = self.slots.active
            if active is None:  # nothing to run yet: hold still, keep the camera fresh for warm-ups
                rate.restart()  # else the first window would count the wait, and warn of a rate never run at
                tick = _sleep_until(tick + idle)
                continue
            seen, expert = obs, False
            try:
                if self.takeovers is not None and self.takeovers.handing_back:
                    active.runner.replan()  # its queued chunk was planned before the expert drove
                policy_action = action = active.runner.act(obs)
                if self.takeovers is not None:
                    action, expert = self.takeovers.choose(policy_action, obs)
                obs, result = self.env.step(action)  # ValueError: an action the robot cannot take (shape, NaN)
            except (RuntimeError, ValueError) as error:  # NonFiniteAction, or a policy that does not fit this robot
                self._rollback(f"{type(error).__name__}: {error}")
                episode.mixed = True
                continue
            now = time.monotonic()
            if last_action is not None:
                self.stats.max_gap_s = max(self.stats.max_gap_s, now - last_action)
                if swapped:
                    self.stats.swaps[-1]["gap_s"] = now - last_action
            last_action = now
            self._latest_obs = obs
            self.stats.steps += 1
            rate.tick()
            self.stats.control_hz = rate.last_hz
            episode.track(action, result)
            episode.mixed |= expert  # the expert's success is not the release's
            if self.recording is not None:
                self.recording.frame(seen, action, policy_action, expert, result.reward, result.success)
            over = self.takeovers is not None and self.takeovers.after(result.reward, result.success)
            if result.done or over:
                if self.recording is not None:
                    self.recording.end()
                self._finish(episode)
                if self._episodes_wanted is not None and self.stats.finished >= self._episodes_wanted:
                    break
                obs, episode = self._new_episode()
                last_action = None  # an episode reset is not a control gap
                tick = time.monotonic()
                rate.restart()
            tick = _sleep_until(tick + period)

    def _fit_camera(self) -> tuple[dict | None, _EpisodeTally | None]:
        """Build a camera sized by the first policy, once the updater asks (`_observation_for`); the first episode."""
        wanted, self._camera_wanted = self._camera_wanted, None
        if wanted is None:
            return None, None
        try:
            self.env.fit(*wanted)
        except ValueError as error:  # a size the sim cannot render: that release does not fit this robot
            self._camera_error = error
            return None, None
        return self._new_episode()

    def _observation_for(self, runner: Any) -> dict | None:
        """Updater thread: the observation to warm `runner` up on, the latest one, once the control thread has one
        (a warm-up skipped for want of it would let a policy that does not fit the robot drive it, and be rolled
        back for good). A camera that takes its size from the first policy is sized for `runner` first
        (`PolicyRunner.image_size` and `.shadow_map`, what `robotloop eval` renders). None when the runtime stops first.

        Raises:
            ValueError: the sim cannot render the policy's size (the updater skips that release).
        """
        if not _sized(self.env) and not self._first_frame.is_set():
            self._camera_wanted = (runner.image_size, runner.shadow_map)
        while not self._first_frame.wait(0.1):
            error, self._camera_error = self._camera_error, None
            if error is not None:
                raise error
            if self._stop.is_set():
                return None
        return self._latest_obs

    def _new_episode(self) -> tuple[dict, _EpisodeTally]:
        obs = self.env.reset()
        self._latest_obs = obs
        self._first_frame.set()
        active = self.slots.active
        if active is not None:
            active.runner.reset()
        if self.takeovers is not None:
            self.takeovers.begin()
        if self.recording is not None and active is not None:  # what a release does; not the wait for the first
            task = getattr(self.env, "instruction", None) or getattr(self.env, "task", None) or "-"
            seed = getattr(self.env, "seed", None)
            facts = EpisodeFacts(self.options.robot_id, active.release, task, seed)
            self.recording.begin(facts, getattr(self.env, "shadow_map", None))  # a sim camera's rendering
        return obs, _EpisodeTally(active.release if active else None, mixed=active is None)

    def _finish(self, episode: _EpisodeTally) -> None:
        self.stats.finished += episode.release is not None
        result = episode.result()
        if result is None:
            return
        self.stats.episodes.append(result)
        failed = self.health.finished(result, self.score(result))
        if failed:
            self._rollback(failed)

    def _maybe_swap(self, last_action: float | None) -> bool:
        def record(release: str, was: str | None) -> None:
            # Recorded before the new release is visible as `running`; gap_s (set after the first action of the
            # new release) exists only for a swap within an episode.
            self.stats.swaps.append(
                {
                    "release": release,
                    "previous": was,
                    "at": time.monotonic(),
                    "gap_s": None,
                    "mid_episode": last_action is not None,
                    "max_gap_before_s": self.stats.max_gap_s,  # the worst the loop had done before, to judge by
                }
            )

        swapped = self.slots.swap(lambda release: release not in self.ledger.scores, record)
        if swapped is None:
            return False
        release, was = swapped
        self._reporter.event("swap", release, was, "")
        log.info("%s", describe_event("swap", release, was))  # a normal swap: not a warning
        return True

    def _rollback(self, reason: str) -> None:
        bad, back = self.slots.roll_back()
        self._refuse(bad, reason, kind="rollback", back=back)

    def _refuse(self, release: str | None, reason: str, kind: str, back: str | None, for_good: bool = True) -> None:
        """Report a refused or rolled-back release; `for_good` also keeps it out across restarts (runtime.json)."""
        # Events name the release now running and the one left behind, as the registry records them.
        named, other = (back, release) if kind == "rollback" else (release, back)
        log.warning("%s", describe_event(kind, named, other, reason))  # the robot goes on: no error of its own
        entry = {"release": release, "back_to": back, "reason": reason}
        (self.stats.refused if kind == "refused" else self.stats.rollbacks).append(entry)
        if release and for_good:
            self.ledger.refuse(release)
        self._reporter.event(kind, named, other, reason)
        if self._stop_when_refused:
            self._stop.set()

    # -- reporter thread -------------------------------------------------------------------------------------
    def _snapshot(self) -> Snapshot:
        """The running release, whether it is on probation, the health scores and its backend, read together."""
        return self.slots.snapshot(self.ledger.health)


def _sized(env: Any) -> bool:
    """Whether `env` renders already; False only for a sim camera waiting for its first policy's size."""
    return getattr(env, "sized", True)


def _sleep_until(t: float) -> float:
    """Sleep until monotonic time `t`; if already late, resynchronize instead of bursting to catch up."""
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)
        return t
    return time.monotonic()
