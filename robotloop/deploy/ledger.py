"""What a robot has learnt about the releases it was assigned: `ReleaseLedger`, the runtime's memory.

The robot runtime asks it whether a release is worth preparing, and tells it what happened: a pull that
failed, bytes that did not verify, a release refused, skipped or rolled back, each finished episode's score,
a release that passed its probation. Two of its facts outlive the process, in `<store>/runtime.json`: the
releases refused for good, and the last release that ran well (started before the service answers).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class ReleaseLedger:
    """Per release, what this robot knows: refused, skipped, failing to fetch, scored. Transitions:

    - `fetch_failed(r, error)`: a pull failed (the network, the bucket); it is retried, and the last error
      shows in heartbeats (`unfetchable()`) until `fetched(r)`.
    - `retrying(r)`: a preparation failed and will be retried; returns how many have, for the backoff.
    - `unverified(r)`: its bytes did not verify; True the first time (one bad transfer or a flipped bit: fetch
      it once more), False after (refuse it).
    - `skip(r)`: its inputs do not fit this robot's observations; not tried again until the robot restarts (the
      robot's setup is often what is wrong).
    - `refuse(r)`: refused or rolled back; never tried again by this robot, across restarts.
    - `scored(r, score)` / `unscored(r)`: a finished episode, the health check's evidence.
    - `ran_well(r)`: it passed probation; the robot starts it at the next start, before the service answers.

    `refused` and `last_good` are saved to `path` on every change (an atomic replace), under a lock: the
    updater, control and reporter threads all change them. The other facts are written by one thread each and
    read by the reporter, which copies them before it iterates.
    """

    path: Path
    health_window: int
    refused: set[str] = field(default_factory=set)
    last_good: str | None = None
    skipped: set[str] = field(default_factory=set)  # inputs do not fit this robot: skipped until a restart
    unverified_once: set[str] = field(default_factory=set)  # bytes did not verify once: fetched again
    failures: dict[str, int] = field(default_factory=dict)  # preparations that failed and will be retried
    fetch_errors: dict[str, str] = field(default_factory=dict)  # not fetched yet: the last error
    scores: defaultdict[str, deque[float]] = field(init=False)  # the last `health_window` episode scores
    unscored_episodes: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))  # hardware: no score

    def __post_init__(self) -> None:
        self.scores = defaultdict(lambda: deque(maxlen=self.health_window))
        self._lock = threading.RLock()

    @classmethod
    def load(cls, path: Path, health_window: int) -> ReleaseLedger:
        """The ledger saved at `path`; an empty one where there is none (or it does not read)."""
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = {}
        return cls(path, health_window, set(state.get("refused", [])), state.get("last_good"))

    def wanted(self, release: str) -> bool:
        """Whether `release` is worth preparing: neither refused nor skipped."""
        return release not in self.refused and release not in self.skipped

    # -- transitions ------------------------------------------------------------------------------------------
    def fetch_failed(self, release: str, error: Exception) -> None:
        self.fetch_errors[release] = str(error)[:500]  # operators see it in the robot's heartbeat status

    def fetched(self, release: str) -> None:
        self.fetch_errors.pop(release, None)

    def retrying(self, release: str) -> int:
        """Count one more failed preparation of `release`; returns how many there have been."""
        failures = self.failures[release] = self.failures.get(release, 0) + 1
        return failures

    def unverified(self, release: str) -> bool:
        """`release`'s bytes did not verify: True the first time (fetch it again), False after (refuse it)."""
        if release in self.unverified_once:
            return False
        self.unverified_once.add(release)
        return True

    def skip(self, release: str) -> None:
        self.skipped.add(release)

    def refuse(self, release: str) -> None:
        with self._lock:
            self.refused.add(release)
            self._save()

    def scored(self, release: str, score: float) -> None:
        self.scores[release].append(score)

    def unscored(self, release: str) -> int:
        """Count one more finished episode of `release` with no score; returns how many there have been."""
        self.unscored_episodes[release] += 1
        return self.unscored_episodes[release]

    def ran_well(self, release: str) -> None:
        if release != self.last_good:
            self.last_good = release
            self._save()

    # -- what heartbeats report -------------------------------------------------------------------------------
    def health(self) -> dict[str, float]:
        """Per release with scores, their mean over its last `health_window` episodes."""
        return {r: round(float(np.mean(list(s))), 3) for r, s in list(self.scores.items()) if s}

    def refused_sorted(self) -> list[str]:
        with self._lock:
            return sorted(self.refused)

    def unfetchable(self) -> dict[str, dict]:
        """Per release not fetched yet: how many preparations failed, and the last error."""
        return {r: {"failures": self.failures.get(r, 0), "error": e} for r, e in list(self.fetch_errors.items())}

    def _save(self) -> None:
        with self._lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"refused": sorted(self.refused), "last_good": self.last_good}))
            tmp.replace(self.path)
