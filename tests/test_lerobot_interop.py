"""LeRobot's own `lerobot-train` on what robotloop writes, and robotloop on what `lerobot-train` writes.

- a dataset robotloop recorded trains in `lerobot-train`, from a local copy and streamed from the bucket server
  (`--dataset.repo_type=bucket --dataset.streaming=true`, the dataset at the bucket's root: repo_id `<ns>/<bucket>`);
- `lerobot-train --policy.path=<robotloop checkpoint>` fine-tunes a policy robotloop trained;
- `lerobot-train --resume=true --config_path=<robotloop checkpoint>/pretrained_model/train_config.json` resumes a
  run robotloop trained, and lerobot's `TrainPipelineConfig.from_pretrained` reads that file as the run was;
- `robotloop eval` (here `resolve_policy` + `evaluate`) runs a policy `lerobot-train` wrote, given its output folder;
- `lerobot-eval --policy.path=<robotloop checkpoint>` runs ours in gym-aloha's simulator.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from robotloop.capture import DatasetRecorder
from robotloop.deploy.evaluate import evaluate
from robotloop.deploy.resolve import resolve_policy
from robotloop.storage import BucketClient, BucketUrl
from robotloop.train.data import DataSettings
from robotloop.train.policy import ACTSettings
from robotloop.train.trainer import TrainSettings, train

from .conftest import WRITE_TOKEN
from .test_capture import SPEC, synthetic_episode

LEROBOT_TRAIN = str(Path(sys.executable).parent / "lerobot-train")
TINY = dict(dim_model=32, dim_feedforward=64, n_heads=2, n_encoder_layers=1, chunk_size=5, n_action_steps=5)
TINY_FLAGS = [f"--policy.{k}={v}" for k, v in TINY.items()]
RUN_FLAGS = ["--batch_size=2", "--save_freq=2", "--wandb.enable=false", "--policy.device=cpu"]
NEW_POLICY = ["--policy.type=act", "--policy.pretrained_backbone_weights=null", "--policy.push_to_hub=false"]


@pytest.fixture(scope="module")
def recorded(bucket_server, tmp_path_factory):
    """Two episodes robotloop recorded at a bucket's root, and a local copy of them."""
    tmp = tmp_path_factory.mktemp("interop")
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/interop")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp / "stage")
    for k in range(2):
        recorder.commit(synthetic_episode(k, frames=12))
    client.download_tree(url, tmp / "local")
    return client, url, tmp


def _lerobot_train(args: list[str], tmp: Path, endpoint: str, steps: int = 2) -> Path:
    out = tmp / f"lerobot-out-{len(list(tmp.glob('lerobot-out-*')))}"
    env = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_TOKEN": WRITE_TOKEN,
        "HF_HOME": str(tmp / "hf"),
        "HF_LEROBOT_HOME": str(tmp / "lerobot"),
    }
    run = subprocess.run(
        [LEROBOT_TRAIN, *args, *RUN_FLAGS, f"--steps={steps}", f"--output_dir={out}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (out / "checkpoints" / f"{steps:06d}" / "pretrained_model" / "model.safetensors").is_file()
    return out


@pytest.fixture(scope="module")
def theirs(recorded, bucket_server):
    """lerobot-train's output folder after 2 steps on a local copy of the dataset robotloop recorded."""
    _, _, tmp = recorded
    local = ["--dataset.repo_id=lab/interop", f"--dataset.root={tmp / 'local'}", "--num_workers=0"]
    return _lerobot_train([*local, *NEW_POLICY, *TINY_FLAGS], tmp, bucket_server.endpoint)


def test_lerobot_train_reads_our_dataset_and_robotloop_evaluates_what_it_wrote(theirs):
    out = theirs
    model = resolve_policy(str(out))  # lerobot-train's output folder: its checkpoints/last link
    assert model == (out / "checkpoints" / "000002" / "pretrained_model").resolve()
    report = evaluate(model, "transfer_cube", episodes=1, max_steps=3, image_size=(24, 32))
    assert len(report.episodes) == 1 and report.episodes[0].steps == 3


def test_lerobot_train_streams_our_dataset_from_the_bucket_server(recorded, bucket_server):
    _, _, tmp = recorded
    # One DataLoader worker at least: lerobot 0.6.1's streaming was reported not to start with --num_workers=0.
    stream = ["--dataset.repo_id=lab/interop", "--dataset.repo_type=bucket", "--dataset.streaming=true"]
    _lerobot_train([*stream, "--num_workers=1", *NEW_POLICY, *TINY_FLAGS], tmp, bucket_server.endpoint)


def test_a_lerobot_train_checkpoint_is_published_as_a_release_robots_pull(recorded, theirs, bucket_server):
    """`robotloop deploy publish --checkpoint outputs/train/<run>/checkpoints/last/pretrained_model --to <bucket
    folder>`: uploaded under <to>/checkpoints/<step>, signed, and pulled by a robot's release store byte for byte.
    The same command again is the same release; other files where it would upload are refused."""
    from robotloop.deploy.fetch import XetFetcher
    from robotloop.deploy.keys import generate_keypair, load_public_keys, public_path
    from robotloop.deploy.manifest import SignedManifest
    from robotloop.deploy.onnx_runner import ONNX_FILES
    from robotloop.deploy.store import ReleaseStore

    client, _, tmp = recorded
    key = tmp / "keys" / "deploy.key"
    generate_keypair(key)
    to = "hf://buckets/lab/interop-models/models/theirs"
    model = theirs / "checkpoints" / "last" / "pretrained_model"  # lerobot-train's link to its last step
    env = {**os.environ, "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint, "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN}

    def publish(checkpoint: Path, *extra: str) -> subprocess.CompletedProcess:
        args = ["deploy", "publish", "--checkpoint", str(checkpoint), "--name", "lerobot-v1", "--key", str(key)]
        command = [sys.executable, "-m", "robotloop.cli", *args, "--no-register", "--json", *extra]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    first = publish(model, "--to", to)
    assert first.returncode == 0, first.stdout + first.stderr
    result = json.loads(first.stdout)
    assert result["checkpoint"] == f"{to}/checkpoints/000002" and result["release"] == "lerobot-v1"
    stored = client.read_range(BucketUrl.parse(result["manifest"]), 0, 1 << 24)
    signed = SignedManifest.from_json(stored)
    store = ReleaseStore(tmp / "robot")
    store.pull(
        signed, load_public_keys([public_path(key)]), XetFetcher(client.endpoint, WRITE_TOKEN, signed.manifest.bucket)
    )
    pulled = store.model_dir("lerobot-v1")
    files = sorted(p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file())
    # lerobot's checkpoint byte for byte, and beside it the policy exported to ONNX at publish
    exported = sorted(ONNX_FILES)
    assert result["onnx"]["files"] == list(ONNX_FILES) and result["onnx"]["max_abs_diff"] <= 1e-4, result["onnx"]
    assert files and sorted(p.relative_to(pulled).as_posix() for p in pulled.rglob("*") if p.is_file()) == sorted(
        files + exported
    )
    assert all((pulled / f).read_bytes() == (model / f).read_bytes() for f in files)

    again = publish(theirs, "--to", to)  # the output folder itself: its checkpoints/last, the same files
    assert again.returncode == 0 and json.loads(again.stdout)["manifest"] == result["manifest"], again.stdout
    other = tmp / "other" / "checkpoints" / "000002" / "pretrained_model"
    shutil.copytree(model, other)
    (other / "config.json").write_text(
        (other / "config.json").read_text().replace('"chunk_size": 5', '"chunk_size": 6')
    )
    refused = publish(other, "--to", to)
    assert refused.returncode == 1 and "already holds other files" in " ".join(refused.stdout.split())
    nowhere = publish(model)
    assert nowhere.returncode == 1 and "--to" in nowhere.stdout


@pytest.fixture(scope="module")
def ours(recorded):
    """A tiny run robotloop trained on the recorded episodes (2 steps, one checkpoint), and a local copy of it."""
    client, url, tmp = recorded
    run = BucketUrl.parse("hf://buckets/lab/interop-models/models/tiny")
    settings = TrainSettings(steps=2, batch_size=2, checkpoint_every=2, seed=7, deterministic=True)
    train(client, [url], run, settings, ACTSettings(**TINY), DataSettings(decode_workers=1))
    local = tmp / "ours" / "000002"
    client.download_tree(BucketUrl.parse(f"{run}/checkpoints/000002"), local)
    return local


def test_lerobot_train_fine_tunes_a_policy_robotloop_trained(recorded, ours, bucket_server):
    _, _, tmp = recorded
    local = ["--dataset.repo_id=lab/interop", f"--dataset.root={tmp / 'local'}", "--num_workers=0"]
    _lerobot_train([*local, f"--policy.path={ours / 'pretrained_model'}"], tmp, bucket_server.endpoint)


def test_lerobot_eval_runs_a_policy_robotloop_trained(ours, tmp_path):
    """lerobot's own evaluation, in gym-aloha's simulator (dm_control, 480x640: a few steps only here)."""
    command = [
        str(Path(sys.executable).parent / "lerobot-eval"),
        f"--policy.path={ours / 'pretrained_model'}",
        "--policy.device=cpu",
        "--env.type=aloha",
        "--env.task=AlohaTransferCube-v0",
        "--env.episode_length=3",
        "--eval.n_episodes=1",
        "--eval.batch_size=1",
        f"--output_dir={tmp_path / 'eval'}",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "MUJOCO_GL": "egl"})
    assert run.returncode == 0, run.stderr[-3000:]
    overall = json.loads((tmp_path / "eval" / "eval_info.json").read_text())["overall"]
    assert overall["n_episodes"] == 1 and 0 <= overall["pc_success"] <= 100


def test_lerobot_reads_the_train_config_of_a_robotloop_checkpoint(ours):
    """train_config.json beside config.json, as lerobot-train writes it, holding our run in lerobot's terms."""
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.optim.optimizers import AdamWConfig

    cfg = TrainPipelineConfig.from_pretrained(ours / "pretrained_model")
    assert (cfg.dataset.repo_id, cfg.dataset.repo_type, cfg.dataset.streaming) == ("lab/interop", "bucket", True)
    assert (cfg.steps, cfg.batch_size, cfg.seed, cfg.save_freq, cfg.num_workers) == (2, 2, 7, 2, 1)
    assert cfg.policy.type == "act" and cfg.policy.push_to_hub is False
    assert {k: getattr(cfg.policy, k) for k in TINY} == TINY
    assert isinstance(cfg.optimizer, AdamWConfig) and cfg.optimizer.lr == cfg.policy.optimizer_lr == 1e-5
    assert cfg.scheduler is None and cfg.use_policy_training_preset  # ACT's preset: AdamW, no scheduler


def test_lerobot_train_resumes_a_run_robotloop_trained(recorded, ours, bucket_server):
    """lerobot-train's own resume (--config_path=<checkpoint>/pretrained_model/train_config.json) on our checkpoint:
    it streams the dataset the config names from the bucket server and carries on from our step 2 to 4."""
    _, _, tmp = recorded
    resume = ["--resume=true", f"--config_path={ours / 'pretrained_model' / 'train_config.json'}"]
    out = _lerobot_train(resume, tmp, bucket_server.endpoint, steps=4)
    assert not (out / "checkpoints" / "000002").exists()  # it started at our step 2, not from scratch
    step = json.loads((out / "checkpoints" / "000004" / "training_state" / "training_step.json").read_text())
    assert step["step"] == 4


@pytest.mark.parametrize(
    ("schedule", "scheduler", "preset"),
    [
        ({}, None, True),
        ({"warmup_steps": 3}, "constant_with_warmup", False),
        ({"lr_schedule": "cosine", "warmup_steps": 3}, "cosine_annealing_with_warmup", False),
        ({"lr_schedule": "cosine", "lr_min_ratio": 0.1}, "cosine_decay_with_warmup", False),
    ],
)
def test_train_config_says_our_schedule_and_datasets_in_lerobots_terms(tmp_path, schedule, scheduler, preset):
    """Each learning-rate schedule as lerobot's nearest scheduler (ACT's preset only where it is ours), a dataset
    below a bucket's root as lerobot's repo_id spells it, read back by lerobot's loader; several datasets: none."""
    from lerobot.configs.train import TrainPipelineConfig

    from robotloop.train.policy import make_act_config
    from robotloop.train.train_config import lerobot_train_config

    from .test_train_policy import FEATURES

    act = ACTSettings(**TINY, lr=3e-4, **schedule)
    policy = make_act_config(FEATURES, act, torch.device("cpu"))
    cube, other = BucketUrl.parse("hf://buckets/lab/a/datasets/cube"), BucketUrl.parse("hf://buckets/lab/b")
    settings = TrainSettings(steps=50, batch_size=4, seed=3, log_every=5, checkpoint_every=25)
    run = BucketUrl.parse("hf://buckets/lab/models/run1")
    assert lerobot_train_config(policy, [cube, other], run, settings, act) is None  # lerobot trains on one dataset
    lerobot_train_config(policy, [cube], run, settings, act).save_pretrained(tmp_path)
    cfg = TrainPipelineConfig.from_pretrained(tmp_path)
    assert cfg.dataset.repo_id == "lab/a/datasets/cube" and cfg.job_name == "run1"
    assert (cfg.steps, cfg.batch_size, cfg.seed, cfg.log_freq, cfg.save_freq) == (50, 4, 3, 5, 25)
    assert cfg.optimizer.lr == cfg.policy.optimizer_lr == 3e-4 and cfg.use_policy_training_preset is preset
    assert (cfg.scheduler.type if cfg.scheduler else None) == scheduler
    if scheduler:
        assert cfg.scheduler.num_warmup_steps == act.warmup_steps
