"""The robot runtime: run the assigned release at the control rate, hot-swap new ones, roll back on trouble.

Three threads:
- control (the caller's): one action per tick at `env.rate_hz`. At a chunk boundary of the running policy it
  swaps in a loaded standby policy (a pointer swap: no tick is skipped), and it rolls back by itself when the
  running release produces a non-finite action or fails its health check.
- updater: long-polls the deploy service for this robot's assignment; on a change it pulls the release into the
  local store (signature, then hashes, checked before anything is loaded; only missing bytes travel), verifies
  it again, loads it with `PolicyRunner.load` and runs one warm-up pass, then hands it to the control thread.
- reporter (`Reporter`, in `robotloop.deploy.reporter`): heartbeats (running release, control rate, longest tick
  gap, health) and swap/rollback/refused events, so the control thread never waits on the network.

What the robot learns about each release (refused, skipped, failing to fetch, scored, the last good one) is kept
in one `ReleaseLedger` (`robotloop.deploy.ledger`).

Health check (plain): every finished episode gets a score, by default its highest staged sim reward (0-4 for
ALOHA; 4 = success). A new release is on probation for its first `health_window` whole episodes (episodes that a
swap cut in two count for neither release); if their mean score is below the previous release's mean over its
last `health_window` episodes by more than `health_margin`, the robot rolls back. With no score (hardware
without a reward) only load failures and non-finite actions trigger a rollback.

A refused or rolled-back release is not tried again by this robot (the list survives restarts, in
`<store>/runtime.json`); publish a fixed one under a new name. A release whose inputs do not fit the robot's
observations (camera size, state size) is skipped only until the robot restarts: that is often the robot's setup.

Example:
    ```python
    >>> runtime = RobotRuntime(SimControlEnv("transfer_cube", (48, 64)), DeployClient(url, robot_token),
    ...                        ReleaseStore(store_dir), load_public_keys([Path("deploy.pub")]),
    ...                        RobotSettings(robot_id="r1"), fetcher_for=lambda bucket: XetFetcher(ep, tok, bucket))
    >>> runtime.run(duration_s=60)
    ```
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import RobotSettings
from ..errors import NotFound, Refused
from ..storage import StorageError
from .client import DeployClient, DeployError
from .envs import StepResult
from .fetch import XetFetcher
from .keys import BadSignature
from .ledger import ReleaseLedger
from .manifest import BadManifest, SignedManifest
from .reporter import Reporter
from .store import IntegrityError, PullCancelled, PullReport, ReleaseStore

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
class _Loaded:
    release: str
    runner: Any  # PolicyRunner


@dataclass
class RuntimeStats:
    """What the runtime did; read it from another thread for tests and benchmarks."""

    steps: int = 0
    episodes: list[EpisodeResult] = field(default_factory=list)
    swaps: list[dict[str, Any]] = field(default_factory=list)  # release, previous, at (monotonic), gap_s, mid_episode
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # release (back to), previous, reason
    refused: list[dict[str, Any]] = field(default_factory=list)  # release, reason
    pulls: list[PullReport] = field(default_factory=list)
    assigned_at: dict[str, float] = field(default_factory=dict)  # release -> monotonic time the assignment arrived
    ready_at: dict[str, float] = field(default_factory=dict)  # release -> loaded and warmed up, waiting to swap
    max_gap_s: float = 0.0  # longest interval between two actions within an episode
    control_hz: float | None = None  # the rate actually reached over the last window (RateWatch)


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
        """A new episode: its reset is not control time."""
        self._t0, self._steps = time.monotonic(), 0

    def tick(self) -> None:
        self._steps += 1
        now = time.monotonic()
        if now - self._t0 < self.window_s:
            return
        self.last_hz = self._steps / (now - self._t0)
        self._t0, self._steps = now, 0
        if self.last_hz < 0.9 * self.target_hz and now - self._warned_at > 60.0:
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

    Owns the loaded policies (`_active` runs, `_standby` waits for a chunk boundary, `_previous` is the way back
    while a new release is on probation), guarded by `_lock` for the swap; the `ledger` (what the robot knows
    of each release: refused, skipped, failing to fetch, scored; `ReleaseLedger`); the `Reporter`, which sends
    its events and heartbeats; and `stats`. `run()` starts and joins the updater and
    reporter threads, and runs the control loop in the caller's thread.

    Raises (on construction):
        ValueError: `options.robot_id` is empty.
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
    ) -> None:
        if not options.robot_id:
            raise ValueError("a robot runtime needs RobotSettings.robot_id (the id registered with the deploy service)")
        self.env, self.deploy, self.store, self.trusted, self.options = env, deploy, store, trusted, options
        self.fetcher_for, self.score = fetcher_for, score
        self.stats = RuntimeStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._active: _Loaded | None = None
        self._previous: _Loaded | None = None
        self._standby: _Loaded | None = None
        self._probation = False
        self._latest_obs: dict | None = None
        self.ledger = ReleaseLedger.load(store.root / "runtime.json", options.health_window)
        self._reporter = Reporter(deploy, options, self.stats, self.ledger, self._snapshot, self._stop)
        self._fetchers: dict[str, XetFetcher] = {}

    # -- public ----------------------------------------------------------------------------------------------
    @property
    def running(self) -> str | None:
        active = self._active
        return active.release if active else None

    def stop(self) -> None:
        """End `run()`: the control loop after its step, a pull in progress at its next block (staged pieces
        are kept, so the next start resumes it)."""
        self._stop.set()

    def run(self, duration_s: float | None = None) -> RuntimeStats:
        """Run until `stop()` (or `duration_s`); starts and joins the updater and reporter threads."""
        threads = [
            threading.Thread(target=self._updater, name="robotloop-updater", daemon=True),
            threading.Thread(target=self._reporter.run, name="robotloop-reporter", daemon=True),
        ]
        self._resume_installed()
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
        period = 1.0 / self.env.rate_hz
        rate = RateWatch(self.env.rate_hz)
        obs, episode = self._new_episode()
        tick, last_action = time.monotonic(), None
        while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
            swapped = self._maybe_swap(last_action)
            if swapped:
                episode.mixed = True
            active = self._active
            if active is None:  # nothing to run yet: hold still, keep the camera fresh for warm-ups
                tick = _sleep_until(tick + period)
                continue
            try:
                action = active.runner.act(obs)
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
            if result.done:
                self._finish(episode)
                obs, episode = self._new_episode()
                last_action = None  # an episode reset is not a control gap
                tick = time.monotonic()
                rate.restart()
            tick = _sleep_until(tick + period)

    def _new_episode(self) -> tuple[dict, _EpisodeTally]:
        obs = self.env.reset()
        self._latest_obs = obs
        active = self._active
        if active is not None:
            active.runner.reset()
        return obs, _EpisodeTally(active.release if active else None, mixed=active is None)

    def _finish(self, episode: _EpisodeTally) -> None:
        result = episode.result()
        if result is None:
            return
        self.stats.episodes.append(result)
        score = self.score(result)
        if score is None:  # no reward (hardware): a release that ran its window of episodes has passed
            ran_its_window = self.ledger.unscored(result.release) >= self.options.health_window
            if self._probation and result.release == self.running and ran_its_window:
                self._probation, self._previous = False, None
            return
        self.ledger.scored(result.release, score)
        self._judge(result.release)

    def _judge(self, release: str) -> None:
        """End the probation of a new release: keep it, or roll back if it scores below the previous one."""
        if not self._probation or self._previous is None or release != self.running:
            return
        mine, theirs = self.ledger.scores[release], self.ledger.scores.get(self._previous.release)
        if len(mine) < self.options.health_window:
            return
        self._probation = False
        if theirs:
            new, old = float(np.mean(mine)), float(np.mean(theirs))
            if new < old - self.options.health_margin:
                self._rollback(
                    f"health check: mean episode score {new:.3f} over {len(mine)} episodes is below the "
                    f"previous release's {old:.3f} (margin {self.options.health_margin})"
                )
                return
        self._previous = None  # passed: the old policy's memory can go

    def _maybe_swap(self, last_action: float | None) -> bool:
        with self._lock:
            standby, active = self._standby, self._active
            if standby is None or (active is not None and not active.runner.at_chunk_boundary):
                return False
            self._standby = None
            if standby is active:
                return False
            was = active.release if active else None
            # Recorded before the new release is visible as `running`; gap_s (set after the first action of the
            # new release) exists only for a swap within an episode.
            self.stats.swaps.append(
                {
                    "release": standby.release,
                    "previous": was,
                    "at": time.monotonic(),
                    "gap_s": None,
                    "mid_episode": last_action is not None,
                }
            )
            standby.runner.reset()  # a runner used before (an operator's rollback) holds a past episode's actions
            # The release to go back to is the last one proven: a swap during another's probation keeps it.
            proven = self._previous if self._probation and self._previous is not None else active
            self._previous, self._active = proven, standby
            # Probation only for a release new to this robot: going back to one it ran (an operator's
            # rollback) is not judged against the release the operator just left.
            self._probation = active is not None and standby.release not in self.ledger.scores
        self._reporter.event("swap", standby.release, was, "")
        log.info("running release %s (was %s)", standby.release, was)  # a normal swap: not a warning
        return True

    def _rollback(self, reason: str) -> None:
        with self._lock:
            bad, back = self._active, self._previous
            self._active, self._previous, self._probation = back, None, False
        bad_name = bad.release if bad else None
        if back is not None:
            back.runner.reset()
        self._refuse(bad_name, reason, kind="rollback", back=back.release if back else None)

    # -- updater thread --------------------------------------------------------------------------------------
    def _updater(self) -> None:
        try:
            self._start_last_good()
        except Exception:  # noqa: BLE001 - a damaged store must not leave the robot deaf to the service
            log.exception("could not start the last good release from the store; waiting for the assignment")
        known, backoff = None, 0.5
        while not self._stop.is_set():
            try:
                answer = self.deploy.assignment(self.options.robot_id, known=known, wait_s=self.options.poll_wait_s)
                assigned = answer["release"]
            except (DeployError, ValueError, KeyError, TypeError) as error:  # refused, or an answer of another shape
                if isinstance(error, DeployError) and isinstance(error, Refused | NotFound):
                    log.error("deploy service refuses this robot: %s", error)
                elif not isinstance(error, DeployError):
                    log.error("unexpected answer from the deploy service: %r", error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            known = assigned
            if known and self._wanted(known):
                self.stats.assigned_at.setdefault(known, time.monotonic())
                try:
                    prepared = self._prepare(known, answer["manifest"])
                except Exception:  # noqa: BLE001 - a dead updater would leave the robot deaf to every later release
                    log.exception("preparing %s failed unexpectedly; will retry", known)
                    prepared = False
                if not prepared:
                    # Transient failure: ask again (answered at once) after a pause that doubles per failure of
                    # this release, up to a minute: a release that cannot be fetched is not hammered every 2 s.
                    failures = self.ledger.retrying(known)
                    known = None
                    self._stop.wait(min(2.0 * 2 ** (failures - 1), 60.0))

    def _wanted(self, release: str) -> bool:
        with self._lock:
            standby = self._standby.release if self._standby else None
        return self.ledger.wanted(release) and release not in (self.running, standby)

    def _prepare(self, release: str, manifest: dict | None) -> bool:
        """Pull, verify, load and warm up `release`, then offer it to the control thread. False: try again later."""
        from .runner import PolicyRunner

        previous = self._previous
        if previous is not None and previous.release == release:  # rollback by command: still loaded
            with self._lock:
                self._standby = previous
            return True
        try:
            signed = SignedManifest.from_dict(manifest or {})
            if signed.manifest.name != release:
                raise BadManifest(f"the service assigned {release!r} with the manifest of {signed.manifest.name!r}")
            # Verified either way before loading: fetched pieces as they are assembled, an installed release's files
            # again on disk (the disk is not trusted either).
            report = self.store.pull(
                signed, self.trusted, self._fetcher(signed.manifest.bucket), cancelled=self._stop.is_set
            )
            self.stats.pulls.append(report)
        except IntegrityError as error:
            if self.ledger.unverified(release):  # one bad transfer or a flipped bit: fetch once more
                log.warning("%s did not verify (%s); fetching it again before refusing it", release, error)
                return False
            self._refuse(release, f"{type(error).__name__}: {error}", kind="refused", back=self.running)
            return True
        except (BadSignature, BadManifest) as error:
            self._refuse(release, f"{type(error).__name__}: {error}", kind="refused", back=self.running)
            return True
        except PullCancelled as error:  # stop(): the next start resumes from the staged pieces
            log.info("%s", error)
            return False
        except (StorageError, OSError) as error:
            log.warning("pull of %s failed, will retry: %s", release, error)
            self.ledger.fetch_failed(release, error)  # operators see it in the robot's heartbeat status
            return False
        self.ledger.fetched(release)
        try:
            runner = PolicyRunner.load(self.store.model_dir(release), self.options.device)
            obs = self._latest_obs
            if obs is not None:
                runner.warmup(obs)
        except ValueError as error:  # the robot's observations do not fit the policy (camera size, state size)
            # Often the robot's own setup (a sim started with another --image-size): refused for this run only,
            # so that a robot restarted with the right setup tries the release again.
            self.ledger.skip(release)
            self._refuse(
                release,
                f"observations do not fit the policy: {error}",
                kind="refused",
                back=self.running,
                for_good=False,
            )
            return True
        except Exception as error:  # noqa: BLE001 - PolicyLoadError, NonFiniteAction in the warm-up
            self._refuse(release, f"load failed: {type(error).__name__}: {error}", kind="rollback", back=self.running)
            return True
        with self._lock:
            self._standby = _Loaded(release, runner)
        self.stats.ready_at[release] = time.monotonic()
        keep = {r for r in (self.running, release, previous.release if previous else None) if r}
        self.store.prune(keep, self.options.keep_releases)
        return True

    def _fetcher(self, bucket: str) -> XetFetcher:
        if bucket not in self._fetchers:
            self._fetchers[bucket] = self.fetcher_for(bucket)
        return self._fetchers[bucket]

    def _refuse(self, release: str | None, reason: str, kind: str, back: str | None, for_good: bool = True) -> None:
        """Report a refused or rolled-back release; `for_good` also keeps it out across restarts (runtime.json)."""
        log.error("%s %s: %s", "refused" if kind == "refused" else "rolled back from", release, reason)
        entry = {"release": release, "back_to": back, "reason": reason}
        (self.stats.refused if kind == "refused" else self.stats.rollbacks).append(entry)
        if release and for_good:
            self.ledger.refuse(release)
        # Events name the release now running and the one left behind, as the registry records them.
        if kind == "rollback":
            self._reporter.event(kind, back, release, reason)
        else:
            self._reporter.event(kind, release, back, reason)

    def _resume_installed(self) -> None:
        """After a restart: refused releases leave the store; staged pulls resume on the next pull."""
        stale = [n for n in self.store.installed() if n in self.ledger.refused]
        for name in stale:  # never load a refused release again
            self.store.remove(name)

    def _start_last_good(self) -> None:
        """Load the last release that ran well from the store, so a robot that restarts while the deploy service
        is unreachable still runs (verified again first); the assignment, once it arrives, decides from there."""
        name = self.ledger.last_good
        if name and name not in self.ledger.refused and self.store.has(name):
            manifest = json.loads((self.store.release_dir(name) / "manifest.json").read_bytes())
            self._prepare(name, manifest)

    # -- reporter thread -------------------------------------------------------------------------------------
    def _snapshot(self) -> tuple[str | None, bool, dict[str, float]]:
        """The running release, whether it is on probation, and the health scores, read together."""
        with self._lock:  # one consistent view: the control thread changes these between two of our reads
            return self.running, self._probation, self.ledger.health()


def _sleep_until(t: float) -> float:
    """Sleep until monotonic time `t`; if already late, resynchronize instead of bursting to catch up."""
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)
        return t
    return time.monotonic()
