"""What one recorded episode is, independent of where it came from (sim worker, robot, capture service)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..errors import Unprocessable


class BadEpisode(Unprocessable, ValueError):
    """An episode's arrays do not fit the dataset's features; the message says which and how."""


@dataclass
class Episode:
    """Frames of one episode, time along axis 0.

    `images` maps a camera name (e.g. "top") to uint8 [T, H, W, 3]; `state` and `action` are float32 [T, D];
    `reward` is float32 [T] and `success` bool [T] (task solved at that frame), both optional; a failed demo
    kept for the record has no True in `success`. `task` is the language instruction stored with each frame.
    A fleet dataset's episode (`DatasetSpec(fleet=True)`) also has `intervention` bool [T] (True where the expert
    drove) and `policy_action` float32 [T, A] (what the policy proposed).
    """

    images: dict[str, np.ndarray]
    state: np.ndarray
    action: np.ndarray
    task: str
    reward: np.ndarray | None = None
    success: np.ndarray | None = None
    intervention: np.ndarray | None = None
    policy_action: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.action)

    def validate(
        self, image_shapes: dict[str, tuple[int, int, int]], state_dim: int, action_dim: int, fleet: bool = False
    ) -> None:
        """Check shapes, dtypes and finiteness against the dataset's features (`fleet`: its intervention and policy
        action too).

        Raises:
            BadEpisode: empty episode, wrong shape or dtype, NaN/inf, a camera missing or unknown, or a fleet
                episode without its intervention or policy action.
        """
        n = len(self)
        if n == 0:
            raise BadEpisode("the episode has no frames")
        check_array(self.state, (n, state_dim), np.floating, "state")
        check_array(self.action, (n, action_dim), np.floating, "action")
        if self.reward is not None:
            check_array(self.reward, (n,), np.floating, "reward")
        if self.success is not None:
            check_array(self.success, (n,), np.bool_, "success")
        if fleet:
            check_array(self.intervention, (n,), np.bool_, "intervention")
            check_array(self.policy_action, (n, action_dim), np.floating, "policy_action")
        if set(self.images) != set(image_shapes):
            raise BadEpisode(f"cameras {sorted(self.images)} do not match the dataset's {sorted(image_shapes)}")
        for name, frames in self.images.items():
            check_array(frames, (n, *image_shapes[name]), np.uint8, f"images[{name!r}]")


def check_array(array: np.ndarray, shape: tuple[int, ...], kind: type, name: str) -> None:
    """Check one array's shape, dtype (a subtype of `kind`) and, for floats, finiteness: what an episode's and a
    frame's checks share.

    Raises:
        BadEpisode: naming `name` and what was expected.
    """
    if not isinstance(array, np.ndarray) or array.shape != shape:
        got = getattr(array, "shape", type(array).__name__)
        raise BadEpisode(f"{name} has shape {got}, expected {shape}")
    if not np.issubdtype(array.dtype, kind):
        raise BadEpisode(f"{name} has dtype {array.dtype}, expected {kind.__name__}")
    if np.issubdtype(kind, np.floating) and not np.isfinite(array).all():
        raise BadEpisode(f"{name} holds NaN or infinite values")


@dataclass
class FleetTally:
    """What a fleet episode's frames say of it, counted as they come (a tick or a batch at a time): the facts of its
    `meta/fleet_episodes.jsonl` line that come from its frames. The in-process `FleetRecorder` and the capture
    service both count with it, so an episode's line says the same whichever way it was recorded.

    `success` and `max_reward` stay None while no frame said (a robot without a reward signal).
    """

    frames: int = 0
    expert_frames: int = 0  # frames the expert drove (`intervention`)
    success: bool | None = None
    max_reward: float | None = None

    # The facts it counts; a robot may not give them itself (they would contradict its frames).
    COUNTED = ("success", "max_reward", "frames", "expert_frames", "kind")

    def add(self, intervention: ArrayLike, reward: ArrayLike | None = None, success: ArrayLike | None = None) -> None:
        """Count one frame (scalars) or a batch (arrays of one value per frame); None: the frames did not say."""
        flags = np.atleast_1d(np.asarray(intervention, bool))
        self.frames += len(flags)
        self.expert_frames += int(np.count_nonzero(flags))
        if reward is not None and np.size(reward):
            # A float, not a numpy scalar: the line is JSON. Rewards never above 0 count as 0, as they always did.
            self.max_reward = max(self.max_reward or 0.0, float(np.max(reward)))
        if success is not None:
            self.success = bool(self.success) or bool(np.any(success))

    def kind(self) -> str:
        """`expert` (every frame the expert's), `takeover` (some), or `autonomous` (none)."""
        if self.frames and self.expert_frames == self.frames:
            return "expert"
        return "takeover" if self.expert_frames else "autonomous"

    def facts(self, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """The episode's line (less its index, which the recorder adds): `given` (the robot's id, release, task,
        seed...), then what the frames say."""
        counted = {"success": self.success, "max_reward": self.max_reward, "frames": self.frames}
        return {**(given or {}), **counted, "expert_frames": self.expert_frames, "kind": self.kind()}
