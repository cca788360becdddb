"""The fleet's own experience as training data: what deployed robots do, recorded into fleet datasets.

- `recording`: `FleetRecorder`, which a robot's control loop hands every frame it runs (observation, the action
  sent, the policy's own action, whether the expert drove) without ever waiting: a writer process streams them into
  a LeRobot v3 dataset in the bucket (`robotloop.capture.DatasetRecorder`), one commit per kept episode, with the
  episode's facts (robot, release, seed, success, expert frames) in `meta/fleet_episodes.jsonl`. What is kept is
  `RecordChoice` (`off`, `failures`, `all`, and a sampling rate).
- `takeover`: `Takeovers`, which tells the control loop who drives each tick: the policy, or an expert
  (`robotloop.sim.expert`) from the moment a stall trigger fires until it is done.

The dataset's schema: `robotloop.capture.DatasetSpec(..., fleet=True)` (per-frame `intervention` and
`policy_action` on top of the demos' features).
"""

from .recording import EpisodeFacts, FleetRecorder, RecordChoice, RecordingStats, fleet_recorder
from .takeover import Takeovers, TakeoverStats

__all__ = [
    "EpisodeFacts",
    "FleetRecorder",
    "RecordChoice",
    "RecordingStats",
    "TakeoverStats",
    "Takeovers",
    "fleet_recorder",
]
