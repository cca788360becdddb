"""What one recorded episode is, independent of where it came from (sim worker, robot, capture service)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
