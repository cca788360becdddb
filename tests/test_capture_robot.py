"""Hardware recording path. Robot hardware cannot run here: `FakeArm` and `FakeLeader` are test doubles that
implement LeRobot's own `Robot` and `Teleoperator` interfaces; everything else (recorder, bucket server,
lerobot's dataset reader) is real."""

import pytest

from robotloop.capture.recorder import DatasetRecorder
from robotloop.capture.robot_record import record_robot, robot_spec
from robotloop.storage import BucketClient, BucketUrl

from .conftest import WRITE_TOKEN
from .fakearm import FakeArm, FakeArmConfig
from .fakeleader import FakeLeader, FakeLeaderConfig


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


def test_record_command_drives_lerobot_hardware(bucket_server, tmp_path):
    """`robotloop record --robot.type/--teleop.type` (the command, not the library call) commits teleoperated
    episodes; without a task it refuses before touching the hardware."""
    from typer.testing import CliRunner

    from robotloop.cli import app

    url = "hf://buckets/lab/hardware/datasets/fake-arm-cli"
    storage = ["--endpoint", bucket_server.endpoint, "--token", WRITE_TOKEN]
    hardware = ["--robot.type", "robotloop_fake_arm", "--teleop.type", "robotloop_fake_leader", "--codec", "h264"]
    timing = ["--episode-time-s", "0.2", "--reset-time-s", "0", "--fps", "50"]
    cli = CliRunner()
    refused = cli.invoke(app, [*storage, "record", "--to", url, *hardware, "--episodes", "1"])
    assert refused.exit_code == 2 and "--task" in refused.output
    # A registered type whose device class LeRobot cannot find: its reason, as a usage error, not a traceback.
    broken = ["--robot.type", "robotloop_fake_aloha_no_class", "--teleop.type", "robotloop_fake_leader"]
    refused = cli.invoke(app, [*storage, "record", "--to", url, *broken, "--task", "wave"])
    assert refused.exit_code == 2 and "LeRobot could not make the robot" in refused.output, refused.output
    result = cli.invoke(app, [*storage, "record", "--to", url, *hardware, *timing, "--episodes", "2", "--task", "wave"])
    assert result.exit_code == 0, result.output
    assert "committed 2 episodes" in result.output
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    recorder = DatasetRecorder(client, BucketUrl.parse(url), robot_spec(FakeArm(FakeArmConfig()), 50, "h264"))
    assert recorder.committed_episodes() == 2
