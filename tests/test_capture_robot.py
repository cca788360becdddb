"""Hardware recording path. Robot hardware cannot run here: `FakeArm` and `FakeLeader` are test doubles that
implement LeRobot's own `Robot` and `Teleoperator` interfaces; everything else (recorder, bucket server,
lerobot's dataset reader) is real."""

from dataclasses import dataclass

import numpy as np
import pytest
from lerobot.robots import Robot, RobotConfig
from lerobot.teleoperators import Teleoperator, TeleoperatorConfig

from robotloop.capture.recorder import DatasetRecorder
from robotloop.capture.robot_record import record_robot, robot_spec
from robotloop.storage import BucketClient, BucketUrl

from .conftest import WRITE_TOKEN

JOINTS = ["shoulder.pos", "elbow.pos", "gripper.pos"]


@RobotConfig.register_subclass("robotloop_fake_arm")
@dataclass
class FakeArmConfig(RobotConfig):
    pass


@TeleoperatorConfig.register_subclass("robotloop_fake_leader")
@dataclass
class FakeLeaderConfig(TeleoperatorConfig):
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


class FakeLeader(Teleoperator):
    """Test double: a leader arm whose joints ramp up by 10 per read."""

    config_class, name = FakeLeaderConfig, "fake_leader"

    def __init__(self, config):
        super().__init__(config)
        self.t = 0

    action_features = property(lambda self: dict.fromkeys(JOINTS, float))
    feedback_features = property(lambda self: {})
    is_connected = property(lambda self: True)
    is_calibrated = property(lambda self: True)

    def connect(self, calibrate=True):
        pass

    def calibrate(self):
        pass

    def configure(self):
        pass

    def get_action(self):
        self.t += 1
        return dict.fromkeys(JOINTS, 10.0 * self.t)

    def send_feedback(self, feedback):
        pass

    def disconnect(self):
        pass


def test_teleoperated_episodes_are_committed_as_lerobot_records_them(bucket_server, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    robot, leader = FakeArm(FakeArmConfig()), FakeLeader(FakeLeaderConfig())
    robot.connect()
    spec = robot_spec(robot, fps=50, vcodec="h264")
    assert (spec.cameras, spec.state_dim, spec.action_dim) == ({"wrist": (24, 32, 3)}, 3, 3)
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/hardware/datasets/fake-arm")
    recorder = DatasetRecorder(client, url, spec, staging=tmp_path / "stage")
    reports = record_robot(recorder, robot, leader, episodes=2, seconds=0.2, task="wave")
    assert [r.episode_index for r in reports] == [0, 1] and all(r.frames == 10 for r in reports)

    client.fetch(url, tmp_path / "ds")
    dataset = LeRobotDataset(url.bucket_id, root=tmp_path / "ds")
    assert dataset.meta.total_episodes == 2 and dataset.meta.robot_type == "fake_arm"
    first, sixth = dataset[0], dataset[5]
    assert first["action"].tolist() == [10.0] * 3  # what send_action sent
    assert sixth["action"].tolist() == [50.0] * 3  # clipped by the robot, stored as sent (60 asked)
    assert sixth["observation.state"].tolist() == [50.0] * 3  # observation before the 6th action
    assert first["observation.images.wrist"].shape == (3, 24, 32)


def test_hardware_cameras_take_lerobots_own_spelling_and_bad_ones_say_how():
    """`--robot.cameras` as LeRobot users write it reaches the robot's config (without it an SO-101 dataset held
    joint states only); a mistake names the option and shows an example."""
    from robotloop.capture.robot_record import hardware_config

    spec = "{front: {type: opencv, index_or_path: 0, width: 64, height: 48, fps: 30}}"
    config = hardware_config("robot", "so101_follower", "/dev/ttyACM0", "arm", cameras=spec)
    front = config.cameras["front"]
    assert (type(front).__name__, front.width, front.height, front.fps) == ("OpenCVCameraConfig", 64, 48, 30)
    assert hardware_config("robot", "so101_follower", "/dev/ttyACM0", "arm").cameras == {}
    for bad, why in [
        ("{front: {type: nosuch}}", "nosuch"),
        ("[1, 2]", "expected a mapping"),
        ("{front: {type: opencv, bogus: 1}}", "bogus"),
        ("{a: b: c", "flow mapping"),
    ]:
        with pytest.raises(ValueError, match=why) as error:
            hardware_config("robot", "so101_follower", "/dev/ttyACM0", "arm", cameras=bad)
        assert "--robot.cameras" in str(error.value) and "index_or_path" in str(error.value)
