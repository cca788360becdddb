"""SIGKILL of `robotloop train` while it writes checkpoints: every checkpoint the run points at is whole and loads,
no process of the run is left behind, and `--resume` carries on from it. Real bucket server, real trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from robotloop.capture import DatasetRecorder
from robotloop.deploy.runner import REQUIRED_FILES, PolicyRunner
from robotloop.storage import BucketClient, BucketUrl
from robotloop.train.layout import checkpoint_url, latest_step

from .conftest import WRITE_TOKEN
from .test_capture import SPEC, _alive, _children, synthetic_episode

DATASET = "hf://buckets/lab/train-crash/datasets/cube"
OUTPUT = "hf://buckets/lab/train-crash/models/killed"


def _train(bucket_server, tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "robotloop.cli",
        "--endpoint",
        bucket_server.endpoint,
        "--token",
        WRITE_TOKEN,
        "train",
        "--dataset",
        DATASET,
        "--output",
        OUTPUT,
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--tiny",
        "--log-every",
        "1",
        "--decode-workers",
        "1",
        "--onnx",  # no export of the last checkpoint: seconds of 2 cores that this test is not about
        "off",
        *extra,
    ]


def test_sigkill_during_checkpoints_leaves_whole_checkpoints_and_no_processes(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    recorder = DatasetRecorder(client, BucketUrl.parse(DATASET), SPEC, staging=tmp_path / "stage")
    for k in range(2):
        recorder.commit(synthetic_episode(k, frames=16))
    out = BucketUrl.parse(OUTPUT)
    env = {**os.environ, "ROBOTLOOP_CONFIG": os.devnull, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    log = open(tmp_path / "train.log", "w")
    # A checkpoint every 2 steps: the kill lands inside (or between) checkpoint uploads.
    proc = subprocess.Popen(
        _train(bucket_server, tmp_path, "--steps", "2000", "--checkpoint-every", "2"),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 240
    while (latest_step(client, out) or 0) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "train.log").read_text()[-3000:]
        time.sleep(0.2)
    workers = _children(proc.pid)
    assert workers, "the trainer decodes in worker processes"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while (alive := [pid for pid in workers if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"processes {alive} outlived the killed trainer"

    step = latest_step(client, out)  # what the run points at is whole: every file of a loadable policy
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        client.download_tree(checkpoint_url(out, step) / "pretrained_model", model)
        assert all((model / name).is_file() for name in REQUIRED_FILES)
        PolicyRunner.load(model)
    resumed = subprocess.run(
        _train(bucket_server, tmp_path, "--steps", str(step + 2), "--checkpoint-every", "2", "--resume"),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert latest_step(client, out) == step + 2
