"""`robotloop train` on CPU: a tiny ACT streams from the real bucket server, checkpoints in LeRobot's format,
resumes bit-for-bit, and picks up an episode committed while it runs."""

import json
import re
import threading

import pytest
import torch
from lerobot.policies.act.modeling_act import ACTPolicy

from robotloop.capture import DatasetRecorder
from robotloop.storage import BucketClient, BucketUrl
from robotloop.train.data import DataSettings
from robotloop.train.policy import ACTSettings
from robotloop.train.trainer import TrainSettings, train

from .conftest import WRITE_TOKEN
from .test_capture import SPEC, synthetic_episode

TINY = dict(
    dim_model=32,
    dim_feedforward=64,
    n_heads=2,
    n_encoder_layers=1,
    n_vae_encoder_layers=1,
    chunk_size=5,
    n_action_steps=5,
)


def _dataset(bucket_server, tmp_path, name, episodes=2):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse(f"hf://buckets/lab/train/datasets/{name}")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / f"stage-{name}")
    for k in range(episodes):
        recorder.commit(synthetic_episode(k, frames=16))
    return client, url, recorder


def _run(client, url, out, steps, resume=False, onnx="off", **kw):
    # Without the last checkpoint's ONNX export unless asked: ~5 s of 2 cores that these tests are not about.
    settings = TrainSettings(
        steps=steps,
        batch_size=4,
        log_every=1,
        checkpoint_every=3,
        seed=7,
        resume=resume,
        deterministic=True,
        onnx=onnx,
    )
    return train(client, [url], out, settings, ACTSettings(**TINY), DataSettings(decode_workers=1), **kw)


def test_checkpoints_load_in_lerobot_and_resume_bit_for_bit(bucket_server, tmp_path):
    client, url, _ = _dataset(bucket_server, tmp_path, "resume")
    straight = _run(client, url, BucketUrl.parse("hf://buckets/lab/train/models/straight"), steps=6)
    assert [s for s, _ in straight.losses] == list(range(6))
    assert straight.checkpoints[-1].endswith("checkpoints/000006")

    client.fetch(BucketUrl.parse(straight.checkpoints[-1]), tmp_path / "ckpt")
    policy = ACTPolicy.from_pretrained(tmp_path / "ckpt" / "pretrained_model")  # lerobot's own loader
    assert policy.config.chunk_size == 5
    lineage = json.loads((tmp_path / "ckpt" / "lineage.json").read_text())
    assert [e["episode_index"] for e in lineage["episodes"]] == [0, 1]
    assert all(len(f["xet_hash"]) == 64 for e in lineage["episodes"] for f in e["files"])
    assert lineage["code"]["robotloop"] and (tmp_path / "ckpt" / "loss.png").read_bytes()[:4] == b"\x89PNG"

    out = BucketUrl.parse("hf://buckets/lab/train/models/resumed")
    _run(client, url, out, steps=3)
    with pytest.raises(ValueError, match="already holds a run .* step 3.*--resume"):  # two runs would mix
        _run(client, url, out, steps=6)
    with pytest.raises(ValueError, match="already at step 3"):
        _run(client, url, out, steps=3, resume=True)
    resumed = _run(client, url, out, steps=6, resume=True)
    assert [s for s, _ in resumed.losses] == [0, 1, 2, 3, 4, 5]  # step count continues; the history came along
    assert resumed.losses == straight.losses  # same losses, bit for bit
    client.fetch(BucketUrl.parse(resumed.checkpoints[-1]) / "pretrained_model", tmp_path / "resumed")
    a = ACTPolicy.from_pretrained(tmp_path / "ckpt" / "pretrained_model").state_dict()
    b = ACTPolicy.from_pretrained(tmp_path / "resumed").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_last_checkpoint_carries_its_onnx_export_which_publish_signs_as_it_is(bucket_server, tmp_path):
    from robotloop.deploy.keys import generate_keypair, load_private_key
    from robotloop.deploy.onnx_runner import ONNX_FILES
    from robotloop.deploy.publish import publish
    from robotloop.storage import Entry
    from robotloop.train.checkpoint import read_lineage

    client, url, _ = _dataset(bucket_server, tmp_path, "onnx")
    out = BucketUrl.parse("hf://buckets/lab/train/models/onnx")
    report = _run(client, url, out, steps=4, onnx="auto")  # checkpoints at steps 3 and 4 (the last)
    assert report.onnx is not None and report.onnx["files"] == list(ONNX_FILES), report.onnx
    assert report.onnx["max_abs_diff"] <= 1e-4 and report.onnx["seconds"] > 0

    def names(step: int) -> set[str]:
        model = out / "checkpoints" / f"{step:06d}" / "pretrained_model"
        return {e.url.path.rsplit("/", 1)[-1] for e in client.ls(model, recursive=True) if isinstance(e, Entry)}

    # Only the last checkpoint: an export per checkpoint would stall training that long each time.
    assert set(ONNX_FILES) <= names(4) and not set(ONNX_FILES) & names(3)
    assert read_lineage(client, out / "checkpoints" / "000004")["onnx"] == report.onnx

    generate_keypair(tmp_path / "keys" / "deploy.key")
    key = load_private_key(tmp_path / "keys" / "deploy.key")
    released = publish(client, str(out), "trained", key)
    assert released.onnx is not None and released.onnx.reused and released.onnx.bytes_new == 0, released.onnx
    assert released.manifest.checkpoint.endswith("checkpoints/000004")
    assert set(ONNX_FILES) <= {f.path for f in released.manifest.files}
    # With the int8 graph: its convolutions are calibrated on frames of the dataset the lineage names.
    int8 = publish(client, str(out), "trained-int8", key, int8=True).onnx
    assert int8 is not None and int8.int8_calibration_frames == 50 and int8.int8_max_abs_diff is not None, int8
    # This tiny policy (4 steps of training) loses too much with its convolutions in int8 (0.11 on the 10 held-out
    # frames, over 0.05): they stay fp32, and the report says why.
    assert int8.int8_convolutions.startswith("fp32 (in int8, calibrated, its actions were"), int8

    # A run stopped early (the training service's cancel) checkpoints at once, without the export: its checkpoint
    # must land before the cancel's grace runs out.
    stopped = BucketUrl.parse("hf://buckets/lab/train/models/onnx-stopped")
    report = _run(client, url, stopped, steps=4, onnx="auto", should_stop=lambda: True)
    assert report.steps == 1 and report.onnx is None
    model = stopped / "checkpoints" / "000001" / "pretrained_model"
    assert not {e.url.path.rsplit("/", 1)[-1] for e in client.ls(model, recursive=True)} & set(ONNX_FILES)


def test_resuming_with_another_model_says_which_options_differ(bucket_server, tmp_path):
    client, url, _ = _dataset(bucket_server, tmp_path, "resume-other")
    out = BucketUrl.parse("hf://buckets/lab/train/models/resume-other")
    _run(client, url, out, steps=3)
    settings = TrainSettings(steps=6, batch_size=4, checkpoint_every=3, seed=7, resume=True, deterministic=True)
    bigger = ACTSettings(**{**TINY, "dim_model": 64})
    with pytest.raises(ValueError, match=r"another model: dim_model 32 \(asked: 64\)"):  # not a state_dict dump
        train(client, [url], out, settings, bigger, DataSettings(decode_workers=1))


def test_an_episode_committed_mid_run_is_trained_on(bucket_server, tmp_path):
    client, url, recorder = _dataset(bucket_server, tmp_path, "live", episodes=1)
    committed = threading.Event()

    reports = []

    def on_progress(p):
        reports.append(p)
        if p.step == 2 and not committed.is_set():
            recorder.commit(synthetic_episode(1, frames=16))  # what the live loop does while training runs
            committed.set()

    settings = TrainSettings(steps=40, batch_size=4, log_every=1, checkpoint_every=40, seed=1, onnx="off")
    data = DataSettings(decode_workers=1, refresh_every_s=0.2)
    report = train(
        client,
        [url],
        BucketUrl.parse("hf://buckets/lab/train/models/live"),
        settings,
        ACTSettings(**TINY),
        data,
        on_progress,
    )
    client.fetch(BucketUrl.parse(report.checkpoints[-1]) / "lineage.json", tmp_path / "lineage.json")
    lineage = json.loads((tmp_path / "lineage.json").read_text())
    assert [e["episode_index"] for e in lineage["episodes"]] == [0, 1]
    last = reports[-1]  # cumulative times: the data path's host time, and (on CPU) no GPU sampling time
    assert 0 <= last.data_gpu_s <= last.data_wait_s <= last.elapsed_s
    assert [r.elapsed_s for r in reports] == sorted(r.elapsed_s for r in reports)


def test_two_nodes_under_torchrun_share_the_episodes_and_one_checkpoint(bucket_server, tmp_path):
    """Data parallel across two nodes of one process each (c10d rendezvous, gloo on CPU): what `torchrun --nnodes N`
    does on a cluster, and the same code as one host's `--nproc-per-node N` (each node's only rank has LOCAL_RANK 0:
    the global rank, not the local one, picks the checkpoint writer and the episodes' share)."""
    import os
    import subprocess
    import sys

    from .conftest import free_port

    client, url, _ = _dataset(bucket_server, tmp_path, "ddp", episodes=3)
    out = BucketUrl.parse("hf://buckets/lab/train/models/ddp")
    env = {
        **os.environ,
        "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint,
        "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN,
        "OMP_NUM_THREADS": "1",
    }
    rendezvous = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "ddp"]
    rendezvous += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    train = ["-m", "robotloop.cli", "train", "--dataset", str(url), "--output", str(out), "--steps", "4"]
    train += ["--batch-size", "2", "--log-every", "2", "--checkpoint-every", "4", "--tiny", "--decode-workers", "1"]
    train += ["--device", "cpu"]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *rendezvous, *train],
            env={**env, "XDG_CACHE_HOME": str(tmp_path / f"node{i}")},  # each node its own caches and staging
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    said = [node.communicate(timeout=400)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(s[-3000:] for s in said)
    assert "".join(said).count("randomly initialised") == 2  # once per rank: said once, not twice
    # Each rank logs the global batch's loss (the mean over the ranks), not its own half's: the same lines.
    logged = [re.findall(r"step (\d+)/4 +loss ([\d.]+)", text) for text in said]
    assert len(logged[0]) == 2 and logged[0] == logged[1], logged
    client.fetch(out / "checkpoints" / "000004", tmp_path / "ckpt")
    # Rank 0 exported the last checkpoint to ONNX (on the CPU) while rank 1 waited for its pointer.
    assert (tmp_path / "ckpt" / "pretrained_model" / "policy.onnx.json").is_file()
    state = tmp_path / "ckpt" / "training_state"
    assert {p.name for p in state.glob("sampler_state_rank*.json")} == {
        "sampler_state_rank0.json",
        "sampler_state_rank1.json",
    }
    ranks = [json.loads((state / f"sampler_state_rank{r}.json").read_text())["known"] for r in (0, 1)]
    assert sorted(k[1] for k in ranks[0]) == [0, 2] and sorted(k[1] for k in ranks[1]) == [1]  # disjoint shares
    lineage = json.loads((tmp_path / "ckpt" / "lineage.json").read_text())
    assert lineage["world_size"] == 2 and [e["episode_index"] for e in lineage["episodes"]] == [0, 1, 2]
    assert json.loads(client.read_range(out / "checkpoints" / "last.json", 0, 1000))["step"] == 4
    ACTPolicy.from_pretrained(tmp_path / "ckpt" / "pretrained_model")


def test_channels_last_optimizer_state_checkpoints_and_keeps_its_layout(bucket_server, tmp_path):
    """Adam's moments of a channels_last convolution are strided like its weight: saved contiguous (safetensors
    refuses strided tensors), loaded back in the weight's layout (fused AdamW steps them together)."""
    from robotloop.train.checkpoint import load_checkpoint, save_checkpoint
    from robotloop.train.policy import build_policy

    from .test_train_policy import FEATURES, _batch, _settings, _stats

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    out = BucketUrl.parse("hf://buckets/lab/train/models/channels-last")
    client.create_bucket(out)
    make = lambda: build_policy(FEATURES, _stats(), _settings(channels_last=True))  # noqa: E731
    torch.manual_seed(0)
    trained = make()
    trained.train_step(_batch())
    save_checkpoint(client, out, 1, trained, trained.optimizer(), {}, {"step": 1}, [(0, 1.0)])
    fresh = make()
    _, losses = load_checkpoint(client, out, 1, fresh, fresh.optimizer())
    assert losses == [(0, 1.0)]  # the loss history comes back with the checkpoint
    conv = fresh.policy.model.backbone.conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    want = trained.optimizer().state[trained.policy.model.backbone.conv1.weight]["exp_avg"]
    got = fresh.optimizer().state[conv]["exp_avg"]
    assert got.stride() == conv.stride() and torch.equal(got, want)


def test_optimizer_state_leaves_the_kernel_choice_to_the_loader(bucket_server, tmp_path):
    """lerobot-train's AdamW has `fused: None`, and lerobot's loader wants the saved param groups' values of the
    same types: a CUDA run's `fused: True` is not saved (lerobot's own optimizer loads the state), and a run that
    loads it keeps its own kernel."""
    from lerobot.optim.optimizers import AdamWConfig, load_optimizer_state

    from robotloop.train.checkpoint import load_checkpoint, save_checkpoint
    from robotloop.train.policy import build_policy

    from .test_train_policy import FEATURES, _batch, _settings, _stats

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    out = BucketUrl.parse("hf://buckets/lab/train/models/fused")
    client.create_bucket(out)
    make = lambda: build_policy(FEATURES, _stats(), _settings())  # noqa: E731
    trained = make()
    trained.train_step(_batch())
    for group in trained.optimizer().param_groups:
        group["fused"] = True  # what the optimizer holds on CUDA
    save_checkpoint(client, out, 1, trained, trained.optimizer(), {}, {"step": 1}, [(0, 1.0)])
    client.fetch(out / "checkpoints" / "000001" / "training_state", tmp_path / "state")
    groups = json.loads((tmp_path / "state" / "optimizer_param_groups.json").read_text())
    assert [g["fused"] for g in groups] == [None] * len(groups)
    theirs = AdamWConfig(lr=1e-5, weight_decay=1e-4).build(make().policy.get_optim_params())  # lerobot-train's
    load_optimizer_state(theirs, tmp_path / "state")
    fresh = make()
    for group in fresh.optimizer().param_groups:
        group["fused"] = True
    load_checkpoint(client, out, 1, fresh, fresh.optimizer())
    assert [g["fused"] for g in fresh.optimizer().param_groups] == [True] * len(groups)
    want = trained.optimizer().state[trained.policy.model.backbone.conv1.weight]["exp_avg"]
    assert torch.equal(fresh.optimizer().state[fresh.policy.model.backbone.conv1.weight]["exp_avg"], want)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--device", "gpu"], "not a device; use auto, cpu, cuda or cuda:N"),
        (["--device", "cuda:99"], "device 'cuda:99'"),
        (["--progress-file", "/nonexistent/p.jsonl"], "/nonexistent: no such folder"),
        (["--backbone-weights", "/nonexistent.pt"], "does not exist"),
        (["--policy.chunk_size", "0"], "--chunk-size"),
        (["--policy.image_size", "4x4"], "at least 8x8"),
        (["--chunk-size", "5", "--n-action-steps", "6"], "n_action_steps"),
    ],
)
def test_bad_train_options_are_refused_before_any_data_streams(option, message):
    from typer.testing import CliRunner

    from robotloop.cli import app

    args = ["train", "--dataset", "hf://buckets/lab/none/datasets/x", "--output", "hf://buckets/lab/none/models/r"]
    result = CliRunner().invoke(app, [*args, *option], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_lerobot_policy_spellings_reach_the_saved_config(bucket_server, tmp_path):
    """`--policy.chunk_size=5` as a LeRobot user writes it (and our `--dim-model`) lands in the checkpoint's
    config.json, which lerobot reads."""
    from typer.testing import CliRunner

    from robotloop.cli import app

    client, url, _ = _dataset(bucket_server, tmp_path, "spellings")
    out = "hf://buckets/lab/train/models/spellings"
    args = ["--endpoint", bucket_server.endpoint, "--token", WRITE_TOKEN, "train", "--dataset", str(url)]
    args += ["--output", out, "--steps", "2", "--batch-size", "2", "--tiny", "--device", "cpu", "--decode-workers"]
    args += ["1", "--policy.chunk_size=5", "--dim-model", "32", "--policy.optimizer_lr=3e-4", "--onnx", "off"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    client.fetch(BucketUrl.parse(f"{out}/checkpoints/000002/pretrained_model/config.json"), tmp_path / "cfg.json")
    config = json.loads((tmp_path / "cfg.json").read_text())
    assert (config["chunk_size"], config["n_action_steps"], config["dim_model"]) == (5, 5, 32)
    assert config["optimizer_lr"] == 3e-4


def test_collecting_garbage_by_hand_trains_the_same_and_gives_automatic_collection_back(bucket_server, tmp_path):
    import gc

    from robotloop.train.policy import TrainablePolicy

    def policies_alive() -> int:
        gc.collect()
        return sum(issubclass(type(o), TrainablePolicy) for o in gc.get_objects())  # type(): no proxy's __getattr__

    client, url, _ = _dataset(bucket_server, tmp_path, "gc")
    before = policies_alive()
    reports = []
    for gc_every in (None, 2):
        out = BucketUrl.parse(f"hf://buckets/lab/train/models/gc-{gc_every}")
        settings = TrainSettings(
            steps=4, batch_size=4, checkpoint_every=4, seed=7, deterministic=True, gc_every=gc_every, onnx="off"
        )
        reports.append(train(client, [url], out, settings, ACTSettings(**TINY), DataSettings(decode_workers=1)))
        assert gc.isenabled()  # as it was before the run
        # Nothing of a finished run is left referenced, so release_cuda_memory can hand its GPU memory back.
        assert policies_alive() == before
    assert reports[0].losses == reports[1].losses  # the collector's schedule changes no number
