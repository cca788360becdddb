"""LeRobot's own `lerobot-train` on what robotloop writes, and robotloop on what `lerobot-train` writes.

- a dataset robotloop recorded trains in `lerobot-train`, from a local copy and streamed from the bucket server
  (`--dataset.repo_type=bucket --dataset.streaming=true`, the dataset at the bucket's root: repo_id `<ns>/<bucket>`);
- `lerobot-train --policy.path=<robotloop checkpoint>` fine-tunes a policy robotloop trained;
- `robotloop eval` (here `resolve_policy` + `evaluate`) runs a policy `lerobot-train` wrote, given its output folder.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
RUN_FLAGS = ["--steps=2", "--batch_size=2", "--save_freq=2", "--wandb.enable=false", "--policy.device=cpu"]
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


def _lerobot_train(args: list[str], tmp: Path, endpoint: str) -> Path:
    out = tmp / f"lerobot-out-{len(list(tmp.glob('lerobot-out-*')))}"
    env = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_TOKEN": WRITE_TOKEN,
        "HF_HOME": str(tmp / "hf"),
        "HF_LEROBOT_HOME": str(tmp / "lerobot"),
    }
    run = subprocess.run(
        [LEROBOT_TRAIN, *args, *RUN_FLAGS, f"--output_dir={out}"], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (out / "checkpoints" / "000002" / "pretrained_model" / "model.safetensors").is_file()
    return out


def test_lerobot_train_reads_our_dataset_and_robotloop_evaluates_what_it_wrote(recorded, bucket_server):
    _, _, tmp = recorded
    local = ["--dataset.repo_id=lab/interop", f"--dataset.root={tmp / 'local'}", "--num_workers=0"]
    out = _lerobot_train([*local, *NEW_POLICY, *TINY_FLAGS], tmp, bucket_server.endpoint)
    model = resolve_policy(str(out))  # lerobot-train's output folder: its checkpoints/last link
    assert model == (out / "checkpoints" / "000002" / "pretrained_model").resolve()
    report = evaluate(model, "transfer_cube", episodes=1, max_steps=3, image_size=(24, 32))
    assert len(report.episodes) == 1 and report.episodes[0].steps == 3


def test_lerobot_train_streams_our_dataset_from_the_bucket_server(recorded, bucket_server):
    _, _, tmp = recorded
    # One DataLoader worker at least: lerobot 0.6.1's streaming was reported not to start with --num_workers=0.
    stream = ["--dataset.repo_id=lab/interop", "--dataset.repo_type=bucket", "--dataset.streaming=true"]
    _lerobot_train([*stream, "--num_workers=1", *NEW_POLICY, *TINY_FLAGS], tmp, bucket_server.endpoint)


def test_lerobot_train_fine_tunes_a_policy_robotloop_trained(recorded, bucket_server):
    client, url, tmp = recorded
    run = BucketUrl.parse("hf://buckets/lab/interop-models/models/tiny")
    settings = TrainSettings(steps=2, batch_size=2, checkpoint_every=2, deterministic=True)
    train(client, [url], run, settings, ACTSettings(**TINY), DataSettings(decode_workers=1))
    ours = tmp / "ours"
    client.download_tree(BucketUrl.parse(f"{run}/checkpoints/000002/pretrained_model"), ours)
    local = ["--dataset.repo_id=lab/interop", f"--dataset.root={tmp / 'local'}", "--num_workers=0"]
    _lerobot_train([*local, f"--policy.path={ours}"], tmp, bucket_server.endpoint)
