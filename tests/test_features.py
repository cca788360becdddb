"""robotloop.features spells lerobot's feature names itself (the robot's torch-free install has no lerobot): it must
spell them as lerobot does, or what we write is a dataset lerobot's tools read without its state or actions."""

from lerobot.utils import constants

from robotloop import features


def test_feature_names_are_lerobots() -> None:
    assert features.STATE_KEY == constants.OBS_STATE
    assert features.IMAGE_PREFIX == constants.OBS_IMAGES + "."
    assert features.ACTION_KEY == constants.ACTION
    assert features.REWARD_KEY == constants.REWARD
    assert features.SUCCESS_KEY == constants.SUCCESS


def test_a_camera_round_trips_through_its_feature_name() -> None:
    assert features.camera_of(features.image_key("wrist.left")) == "wrist.left"
    assert features.camera_of(constants.OBS_STATE) is None
