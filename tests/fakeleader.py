"""`FakeLeader`: a test double of a LeRobot teleoperator (a leader arm), in a module of its own name for the same
reason as `tests.fakearm`: `--teleop.type robotloop_fake_leader` finds it."""

from dataclasses import dataclass

from lerobot.teleoperators import Teleoperator, TeleoperatorConfig

from .fakearm import JOINTS


@TeleoperatorConfig.register_subclass("robotloop_fake_leader")
@dataclass
class FakeLeaderConfig(TeleoperatorConfig):
    pass


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
