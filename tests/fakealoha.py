"""`FakeAloha`: a test double of LeRobot hardware for the robot runtime (robot hardware cannot run here).

It implements LeRobot's own `Robot` interface and lives in its own module because lerobot's
`make_robot_from_config` finds a robot class by the module of its config (`tests.fakealoha`).
"""

from dataclasses import dataclass

import numpy as np
from lerobot.robots import Robot, RobotConfig

IMAGE = (48, 64)
JOINTS = [f"joint_{i}.pos" for i in range(14)]


@RobotConfig.register_subclass("robotloop_fake_aloha")
@dataclass
class FakeAlohaConfig(RobotConfig):
    pass


class FakeAloha(Robot):
    """Test double: a 14-joint bimanual arm that moves to the commanded positions, with a 48x64 `top` camera."""

    config_class, name = FakeAlohaConfig, "fake_aloha"

    def __init__(self, config):
        super().__init__(config)
        self.q, self.connected, self.commands = np.zeros(14), False, 0

    observation_features = property(lambda self: {**{j: float for j in JOINTS}, "top": (*IMAGE, 3)})
    action_features = property(lambda self: {j: float for j in JOINTS})
    is_connected = property(lambda self: self.connected)
    is_calibrated = property(lambda self: True)

    def connect(self, calibrate=True):
        self.connected = True

    def calibrate(self):
        pass

    def configure(self):
        pass

    def get_observation(self):
        return {**dict(zip(JOINTS, self.q.tolist())), "top": np.full((*IMAGE, 3), 100, np.uint8)}

    def send_action(self, action):
        self.q = np.array([action[j] for j in JOINTS])
        FakeAloha.sent = getattr(FakeAloha, "sent", 0) + 1
        return action

    def disconnect(self):
        self.connected = False
