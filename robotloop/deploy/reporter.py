"""The robot's reporter: heartbeats and events for the deploy service, on a thread of their own.

The control thread never waits on the network: it queues events (`Reporter.event`) and goes on; the reporter
thread sends them, in order, then a heartbeat, every `heartbeat_s`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

from ..config import RobotSettings
from .client import DeployClient, DeployError
from .ledger import ReleaseLedger

if TYPE_CHECKING:
    from .runtime import RuntimeStats
    from .swap import Snapshot

log = logging.getLogger(__name__)


class Reporter:
    """Sends one robot's events (swap, rollback, refused) and heartbeats (running release, what runs it, control
    rate, longest tick gap, health, refused and unfetchable releases, the last pull) to the deploy service.

    Events go in the order they happened; one that fails to send stays at the front and is retried (the
    registry's history, and `rollback_robot` with it, read them in order). `snapshot` gives the running release,
    whether it is on probation and its backend, read together; a release that runs off probation is the ledger's
    last good.
    Failed sends are logged, never raised.
    """

    def __init__(
        self,
        deploy: DeployClient,
        options: RobotSettings,
        stats: RuntimeStats,
        ledger: ReleaseLedger,
        snapshot: Callable[[], Snapshot],
        stop: threading.Event,
    ) -> None:
        self.deploy, self.options, self.stats, self.ledger = deploy, options, stats, ledger
        self._snapshot, self._stop = snapshot, stop
        self.outbox: deque[tuple[str, str | None, str | None, str]] = deque()

    def event(self, kind: str, release: str | None, previous: str | None, detail: str) -> None:
        """Queue an event; the reporter thread sends it."""
        self.outbox.append((kind, release, previous, detail))

    def run(self) -> None:
        """The reporter thread: until the runtime stops (and the outbox is empty), every `heartbeat_s`."""
        last_steps, last_t = 0, time.monotonic()
        while not self._stop.wait(self.options.heartbeat_s) or self.outbox:
            self.flush()
            now, steps = time.monotonic(), self.stats.steps
            running, probation, health, backend, runs_on = self._snapshot()
            status = {
                "backend": backend,  # what runs the release: "onnx" or "torch" (None: nothing runs)
                "runs_on": runs_on,  # where: an ONNX Runtime execution provider or a torch device
                "control_hz": round((steps - last_steps) / max(now - last_t, 1e-6), 1),
                "max_gap_ms": round(1000 * self.stats.max_gap_s, 1),
                "episodes": len(self.stats.episodes),
                "health": health,
                "probation": probation,
                "refused": self.ledger.refused_sorted(),
                "unfetchable": self.ledger.unfetchable(),
                "last_pull": asdict(self.stats.pulls[-1]) if self.stats.pulls else None,
            }
            if self.stats.recording is not None:  # episodes recorded into the fleet dataset, and those dropped
                status["recording"] = self.stats.recording.as_dict()
            last_steps, last_t = steps, now
            if running and not probation:
                self.ledger.ran_well(running)
            try:
                self.deploy.heartbeat(self.options.robot_id, running, status)
            except DeployError as error:
                log.warning("heartbeat failed: %s", error)
            if self._stop.is_set():
                break

    def flush(self) -> None:
        """Send the queued events in order; stop at the first that fails (it is sent again next time)."""
        while self.outbox:
            kind, release, previous, detail = self.outbox[0]
            try:
                self.deploy.event(self.options.robot_id, kind, release, previous, detail)
            except DeployError as error:
                log.warning("could not report %s of %s (will retry): %s", kind, release, error)
                return
            self.outbox.popleft()
