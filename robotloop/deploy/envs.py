"""What the robot runtime drives: the ALOHA sim, or LeRobot hardware through its `Robot` interface.

Both give observations in the `AlohaSim` layout the policy runner reads (``{"pixels": {cam: uint8 HxWx3},
"agent_pos": float [S]}``) and take one action vector per control step.

Example:
    ```python
    >>> env = SimControlEnv("transfer_cube", image_size=(96, 128), episode_steps=400)
    >>> obs = env.reset()
    >>> obs, step = env.step(action)        # step.reward, step.done, step.success
    ```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadValue
from ..sim.constants import format_image_size

FROM_POLICY = "policy"  # SimControlEnv's image_size: the camera size of the first policy the robot runs


@dataclass(frozen=True)
class StepResult:
    """`reward` and `success` are None where the environment cannot measure them (hardware)."""

    reward: float | None
    done: bool
    success: bool | None


class SimControlEnv:
    """An `AlohaSim` task at its control rate (50 Hz for ALOHA); episodes end at success or `episode_steps`.

    `image_size=FROM_POLICY`: the camera takes the size of the first policy the robot runs (the size saved beside
    it, `PolicyRunner.image_size`, as `robotloop eval` renders), and its shadow maps unless `shadow_map` is given,
    then keeps them, as a real camera would: `sized` is False until `fit(size, shadow_map)` builds the sim, in the
    thread that renders (MuJoCo's EGL context is that thread's). `shadow_map`: the side of the lights' shadow maps
    (None: the policy's data's, else gym-aloha's for the size, `robotloop.sim.constants.shadow_map_size`).
    """

    def __init__(
        self,
        task: str,
        image_size: tuple[int, int] | None | str = (96, 128),
        episode_steps: int = 400,
        seed: int = 0,
        rate_hz: float = 50.0,
        shadow_map: int | None = None,
    ) -> None:
        from ..sim import get_task
        from ..sim.constants import check_shadow_map

        # An unknown task fails now, not when the first policy arrives. Its instruction is what a recorded episode
        # of it says (the scripted demos' `task`).
        self.instruction = get_task(task).text
        self.task, self.episode_steps, self.seed = task, episode_steps, seed
        # ALOHA's 50 Hz; `math.inf`: as fast as the machine runs (a simulated fleet's clock is its own).
        self.rate_hz = rate_hz
        self.sim = None
        self._shadow_map = check_shadow_map(shadow_map)
        if image_size != FROM_POLICY:
            self.fit(image_size)

    @property
    def sized(self) -> bool:
        return self.sim is not None

    @property
    def image_size(self) -> tuple[int, int] | None:
        """The camera's (H, W); None: not sized yet, or a sim that renders nothing."""
        return self.sim.image_size if self.sim is not None else None

    @property
    def shadow_map(self) -> int | None:
        """The camera's shadow-map side; None: not sized yet, or a sim that renders nothing."""
        camera = self.sim.camera if self.sim is not None else None
        return camera.shadow_map if camera is not None else None

    def fit(self, image_size: tuple[int, int] | None, shadow_map: int | None = None) -> None:
        """Build the sim with its camera at `image_size` (None: no camera) and `shadow_map` (the policy's; the
        side given at construction wins). Once: a robot's camera stays as it is.

        Raises:
            BadValue: a bad size or shadow-map side, or the sim was sized already.
        """
        from ..sim import AlohaSim

        if self.sim is not None:
            raise BadValue(f"the sim camera is {format_image_size(self.sim.image_size)} already")
        side = self._shadow_map if self._shadow_map is not None else shadow_map
        self.sim = AlohaSim(self.task, image_size=image_size, max_episode_steps=self.episode_steps, shadow_map=side)

    def reset(self) -> dict[str, Any]:
        self.seed += 1
        return self._sim().reset(seed=self.seed)

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], StepResult]:
        obs, reward, success, truncated, _info = self._sim().step(
            action
        )  # the sim counts steps: truncated at the limit
        return obs, StepResult(float(reward), bool(success) or truncated, bool(success))

    def _sim(self) -> Any:
        if self.sim is None:
            raise BadValue("the sim camera takes its size from the first policy: fit() it before running")
        return self.sim

    def close(self) -> None:
        if self.sim is not None:
            self.sim.close()


class HardwareControlEnv:
    """A connected LeRobot `Robot`. Scalar observation entries form `agent_pos` (in the robot's order), array
    entries are cameras; the action vector maps onto `robot.action_features` in order. Hardware has no reward:
    episodes are `episode_s` long and the health check uses only load failures and non-finite actions.
    """

    def __init__(self, robot: Any, rate_hz: float = 30.0, episode_s: float = 30.0) -> None:
        self.robot, self.rate_hz = robot, rate_hz
        features = robot.observation_features
        self.state_keys = [k for k, v in features.items() if not isinstance(v, tuple)]
        self.camera_keys = [k for k, v in features.items() if isinstance(v, tuple)]
        self.action_keys = list(robot.action_features)
        self.episode_steps = max(1, round(episode_s * rate_hz))
        self._steps = 0

    sized = True  # its cameras are what they are

    def _obs(self) -> dict[str, Any]:
        raw = self.robot.get_observation()
        return {
            "pixels": {k: np.asarray(raw[k], np.uint8) for k in self.camera_keys},
            "agent_pos": np.array([raw[k] for k in self.state_keys], np.float64),
        }

    def reset(self) -> dict[str, Any]:
        self._steps = 0
        return self._obs()

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], StepResult]:
        if len(action) != len(self.action_keys):
            raise BadValue(f"the policy gives {len(action)} actions; the robot takes {len(self.action_keys)}")
        self.robot.send_action({k: float(v) for k, v in zip(self.action_keys, action, strict=True)})
        self._steps += 1
        return self._obs(), StepResult(None, self._steps >= self.episode_steps, None)

    def close(self) -> None:
        self.robot.disconnect()
