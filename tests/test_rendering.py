"""A run's sim rendering (the lights' shadow-map side) travels with its data and its policy.

Recorded into the dataset's camera feature (lerobot keeps it), refused where it would mix two renderings, read by
training into the policy's saved inputs, and used by evaluation and sim robots by default: a policy is evaluated on
the pixels it was trained on. Everything real: the bucket server, lerobot's writer and reader, MuJoCo.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from robotloop.capture import BadEpisode, DatasetRecorder, DatasetSpec
from robotloop.capture.recorder import SHADOW_MAP_INFO, camera_shadow_map
from robotloop.capture.sim_record import record_sim
from robotloop.deploy.envs import FROM_POLICY, SimControlEnv
from robotloop.deploy.evaluate import evaluate
from robotloop.deploy.runner import PolicyLoadError, PolicyRunner, make_tiny_checkpoint
from robotloop.errors import BadValue
from robotloop.sim import AlohaSim
from robotloop.sim.constants import NO_SHADOWS, shadow_map_size
from robotloop.storage import BucketClient, BucketUrl
from robotloop.train.data.catalog import EpisodeCatalog
from robotloop.train.data.errors import DatasetMismatch
from robotloop.train.policy import INPUTS_FILE

from .conftest import WRITE_TOKEN

SIZE = (24, 32)  # gym-aloha's rendering at this size: shadow_map_size(24, 32) == 1024
SIDE = 2048


def test_a_dataset_says_how_its_sim_cameras_were_rendered_only_when_not_as_gym_aloha():
    assert shadow_map_size(*SIZE) == 1024 and shadow_map_size(480, 640) == 4096
    top = "observation.images.top"
    assert DatasetSpec.aloha(SIZE, "h264", SIDE).features()[top]["info"] == {SHADOW_MAP_INFO: SIDE}
    for same_as_gym_aloha in (DatasetSpec.aloha(SIZE, "h264"), DatasetSpec.aloha(SIZE, "h264", 1024)):
        assert "info" not in same_as_gym_aloha.features()[top]  # nothing new to say: datasets stay as they were
    assert camera_shadow_map(DatasetSpec.aloha(SIZE, "h264", SIDE).features()[top]) == SIDE
    with pytest.raises(BadValue, match="one of 256, 512.*, or 0 for no shadows, not 3000"):
        DatasetSpec.aloha(SIZE, "h264", 3000)
    # No shadows is a rendering like any other: said in the dataset, and 0 is not mistaken for "not said".
    flat = DatasetSpec.aloha(SIZE, "h264", NO_SHADOWS).features()[top]
    assert flat["info"] == {SHADOW_MAP_INFO: 0} and camera_shadow_map(flat) == NO_SHADOWS


def test_no_shadows_leaves_the_scene_as_it_is_but_for_its_shadows():
    with (
        AlohaSim("transfer_cube", image_size=SIZE) as shaded,
        AlohaSim("transfer_cube", image_size=SIZE, shadow_map=NO_SHADOWS) as flat,
    ):
        assert (shaded.camera.shadow_map, flat.camera.shadow_map) == (1024, NO_SHADOWS)
        shaded.reset(seed=3)
        flat.reset(seed=3)
        with_shadows, without = shaded.render().astype(int), flat.render().astype(int)
    moved = np.abs(with_shadows - without).max(-1) > 8
    assert 0.01 < moved.mean() < 0.2, moved.mean()  # the shadows' pixels, not the scene's
    assert ((without - with_shadows) >= -2).all(-1).mean() > 0.99  # where a shadow was, it is lighter now


@pytest.fixture(scope="module")
def recorded(bucket_server, tmp_path_factory) -> tuple[BucketClient, BucketUrl, BucketUrl]:
    """Two one-episode datasets of the same scene, one rendered with 2048-texel maps, one as gym-aloha renders."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    urls = []
    for name, side in (("shadows-2048", SIDE), ("shadows-default", None)):
        url = BucketUrl.parse(f"hf://buckets/lab/rendering/datasets/{name}")
        stage = tmp_path_factory.mktemp(name)
        recorder = DatasetRecorder(client, url, DatasetSpec.aloha(SIZE, "h264", side), staging=stage)
        report = record_sim(recorder, "transfer_cube", 1, image_size=SIZE, max_steps=4, keep_failed=True)
        assert len(report.committed) == 1
        urls.append(url)
    return client, *urls


def test_the_rendering_is_in_the_dataset_lerobot_reads(recorded, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    client, shadowed, default = recorded
    client.fetch(shadowed, tmp_path / "ds")
    dataset = LeRobotDataset(shadowed.bucket_id, root=tmp_path / "ds")
    assert dataset.meta.total_frames == 4 and tuple(dataset[0]["observation.images.top"].shape) == (3, *SIZE)
    info = json.loads((tmp_path / "ds" / "meta" / "info.json").read_text())["features"]["observation.images.top"]
    assert info["info"][SHADOW_MAP_INFO] == SIDE and info["info"]["video.codec"] == "h264"  # lerobot's keys kept


def test_episodes_of_another_rendering_are_not_appended(recorded, tmp_path):
    client, shadowed, _ = recorded
    recorder = DatasetRecorder(client, shadowed, DatasetSpec.aloha(SIZE, "h264"), staging=tmp_path / "s")
    with pytest.raises(BadEpisode, match="rendered with 2048-texel shadow maps; these episodes are rendered with the"):
        recorder.committed_episodes()  # before any demo is recorded
    with pytest.raises(BadEpisode, match="these episodes are rendered with 512-texel"):
        DatasetRecorder(client, shadowed, DatasetSpec.aloha(SIZE, "h264", 512), staging=tmp_path / "t").commit(
            _episode()
        )
    with pytest.raises(BadEpisode, match="these episodes are rendered with no shadows"):
        DatasetRecorder(client, shadowed, DatasetSpec.aloha(SIZE, "h264", NO_SHADOWS), staging=tmp_path / "v").commit(
            _episode()
        )
    assert (
        DatasetRecorder(  # the dataset is as it was, and takes episodes rendered as it is
            client, shadowed, DatasetSpec.aloha(SIZE, "h264", SIDE), staging=tmp_path / "u"
        ).committed_episodes()
        == 1
    )


def _episode():
    from robotloop.capture import Episode

    zeros = np.zeros((3, 14), np.float32)
    return Episode({"top": np.zeros((3, *SIZE, 3), np.uint8)}, zeros, zeros, "x", np.zeros(3, np.float32))


def test_training_refuses_datasets_of_two_renderings(recorded):
    client, shadowed, default = recorded
    with pytest.raises(DatasetMismatch, match="differs from"):
        EpisodeCatalog(client, [shadowed, default], rank=0, world_size=1)
    catalog = EpisodeCatalog(client, [shadowed], rank=0, world_size=1)
    assert camera_shadow_map(catalog.features["observation.images.top"]) == SIDE  # what the policy is built from


@pytest.fixture(scope="module")
def shadowed_policy(tmp_path_factory) -> Path:
    """A tiny ACT built, as training builds it, from the features of a dataset rendered with 2048-texel maps."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("policy") / "pretrained_model", SIZE, shadow_map=SIDE)


def test_the_policy_keeps_its_datas_rendering_and_evaluation_renders_with_it(shadowed_policy):
    saved = json.loads((shadowed_policy / INPUTS_FILE).read_text())
    assert saved == {"cameras": {"observation.images.top": list(SIZE)}, "shadow_map": SIDE}
    assert PolicyRunner.load(shadowed_policy).shadow_map == SIDE
    assert evaluate(shadowed_policy, "transfer_cube", episodes=1, max_steps=2).shadow_map == SIDE
    assert evaluate(shadowed_policy, "transfer_cube", episodes=1, max_steps=2, shadow_map=1024).shadow_map == 1024


def test_a_policy_of_gym_aloha_pixels_saves_no_rendering(tmp_path):
    plain = make_tiny_checkpoint(tmp_path / "plain", SIZE)
    assert "shadow_map" not in json.loads((plain / INPUTS_FILE).read_text())
    assert PolicyRunner.load(plain).shadow_map is None


def test_a_bad_saved_rendering_is_a_load_error(shadowed_policy, tmp_path):
    import shutil

    broken = Path(shutil.copytree(shadowed_policy, tmp_path / "broken"))
    (broken / INPUTS_FILE).write_text(json.dumps({"cameras": {"observation.images.top": list(SIZE)}, "shadow_map": 3}))
    with pytest.raises(PolicyLoadError, match="not a readable camera size file"):
        PolicyRunner.load(broken)


def test_a_sim_robot_sized_by_its_policy_renders_as_its_data_was_rendered(shadowed_policy):
    runner = PolicyRunner.load(shadowed_policy)
    env = SimControlEnv("transfer_cube", FROM_POLICY, episode_steps=3)
    assert env.shadow_map is None  # not sized yet
    env.fit(runner.image_size, runner.shadow_map)
    try:
        assert (env.image_size, env.shadow_map) == (SIZE, SIDE)
    finally:
        env.close()
    given = SimControlEnv("transfer_cube", FROM_POLICY, episode_steps=3, shadow_map=512)  # the robot's own wins
    given.fit(runner.image_size, runner.shadow_map)
    try:
        assert given.shadow_map == 512
    finally:
        given.close()
    default = SimControlEnv("transfer_cube", SIZE, episode_steps=3)
    try:
        assert default.shadow_map == shadow_map_size(*SIZE)
    finally:
        default.close()


def test_the_onnx_export_keeps_the_rendering_for_robots_without_torch(shadowed_policy, tmp_path):
    from robotloop.deploy.onnx_export import export_onnx
    from robotloop.deploy.onnx_runner import OnnxRunner

    export_onnx(shadowed_policy, tmp_path / "onnx")
    assert OnnxRunner.load(tmp_path / "onnx").shadow_map == SIDE
