"""The robot's updater: follows its assignment and gets each new release ready to run, on a thread of its own.

It long-polls the deploy service for the robot's assignment; on a change it pulls the release into the local store
(signature, then hashes, checked before anything is loaded; only missing bytes travel), verifies it again, loads
it with `load_policy` (the backend `robot.backend` says: its ONNX export on ONNX Runtime, or torch), runs one warm-up
pass on the latest observation and offers it to the control thread (`PolicySlots.offer`). A release that fails its
checks is refused (the runtime reports it); one that cannot be fetched now is asked for again, with a backoff per
release; one this robot cannot run (`BackendUnavailable`: onnxruntime or torch not installed here) is refused until
the robot restarts, as one whose inputs do not fit its cameras.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import RobotSettings
from ..errors import NotFound, Refused
from ..storage import StorageError
from .client import DeployClient, DeployError
from .errors import BackendUnavailable
from .fetch import XetFetcher
from .keys import BadSignature
from .ledger import ReleaseLedger
from .manifest import BadManifest, SignedManifest
from .policy import load_policy
from .store import IntegrityError, PullCancelled, ReleaseStore
from .swap import Loaded, PolicySlots

if TYPE_CHECKING:
    from .runtime import RuntimeStats

log = logging.getLogger(__name__)

# refuse(release, reason, kind="refused" | "rollback", back=release running now, for_good=True): `RobotRuntime`'s
Refuse = Callable[..., None]


class Updater:
    """Prepares the releases assigned to one robot: `run()` is the updater thread, until `stop` is set.

    What it learns of each release goes to the `ledger`; a refusal goes through `refuse` (the runtime records and
    reports it); pulls go to `stats.pulls`, assignment and ready times to `stats`. `observation_for(runner)` is the
    observation a new policy warms up on (None before the first; a sim camera that takes its size from the first
    policy is sized for `runner` there)."""

    def __init__(
        self,
        deploy: DeployClient,
        store: ReleaseStore,
        trusted: dict,
        options: RobotSettings,
        fetcher_for: Callable[[str], XetFetcher],
        slots: PolicySlots,
        ledger: ReleaseLedger,
        stats: RuntimeStats,
        observation_for: Callable[[object], dict | None],
        refuse: Refuse,
        stop: threading.Event,
    ) -> None:
        self.deploy, self.store, self.trusted, self.options = deploy, store, trusted, options
        self.fetcher_for, self.observation_for, self.refuse, self._stop = fetcher_for, observation_for, refuse, stop
        self.slots, self.ledger, self.stats = slots, ledger, stats
        self._fetchers: dict[str, XetFetcher] = {}

    def run(self) -> None:
        """The updater thread: the last good release first, then every assignment the service answers."""
        try:
            self.start_last_good()
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
                    log.error("unexpected answer from the deploy service: %s: %s", type(error).__name__, error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            known = assigned
            if known and self._wanted(known):
                self.stats.assigned_at.setdefault(known, time.monotonic())
                try:
                    prepared = self.prepare(known, answer["manifest"])
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
        return self.ledger.wanted(release) and release not in (self.slots.running, self.slots.pending())

    def prepare(self, release: str, manifest: dict | None) -> bool:
        """Pull, verify, load and warm up `release`, then offer it to the control thread. False: try again later."""
        previous = self.slots.previous
        if previous is not None and previous.release == release:  # rollback by command: still loaded
            self.slots.offer(previous)
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
            self.refuse(release, f"{type(error).__name__}: {error}", kind="refused", back=self.slots.running)
            return True
        except (BadSignature, BadManifest) as error:
            self.refuse(release, f"{type(error).__name__}: {error}", kind="refused", back=self.slots.running)
            return True
        except PullCancelled as error:  # stop(): the next start resumes from the staged pieces
            log.info("%s", error)
            return False
        except (StorageError, OSError) as error:
            log.warning("pull of %s failed, will retry: %s", release, error)
            self.ledger.fetch_failed(release, error)  # operators see it in the robot's heartbeat status
            return False
        self.ledger.fetched(release)
        self.stats.pulled_at[release] = time.monotonic()
        try:
            model = self.store.model_dir(release)
            runner = load_policy(model, self.options.backend, self.options.device, self.options.acting())
            self.stats.loaded_at[release] = time.monotonic()
            obs = self.observation_for(runner)
            if obs is not None:
                runner.warmup(obs)
        except BackendUnavailable as error:  # this machine's setup: onnxruntime or torch missing, no such provider
            # Not the release's fault: refused for this run only, so that the robot, once the runtime is installed
            # (or started with another robot.backend), tries it again.
            self.ledger.skip(release)
            reason = f"cannot run here with backend {self.options.backend}: {error}"
            self.refuse(release, reason, kind="refused", back=self.slots.running, for_good=False)
            return True
        except ValueError as error:  # the robot's observations do not fit the policy (camera size, state size)
            # Often the robot's own setup (a sim started with another --image-size): refused for this run only,
            # so that a robot restarted with the right setup tries the release again.
            self.ledger.skip(release)
            self.refuse(
                release,
                f"observations do not fit the policy: {error}",
                kind="refused",
                back=self.slots.running,
                for_good=False,
            )
            return True
        except Exception as error:  # noqa: BLE001 - PolicyLoadError, NonFiniteAction in the warm-up
            reason = f"load failed: {type(error).__name__}: {error}"
            self.refuse(release, reason, kind="rollback", back=self.slots.running)
            return True
        self.slots.offer(Loaded(release, runner))
        self.stats.ready_at[release] = time.monotonic()
        keep = {r for r in (self.slots.running, release, previous.release if previous else None) if r}
        self.store.prune(keep, self.options.keep_releases)
        return True

    def _fetcher(self, bucket: str) -> XetFetcher:
        if bucket not in self._fetchers:
            self._fetchers[bucket] = self.fetcher_for(bucket)
        return self._fetchers[bucket]

    def resume_installed(self) -> None:
        """After a restart: refused releases leave the store; staged pulls resume on the next pull."""
        stale = [n for n in self.store.installed() if n in self.ledger.refused]
        for name in stale:  # never load a refused release again
            self.store.remove(name)

    def start_last_good(self) -> None:
        """Load the last release that ran well from the store, so a robot that restarts while the deploy service
        is unreachable still runs (verified again first); the assignment, once it arrives, decides from there."""
        name = self.ledger.last_good
        if name and name not in self.ledger.refused and self.store.has(name):
            manifest = json.loads((self.store.release_dir(name) / "manifest.json").read_bytes())
            self.prepare(name, manifest)
