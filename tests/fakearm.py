"""`FakeArm`: a test double of a LeRobot robot (robot hardware cannot run here). It implements LeRobot's own
`Robot` interface and lives in a module of its own name because lerobot's `make_robot_from_config` looks for a
robot class in the module named after it (`tests.fakearm`), so `--robot.type robotloop_fake_arm` finds it."""

from dataclasses import dataclass

import numpy as np
from lerobot.robots import Robot, RobotConfig

JOINTS = ["shoulder.pos", "elbow.pos", "gripper.pos"]


@RobotConfig.register_subclass("robotloop_fake_arm")
@dataclass
class FakeArmConfig(RobotConfig):
    pass


class FakeArm(Robot):
    """Test double: a 3-joint arm that moves to the commanded positions, clipped at 50, with one camera."""

    config_class, name = FakeArmConfig, "fake_arm"

    def __init__(self, config):
        super().__init__(config)
        self.q, self.connected = np.zeros(3), False

    observation_features = property(lambda self: {**dict.fromkeys(JOINTS, float), "wrist": (24, 32, 3)})
    action_features = property(lambda self: dict.fromkeys(JOINTS, float))
    is_connected = property(lambda self: self.connected)
    is_calibrated = property(lambda self: True)

    def connect(self, calibrate=True):
        self.connected = True

    def calibrate(self):
        pass

    def configure(self):
        pass

    def get_observation(self):
        image = np.full((24, 32, 3), int(self.q[0]) % 255, np.uint8)
        return {**dict(zip(JOINTS, self.q.tolist(), strict=True)), "wrist": image}

    def send_action(self, action):
        self.q = np.clip([action[j] for j in JOINTS], -50, 50)  # the robot's safety limit
        return dict(zip(JOINTS, self.q.tolist(), strict=True))

    def disconnect(self):
        self.connected = False


@RobotConfig.register_subclass("robotloop_fake_aloha_no_class")
@dataclass
class NoSuchDeviceConfig(RobotConfig):
    """A registered robot type whose device class (`NoSuchDevice`) exists nowhere LeRobot looks."""
