"""Which frames a run trains on, and how often: each dataset of a run is a source with a role, and each frame a
sampling weight from its role, its episode's success and whether the expert drove it.

- A dataset without an `intervention` feature is scripted demos (role "demo"): every frame is the expert's and
  weighs `demo`.
- A fleet dataset (it has `intervention`: the notes' fleet schema) weighs each frame by who drove it: `expert` where
  intervention is True (a takeover, a re-demonstration), else `autonomous_success` when the policy went on from that
  frame to success on its own (a `next.success` comes before the next intervention) and `autonomous_failed` when it
  did not: an episode that never succeeded, and the frames that led up to a takeover even where the expert then
  succeeded (they are what the policy did wrong; an episode counted successful whole would train on them).
- `datasets` multiplies every frame of one dataset (by URL) by a factor.

A frame is drawn with probability proportional to its weight; 0 drops it (it is never a sample, though a kept
frame's action chunk still reads it: the actions that followed are what happened). The default keeps successful
autonomous frames, drops failed ones and draws expert frames twice as often.

No torch here: the options (`robotloop.train.options`) and the services import it.

Example:
    ```python
    >>> FrameWeights(expert=4.0).frame_weight("fleet", success=False, expert=True)
    4.0
    >>> FrameWeights().episode_weight("fleet", success=False, expert_frames=10, length=100)   # 90 frames dropped
    20.0
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import BadValue
from ..features import INTERVENTION_KEY

Role = Literal["demo", "fleet"]


def role_of(features: dict) -> Role:
    """A dataset's role from its features: "fleet" when it records `intervention`, else "demo"."""
    return "fleet" if INTERVENTION_KEY in features else "demo"


@dataclass
class FrameWeights:
    """Sampling weights per kind of frame (see the module docstring); 0 drops the frames of that kind.

    Raises:
        BadValue: a weight or a dataset's factor that is negative or not finite.
    """

    demo: float = 1.0  # every frame of a dataset without `intervention` (scripted demos)
    expert: float = 2.0  # fleet frames with intervention = True
    autonomous_success: float = 1.0  # fleet frames the policy drove, in an episode that succeeded
    autonomous_failed: float = 0.0  # fleet frames the policy drove, in an episode that did not
    datasets: dict[str, float] = field(default_factory=dict)  # dataset URL -> factor on all its frames

    def __post_init__(self) -> None:
        named = {k: getattr(self, k) for k in ("demo", "expert", "autonomous_success", "autonomous_failed")}
        for name, value in {**named, **self.datasets}.items():
            if not (math.isfinite(value) and value >= 0):
                raise BadValue(f"the weight of {name} must be a finite number >= 0, got {value}")

    def factor(self, dataset: str) -> float:
        return self.datasets.get(str(dataset), 1.0)

    def frame_weight(self, role: Role, success: bool, expert: bool, dataset: str = "") -> float:
        """The weight of one frame (before `datasets`' factor when `dataset` is not given)."""
        if role == "demo":
            weight = self.demo
        elif expert:
            weight = self.expert
        else:
            weight = self.autonomous_success if success else self.autonomous_failed
        return weight * self.factor(dataset)

    def episode_weight(self, role: Role, success: bool, expert_frames: int, length: int, dataset: str = "") -> float:
        """The summed weight of an episode's frames from its totals alone: what it counts for when episodes are
        drawn, before its frames are decoded. Exact but for a successful episode with expert frames, whose policy
        frames may have led to the takeover or on from a hand-back: they count as failed here (a lower bound; the
        decoded frames say which, `autonomous_outcome`)."""
        if role == "demo":
            return length * self.frame_weight(role, success, True, dataset)
        expert = expert_frames * self.frame_weight(role, success, True, dataset)
        on_its_own = success and expert_frames == 0
        return expert + (length - expert_frames) * self.frame_weight(role, on_its_own, False, dataset)

    def uniform(self, role: Role) -> bool:
        """Whether every frame of a dataset of `role` weighs the same (and is kept): what lerobot's own trainer,
        which draws frames uniformly, can reproduce."""
        if role == "demo":
            return self.demo > 0
        return self.expert == self.autonomous_success == self.autonomous_failed > 0


def autonomous_outcome(intervention: np.ndarray, success: np.ndarray) -> np.ndarray:
    """Per frame of a fleet episode, whether the policy went on from it to success on its own: a success flag
    comes before the next intervention frame. Expert frames get False (their weight does not depend on it).

    Example:
        ```python
        >>> autonomous_outcome(np.array([0, 0, 1, 1, 0, 0], bool), np.array([0, 0, 0, 0, 0, 1], bool))
        array([False, False, False, False,  True,  True])
        ```
    """
    out = np.zeros(len(intervention), bool)
    succeeds = False  # scanning back from the end: does the policy's run from here reach success untouched?
    for t in range(len(intervention) - 1, -1, -1):
        if intervention[t]:
            succeeds = False
        else:
            succeeds = succeeds or bool(success[t])
            out[t] = succeeds
    return out


def parse_dataset_weight(text: str) -> tuple[str, float]:
    """`URL=W` (`--dataset-weight`) as (URL, W).

    Raises:
        ValueError: not `URL=W` with W a number, or W negative or not finite (a pydantic validator's error).
    """
    url, sep, value = text.rpartition("=")
    try:
        weight = float(value)
    except ValueError:
        weight = math.nan
    if not sep or not url or not (math.isfinite(weight) and weight >= 0):
        raise ValueError(f"{text}: expected URL=W, W a number >= 0 (e.g. hf://buckets/lab/fleet/datasets/cube=0.5)")
    return url, weight


__all__ = [
    "FrameWeights",
    "Role",
    "autonomous_outcome",
    "parse_dataset_weight",
    "role_of",
]
