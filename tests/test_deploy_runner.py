"""robotloop.deploy.runner: a saved ACT checkpoint drives AlohaSim, chunk by chunk, seeing what training saw.

CPU only: a tiny random-weight ACT (dim 64, chunk 10) on 48x64 images.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from robotloop.capture import DatasetRecorder, DatasetSpec, Episode
from robotloop.deploy.runner import (
    NonFiniteAction,
    PolicyLoadError,
    PolicyRunner,
    make_tiny_checkpoint,
)
from robotloop.sim import AlohaSim, record_demo
from robotloop.sim.constants import NO_SHADOWS
from robotloop.storage import BucketClient, BucketUrl

from .conftest import WRITE_TOKEN

SIZE = (48, 64)
CHUNK = 10


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("policy") / "pretrained_model", SIZE, chunk_size=CHUNK)


@pytest.fixture(scope="module")
def sim() -> AlohaSim:
    with AlohaSim("transfer_cube", image_size=SIZE, shadow_map=NO_SHADOWS) as s:
        yield s


def _copy(src: Path, dest: Path) -> Path:
    return Path(shutil.copytree(src, dest))


def _forward_counter(runner: PolicyRunner) -> list[int]:
    calls = [0]
    runner.policy.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_runner_acts_chunk_by_chunk(tiny: Path, sim: AlohaSim) -> None:
    runner = PolicyRunner.load(tiny)
    assert runner.image_size == SIZE and runner.action_dim == 14 and not runner.ensembling
    obs = sim.reset(seed=0)
    runner.reset()
    runner.warmup(obs)
    assert runner.at_chunk_boundary  # warmup leaves the queue alone
    calls = _forward_counter(runner)
    boundaries, actions = [], []
    for _ in range(2 * CHUNK + 1):
        boundaries.append(runner.at_chunk_boundary)
        action = runner.act(obs)
        assert action.shape == (14,) and action.dtype == np.float32 and np.isfinite(action).all()
        actions.append(action)
        obs, *_ = sim.step(action)
    assert [i for i, b in enumerate(boundaries) if b] == [0, CHUNK, 2 * CHUNK]
    assert calls[0] == 3  # the model runs at boundaries only
    # a chunk of distinct actions, not one action repeated
    assert np.abs(np.stack(actions) - actions[0]).max() > 0
    runner.act(obs)
    assert not runner.at_chunk_boundary
    runner.replan()  # mid-chunk (an expert handed back): the next action is a new chunk's, planned on this frame
    assert runner.at_chunk_boundary
    planned = runner.act(obs)
    assert calls[0] == 4 and not runner.at_chunk_boundary
    runner.reset()
    np.testing.assert_allclose(planned, runner.act(obs), rtol=1e-5, atol=1e-6)  # as a new episode's first
    runner.reset()
    assert runner.at_chunk_boundary


def test_a_lockstep_batch_acts_as_lerobots_select_action_and_reads_frames_at_boundaries_only(tiny: Path) -> None:
    """`act_batch` keeps the chunk queue itself (so that `at_chunk_boundary` holds for a batch): its actions are
    lerobot's `select_action`'s, and midway through a chunk it reads no frame, so none need be rendered."""
    runner = PolicyRunner.load(tiny)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, *SIZE, 3), dtype=np.uint8)
    states = rng.normal(size=(3, 14)).astype(np.float32)
    runner.reset()
    ours, boundaries = [], []
    for _ in range(CHUNK + 2):
        boundaries.append(runner.at_chunk_boundary)
        # frames only where the model runs: mid-chunk there are none to give
        ours.append(runner.act_batch({"top": frames} if runner.at_chunk_boundary else {}, states))
    assert [i for i, b in enumerate(boundaries) if b] == [0, CHUNK]
    # lerobot's own queue, on the same inputs each step
    batch = runner._tensors({"observation.images.top": frames, "observation.state": states})
    runner.policy.reset()
    with torch.inference_mode():
        theirs = [
            runner.postprocessor(runner.policy.select_action(runner.preprocessor(batch))).float().cpu().numpy()
            for _ in range(CHUNK + 2)
        ]
    np.testing.assert_allclose(np.stack(ours), np.stack(theirs), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="a batch of 2 episodes after 3 episodes"):
        runner.act_batch({}, states[:2])  # mid-chunk, another batch's size
    runner.reset()
    assert runner.act_batch({"top": frames[:2]}, states[:2]).shape == (2, 14)


def test_temporal_ensembling_runs_every_step(tiny: Path, sim: AlohaSim, tmp_path: Path) -> None:
    ckpt = _copy(tiny, tmp_path / "ensembled")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "temporal_ensemble_coeff": 0.01, "n_action_steps": 1}))
    plain, ensembled = PolicyRunner.load(tiny), PolicyRunner.load(ckpt)
    assert ensembled.ensembling
    obs = sim.reset(seed=1)
    first = plain.act(obs)
    calls = _forward_counter(ensembled)
    for step in range(3):
        assert ensembled.at_chunk_boundary
        action = ensembled.act(obs)
        if step == 0:  # an ensemble of one chunk is that chunk's first action
            np.testing.assert_allclose(action, first, rtol=1e-5, atol=1e-6)
        obs, *_ = sim.step(action)
    assert calls[0] == 3


def _drop_a_weight(ckpt: Path) -> None:
    weights = load_file(ckpt / "model.safetensors")
    weights.pop(next(iter(weights)))
    save_file(weights, ckpt / "model.safetensors")


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: shutil.rmtree(d), "no such checkpoint directory"),
        (lambda d: (d / "model.safetensors").unlink(), "missing model.safetensors"),
        (
            lambda d: (d / "policy_preprocessor.json").unlink(),
            "missing policy_preprocessor.json",
        ),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header"),
            "cannot load the weights",
        ),
        (_drop_a_weight, "cannot load the weights"),
        (lambda d: (d / "config.json").write_text("{not json"), "config"),
        (lambda d: _edit_config(d, type="diffusion"), "a 'diffusion' policy; the runner loads ACT policies only"),
        (lambda d: _edit_config(d, chunk_size="many"), "chunk_size"),
    ],
    ids=[
        "no-dir",
        "no-weights",
        "no-processor",
        "corrupt-safetensors",
        "missing-key",
        "bad-config",
        "not-act",
        "bad-field",
    ],
)
def test_load_errors_say_what_is_wrong(tiny: Path, tmp_path: Path, breakage, message: str) -> None:
    ckpt = _copy(tiny, tmp_path / "broken")
    breakage(ckpt)
    with pytest.raises(PolicyLoadError, match=message):
        PolicyRunner.load(ckpt)


def _edit_config(ckpt: Path, **changes) -> None:
    path = ckpt / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_load_leaves_no_temp_files(tiny: Path, tmp_path: Path, monkeypatch) -> None:
    # lerobot's PreTrainedConfig.from_pretrained leaves a temp file per call; a robot loads many releases.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    PolicyRunner.load(tiny)
    assert list(tmp_path.iterdir()) == []


def test_non_finite_weights_raise_before_acting(tiny: Path, sim: AlohaSim, tmp_path: Path) -> None:
    ckpt = _copy(tiny, tmp_path / "nan")
    weights = load_file(ckpt / "model.safetensors")
    weights["model.action_head.bias"] = torch.full_like(weights["model.action_head.bias"], float("nan"))
    save_file(weights, ckpt / "model.safetensors")
    runner = PolicyRunner.load(ckpt)
    with pytest.raises(NonFiniteAction, match="non-finite"):
        runner.act(sim.reset(seed=0))
    assert runner.at_chunk_boundary  # nothing of the bad chunk was queued


def test_bad_observations_are_refused(tiny: Path) -> None:
    runner = PolicyRunner.load(tiny)
    state = np.zeros(14)
    with pytest.raises(ValueError, match="48x64"):
        runner.act({"pixels": {"top": np.zeros((96, 128, 3), np.uint8)}, "agent_pos": state})
    with pytest.raises(ValueError, match="uint8"):
        runner.act({"pixels": {"top": np.zeros((48, 64, 3), np.float32)}, "agent_pos": state})
    with pytest.raises(ValueError, match="camera 'top'; the observation's cameras: none$"):  # words, not a list
        runner.act({"agent_pos": state})
    with pytest.raises(ValueError, match="the observation's cameras: front, wrist$"):
        runner.act({"pixels": {"wrist": np.zeros((48, 64, 3), np.uint8), "front": np.zeros((48, 64, 3), np.uint8)}})
    frame = {"top": np.zeros((48, 64, 3), np.uint8)}
    with pytest.raises(ValueError, match="NaN or infinite"):
        runner.act({"pixels": frame, "agent_pos": np.full(14, np.nan)})
    with pytest.raises(ValueError, match="a state of 14 values; the robot's has 6$"):  # not the array itself
        runner.act({"pixels": frame, "agent_pos": np.zeros(6)})


def test_runner_sees_what_the_recorder_stored(tiny: Path, bucket_server, tmp_path: Path) -> None:
    """A recorded demo read back with LeRobotDataset vs the runner's conversion of the same sim observations."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.envs.utils import preprocess_observation

    steps = 12
    demo = record_demo("transfer_cube", seed=3, image_size=SIZE, max_steps=steps)
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/deploy-runner/datasets/demo")
    recorder = DatasetRecorder(client, url, DatasetSpec.aloha(SIZE), staging=tmp_path / "stage")
    recorder.commit(
        Episode(
            {"top": demo.frames},
            demo.states,
            demo.actions,
            "cube",
            demo.rewards,
            demo.rewards >= 4,
        )
    )
    client.fetch(url, tmp_path / "read")
    dataset = LeRobotDataset(url.bucket_id, root=tmp_path / "read")

    runner = PolicyRunner.load(tiny)
    # shadows on: as the recorder renders
    with AlohaSim("transfer_cube", image_size=SIZE) as sim:
        obs = sim.reset(seed=3)
        for t in range(steps):
            mine = runner.to_batch(obs)
            stored = dataset[t]
            assert mine["observation.state"].dtype == torch.float32
            # Exact at t=0; later the replay steps with the stored float32 actions where the demo stepped with
            # float64 ones, which moves the joints by ~1e-7.
            torch.testing.assert_close(
                mine["observation.state"][0],
                stored["observation.state"],
                rtol=0,
                atol=0 if t == 0 else 1e-6,
            )
            # Exactly lerobot's own env -> policy conversion, and exactly the frame handed to the recorder.
            lerobot_batch = preprocess_observation(obs)
            for key in mine:
                torch.testing.assert_close(mine[key], lerobot_batch[key], rtol=0, atol=0)
            raw = torch.from_numpy(demo.frames[t]).permute(2, 0, 1).float() / 255
            torch.testing.assert_close(mine["observation.images.top"][0], raw, rtol=0, atol=0)
            # The stored video frame is a lossy copy of it: close, and closer than a BGR or transposed mix-up.
            image, decoded = (
                mine["observation.images.top"][0],
                stored["observation.images.top"],
            )
            assert image.shape == decoded.shape == (3, *SIZE)
            error = (image - decoded).abs().mean().item()
            assert error < 0.03, (t, error)
            assert error < (image.flip(0) - decoded).abs().mean().item()
            obs, *_ = sim.step(demo.actions[t])


def test_load_never_downloads_backbone_weights(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config saved by lerobot-train names ImageNet weights; building it as-is makes torchvision download."""
    import torchvision

    def no_network(*args, **kwargs):
        raise AssertionError("tried to download weights")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", no_network, raising=False)
    ckpt = _copy(tiny, tmp_path / "imagenet-config")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["pretrained_backbone_weights"] = "ResNet18_Weights.IMAGENET1K_V1"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    loaded = PolicyRunner.load(ckpt).policy.state_dict()
    for key, value in load_file(tiny / "model.safetensors").items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_is_a_load_error(tiny: Path) -> None:
    with pytest.raises(PolicyLoadError, match="CUDA is not available"):
        PolicyRunner.load(tiny, "cuda")
    with pytest.raises(PolicyLoadError, match="device 'gpu'"):
        PolicyRunner.load(tiny, "gpu")


def test_a_control_loop_slower_than_its_rate_is_measured_and_said(caplog):
    """`robot run` claimed 50 Hz while running 13-17 Hz: the rate reached is measured and a shortfall warned."""
    import logging
    import time

    from robotloop.deploy.runtime import RateWatch

    watch = RateWatch(target_hz=100.0, window_s=0.2)
    with caplog.at_level(logging.WARNING, logger="robotloop.deploy.runtime"):
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            time.sleep(0.02)  # a 20 ms tick against a 10 ms period
            watch.tick()
    assert watch.last_hz is not None and 30 < watch.last_hz < 60
    warnings = [r.getMessage() for r in caplog.records if "under the 100 Hz" in r.getMessage()]
    assert len(warnings) == 1  # once, not every window
    fast = RateWatch(target_hz=20.0, window_s=0.2)
    with caplog.at_level(logging.WARNING, logger="robotloop.deploy.runtime"):
        caplog.clear()
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            time.sleep(0.01)
            fast.tick()
    assert fast.last_hz > 20 and not caplog.records
