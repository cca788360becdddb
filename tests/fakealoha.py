"""`FakeAloha`: a test double of LeRobot hardware for the robot runtime (robot hardware cannot run here).

It implements LeRobot's own `Robot` interface and lives in its own module because lerobot's
`make_robot_from_config` finds a robot class by the module of its config (`tests.fakealoha`).
"""

from dataclasses import dataclass

import numpy as np
from lerobot.robots import RobotConfig

from .fakearm import FakeArm

IMAGE = (48, 64)
JOINTS = [f"joint_{i}.pos" for i in range(14)]


@RobotConfig.register_subclass("robotloop_fake_aloha")
@dataclass
class FakeAlohaConfig(RobotConfig):
    pass


class FakeAloha(FakeArm):
    """Test double: `FakeArm` with ALOHA's shape, 14 joints that move to the commanded positions and a 48x64
    `top` camera; it counts the commands it received."""

    config_class, name = FakeAlohaConfig, "fake_aloha"
    sent = 0

    def __init__(self, config):
        super().__init__(config)
        self.q = np.zeros(len(JOINTS))

    observation_features = property(lambda self: {**dict.fromkeys(JOINTS, float), "top": (*IMAGE, 3)})
    action_features = property(lambda self: dict.fromkeys(JOINTS, float))

    def get_observation(self):
        return {**dict(zip(JOINTS, self.q.tolist(), strict=True)), "top": np.full((*IMAGE, 3), 100, np.uint8)}

    def send_action(self, action):
        self.q = np.array([action[j] for j in JOINTS])
        FakeAloha.sent += 1
        return action
