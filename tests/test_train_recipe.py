"""The training recipe options the h200 preset uses: a policy image size of its own, learned BatchNorm in a
random-init backbone, the LR schedule, random-shift augmentation, and how a saved policy acts at run time.

Each checks what lerobot's own loaders make of what we save, since a user's lerobot tools must read it.
CPU only, tiny ACT, one 48x64 camera seen at 24x32.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors

from robotloop.capture.recorder import DatasetSpec
from robotloop.deploy.runner import PolicyLoadError, PolicyRunner
from robotloop.loop.pipeline import TINY_ACT
from robotloop.train.data import DataSettings, buffer_bytes
from robotloop.train.policy import INPUTS_FILE, ACTSettings, build_policy, random_shift

CAM = "observation.images.top"
H, W, CHUNK = 48, 64, 10
FEATURES = {k: v for k, v in DatasetSpec.aloha((H, W)).features().items() if k in (CAM, "observation.state", "action")}
VEC = {
    "mean": np.zeros(14, np.float32),
    "std": np.ones(14, np.float32),
    "min": -np.ones(14, np.float32),
    "max": np.ones(14, np.float32),
}
STATS = {"observation.state": VEC, "action": VEC}


def _settings(**kw) -> ACTSettings:
    return ACTSettings(**{**TINY_ACT, "chunk_size": CHUNK, "n_action_steps": CHUNK, **kw})


def _batch(seed: int = 0, n: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        CAM: torch.randint(0, 256, (n, 3, H, W), dtype=torch.uint8, generator=g),
        "observation.state": torch.randn(n, 14, generator=g),
        "action": torch.randn(n, CHUNK, 14, generator=g),
        "action_is_pad": torch.zeros(n, CHUNK, dtype=torch.bool),
    }


def test_a_policy_that_sees_smaller_frames_resizes_them_the_same_way_in_training_and_in_lerobot(tmp_path):
    torch.manual_seed(0)
    policy = build_policy(FEATURES, STATS, _settings(image_size=(24, 32)))
    assert tuple(policy.policy.config.image_features[CAM].shape) == (3, 24, 32)
    for _ in range(2):
        policy.train_step(_batch())
    saved = policy.save_pretrained(tmp_path / "ckpt")
    assert json.loads((saved / INPUTS_FILE).read_text()) == {"cameras": {CAM: [H, W]}}

    # lerobot's own loaders: the saved preprocessor resizes a camera-size frame to what the model was trained on.
    loaded = ACTPolicy.from_pretrained(saved)
    pre, _ = make_pre_post_processors(loaded.config, pretrained_path=str(saved))
    frame = _batch(1, n=1)
    out = pre({CAM: frame[CAM].float() / 255, "observation.state": frame["observation.state"]})
    assert out[CAM].shape == (1, 3, 24, 32)
    policy.policy.eval()
    ours = policy.prepare({**frame, CAM: frame[CAM]})  # the trainer's path: uint8 -> [0, 1] -> resize -> normalize
    assert torch.allclose(ours[CAM], out[CAM], atol=1e-5)

    # The robot's runner takes the camera's frames (48x64), not the policy's 24x32.
    runner = PolicyRunner.load(saved)
    assert runner.image_size == (H, W)
    obs = {"pixels": {"top": np.zeros((H, W, 3), np.uint8)}, "agent_pos": np.zeros(14)}
    assert runner.act(obs).shape == (14,)
    runner.reset()  # the next act() runs the model on its observation
    with pytest.raises(ValueError, match="48x64x3"):
        runner.act({**obs, "pixels": {"top": np.zeros((24, 32, 3), np.uint8)}})


def test_a_policy_trained_at_the_cameras_size_saves_that_size_for_lerobot_eval(tmp_path):
    """lerobot-eval renders gym-aloha at 480x640: a policy trained on 48x64 frames must resize them to 48x64 itself
    (its saved preprocessor), not be fed 480x640 without a word."""
    policy = build_policy(FEATURES, STATS, _settings())
    saved = policy.save_pretrained(tmp_path / "ckpt")
    loaded = ACTPolicy.from_pretrained(saved)
    pre, _ = make_pre_post_processors(loaded.config, pretrained_path=str(saved))
    eval_frame = torch.rand(1, 3, 480, 640)
    out = pre({CAM: eval_frame, "observation.state": torch.zeros(1, 14)})
    assert out[CAM].shape == (1, 3, H, W)
    frame = _batch(2, n=1)  # at the camera's size the trainer's path matches lerobot's
    policy.policy.eval()
    ours = policy.prepare(frame)
    theirs = pre({CAM: frame[CAM].float() / 255, "observation.state": frame["observation.state"]})
    assert torch.allclose(ours[CAM], theirs[CAM], atol=1e-5)


def test_learned_batch_norm_is_what_lerobots_frozen_act_loads(tmp_path):
    torch.manual_seed(0)
    policy = build_policy(FEATURES, STATS, _settings(backbone_norm="batch"))
    norms = [m for m in policy.policy.model.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 20
    before = norms[0].running_mean.clone()
    for seed in range(3):
        policy.train_step(_batch(seed))
    assert not torch.equal(norms[0].running_mean, before)  # statistics are learned
    assert not any(k.endswith("num_batches_tracked") for k in policy.state_dict_fp32())
    saved = policy.save_pretrained(tmp_path / "ckpt")
    loaded = ACTPolicy.from_pretrained(saved).eval()  # FrozenBatchNorm2d, strict load
    policy.policy.eval()
    batch = policy.prepare(_batch(7))
    batch["observation.images"] = [batch[CAM]]
    with torch.no_grad():
        assert torch.allclose(policy.policy.model(batch)[0], loaded.model(batch)[0], atol=1e-4)


def test_frozen_batch_norm_stays_lerobots_default():
    policy = build_policy(FEATURES, STATS, _settings())
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in policy.policy.modules())


def test_the_learning_rate_warms_up_then_follows_a_cosine_to_its_floor():
    s = _settings(lr=1e-4, lr_schedule="cosine", warmup_steps=10, lr_min_ratio=0.1)
    assert s.lr_factor(0, 110) == pytest.approx(0.1) and s.lr_factor(9, 110) == pytest.approx(1.0)
    assert s.lr_factor(10, 110) == pytest.approx(1.0) and s.lr_factor(60, 110) == pytest.approx(0.55)
    assert s.lr_factor(110, 110) == pytest.approx(0.1) and s.lr_factor(500, 110) == pytest.approx(0.1)
    assert _settings().lr_factor(5, 100) == 1.0  # lerobot's constant LR is the default
    policy = build_policy(FEATURES, STATS, s)
    policy.set_lr_factor(s.lr_factor(60, 110))
    assert [g["lr"] for g in policy.optimizer().param_groups] == pytest.approx([0.55e-4, 0.55e-5])


@pytest.mark.parametrize(
    "bad",
    [
        dict(lr_schedule="linear"),
        dict(backbone_norm="group"),
        dict(warmup_steps=-1),
        dict(lr_min_ratio=2.0),
        dict(random_shift=-1),
        dict(image_size=(0, 32)),
        dict(temporal_ensemble_coeff=0.01),
    ],  # ensembling needs 1 step
)
def test_bad_recipe_values_are_refused(bad):
    with pytest.raises(ValueError):
        _settings(**bad)


def test_random_shift_moves_each_image_by_at_most_pad_pixels():
    torch.manual_seed(0)
    images = torch.arange(2 * 1 * 20 * 30, dtype=torch.float32).reshape(2, 1, 20, 30)
    shifted = random_shift(images, 3)
    assert shifted.shape == images.shape
    for i in range(2):  # the interior of each output is the input moved by one whole-pixel offset
        found = [
            (dy, dx)
            for dy in range(-3, 4)
            for dx in range(-3, 4)
            if torch.equal(shifted[i, 0, 5:15, 5:25], images[i, 0, 5 + dy : 15 + dy, 5 + dx : 25 + dx])
        ]
        assert len(found) == 1
    assert not torch.equal(random_shift(images, 3), random_shift(images, 3))  # a new offset per call


def test_a_saved_policy_can_act_with_other_inference_settings(tmp_path):
    policy = build_policy(FEATURES, STATS, _settings(n_action_steps=1, temporal_ensemble_coeff=0.01))
    saved = policy.save_pretrained(tmp_path / "ckpt")
    assert json.loads((saved / "config.json").read_text())["temporal_ensemble_coeff"] == 0.01  # lerobot-eval sees it
    assert PolicyRunner.load(saved).ensembling
    chunked = PolicyRunner.load(saved, inference={"temporal_ensemble_coeff": None, "n_action_steps": 5})
    assert not chunked.ensembling and chunked.policy.config.n_action_steps == 5
    for bad in ({"n_action_steps": 5}, {"n_action_steps": 11, "temporal_ensemble_coeff": None}, {"lr": 1.0}):
        with pytest.raises(PolicyLoadError):
            PolicyRunner.load(saved, inference=bad)


def test_the_frame_buffer_is_sized_from_what_the_settings_or_the_device_allow():
    assert buffer_bytes(DataSettings(buffer_bytes=123), torch.device("cpu")) == 123
    assert buffer_bytes(DataSettings(), torch.device("cpu")) == 8 << 30
    assert math.isclose(DataSettings().buffer_share, 0.5)
