"""The policies a robot holds loaded and the moves between them: `PolicySlots` (swap at a chunk boundary, roll
back, end a probation) and `HealthCheck` (when a new release's probation ends, and whether it passed).

Three slots under one lock: `active` runs; `standby` is loaded and warmed up, waiting for the active policy's chunk
boundary; `previous` is the way back while a new release is on probation. The robot runtime's control thread swaps
and rolls back, its updater thread offers a standby, its reporter reads the running release and the probation
together.

Example:
    ```python
    >>> slots = PolicySlots()
    >>> slots.offer(Loaded("v2", runner))
    >>> slots.swap(is_new=lambda release: True, before=lambda release, was: None)
    ('v2', 'v1')
    >>> slots.probation, slots.previous.release
    (True, 'v1')
    ```
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .ledger import ReleaseLedger

if TYPE_CHECKING:
    from .policy import Policy
    from .runtime import EpisodeResult


@dataclass
class Loaded:
    """A release loaded and warmed up: its name and its policy (`PolicyRunner` or `OnnxRunner`: a `Policy`)."""

    release: str
    runner: Policy


class Snapshot(NamedTuple):
    """What a heartbeat says of the policies, read together: the running release, whether it is on probation, the
    health scores, and what runs it (`Policy.backend`, `Policy.runs_on`; None when nothing runs)."""

    running: str | None
    probation: bool
    health: dict[str, float]
    backend: str | None = None
    runs_on: str | None = None


class PolicySlots:
    """The active, standby and previous policies of one robot, and whether the active one is on probation.

    `running` and the slots may be read without the lock (one attribute read each); every move takes it, so the
    control thread never sees half a swap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: Loaded | None = None
        self.standby: Loaded | None = None
        self.previous: Loaded | None = None
        self.probation = False

    @property
    def running(self) -> str | None:
        active = self.active
        return active.release if active else None

    def pending(self) -> str | None:
        """The release waiting to swap in, if any."""
        with self.lock:
            return self.standby.release if self.standby else None

    def offer(self, loaded: Loaded) -> None:
        """Make `loaded` the standby: the control thread swaps it in at the next chunk boundary."""
        with self.lock:
            self.standby = loaded

    def swap(
        self, is_new: Callable[[str], bool], before: Callable[[str, str | None], None]
    ) -> tuple[str, str | None] | None:
        """At the active policy's chunk boundary, make the standby active; answers (the release, the one it
        replaced), or None when there is nothing to swap.

        Args:
            is_new: whether a release is new to this robot; only a new one goes on probation (going back to one
                it ran, an operator's rollback, is not judged against the release the operator just left).
            before: called with (release, replaced) under the lock, before the release shows as `running`.
        """
        with self.lock:
            standby, active = self.standby, self.active
            if standby is None or (active is not None and not active.runner.at_chunk_boundary):
                return None
            self.standby = None
            if standby is active:
                return None
            was = active.release if active else None
            before(standby.release, was)
            standby.runner.reset()  # a runner used before (an operator's rollback) holds a past episode's actions
            # The release to go back to is the last one proven: a swap during another's probation keeps it.
            proven = self.previous if self.probation and self.previous is not None else active
            self.previous, self.active = proven, standby
            self.probation = active is not None and is_new(standby.release)
        return standby.release, was

    def roll_back(self) -> tuple[str | None, str | None]:
        """Make the previous policy active again (none: nothing runs); answers (the release left, the one back)."""
        with self.lock:
            bad, back = self.active, self.previous
            self.active, self.previous, self.probation = back, None, False
        if back is not None:
            back.runner.reset()
        return (bad.release if bad else None), (back.release if back else None)

    def passed(self) -> None:
        """The release on probation passed it: the old policy's memory can go."""
        self.probation, self.previous = False, None

    def snapshot(self, health: Callable[[], dict[str, float]]) -> Snapshot:
        """The running release, whether it is on probation, `health()` and the active policy's backend, together."""
        with self.lock:  # one consistent view: the control thread changes these between two reads
            active = self.active
            if active is None:
                return Snapshot(None, self.probation, health())
            return Snapshot(active.release, self.probation, health(), active.runner.backend, active.runner.runs_on)


class HealthCheck:
    """Ends the probation of a new release by its finished episodes' scores (see `robotloop.deploy.runtime`): after
    `window` episodes it passes, unless its mean score is below the previous release's by more than `margin`. On a
    robot without scores (hardware) a release passes once it has run `window` episodes."""

    def __init__(self, slots: PolicySlots, ledger: ReleaseLedger, window: int, margin: float) -> None:
        self.slots, self.ledger, self.window, self.margin = slots, ledger, window, margin

    def finished(self, result: EpisodeResult, score: float | None) -> str | None:
        """Take one whole episode and its score; answers why to roll back, when the running release failed."""
        if score is None:
            ran_its_window = self.ledger.unscored(result.release) >= self.window
            if self.slots.probation and result.release == self.slots.running and ran_its_window:
                self.slots.passed()
            return None
        self.ledger.scored(result.release, score)
        return self._judge(result.release)

    def _judge(self, release: str) -> str | None:
        slots = self.slots
        previous = slots.previous
        if not slots.probation or previous is None or release != slots.running:
            return None
        mine, theirs = self.ledger.scores[release], self.ledger.scores.get(previous.release)
        if len(mine) < self.window:
            return None
        if theirs:
            new, old = float(np.mean(mine)), float(np.mean(theirs))
            if new < old - self.margin:
                return (
                    f"health check: mean episode score {new:.3f} over {len(mine)} episodes is below the "
                    f"previous release's {old:.3f} (margin {self.margin})"
                )
        slots.passed()
        return None
