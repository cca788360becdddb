"""Deploy figures for BENCHMARKS.md: bytes a robot pulls per update, publish-to-running time, swap gap.

Run:  MUJOCO_GL=egl .venv/bin/python benchmarks/deploy.py [--image-size 96x128] [--out deploy.json]
          [--onnx-at checkpoint|publish] [--latency-only]

Everything is real and on localhost: a robotloop bucket server (embedded launcher, temporary root), the deploy
service (`python -m services.deploy`), hf_xet transfers, MuJoCo's TransferCube and the default 51.6M-parameter
ACT (lerobot 0.6.1 defaults; random weights: only bytes and timing matter here, not task success).

1. Bytes per update. v1 = the ACT as built. "fine-tune" = every non-backbone float tensor nudged (what a fine-tune
   with a frozen ResNet backbone changes); "retrain" = every float tensor nudged. Each is published after v1 and
   pulled into a robot store that holds v1. "Served" is the bucket server's own count of bytes it sent
   (GET /api/robotloop/stats), so the figure does not trust the client. Target: served <= 1.1 x changed + 1 MB.
   Each release holds the policy's ONNX export too (`publish`'s default), its weights as external data.
   `--onnx-at checkpoint` (the default): each checkpoint carries its ONNX export as the trainer leaves it
   (`export_onnx_beside`, made before the clock starts: training's time), which publish checks and reuses;
   `--onnx-at publish`: checkpoints without one, so publish exports (what every publish did before).
2. Publish to running. A robot runtime (ALOHA TransferCube at 50 Hz, its own thread) follows a channel. The clock
   starts when `publish` is called (it downloads the checkpoint, hashes it, signs and stores the manifest and
   registers the release) and stops when the control loop runs its first action of the new release.
   Target: under 10 s. Also: the control loop's gap at the swap (last action of the old release to the first of
   the new), its longest gap over the whole run, and its mean rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import torch

from robotloop.capture.recorder import DatasetSpec
from robotloop.config import RobotSettings
from robotloop.deploy.client import DeployClient
from robotloop.deploy.envs import SimControlEnv
from robotloop.deploy.fetch import XetFetcher
from robotloop.deploy.keys import (
    generate_keypair,
    load_private_key,
    load_public_keys,
    public_path,
)
from robotloop.deploy.local import start_local_deploy_service
from robotloop.deploy.onnx_runner import ONNX_FILES
from robotloop.deploy.publish import publish
from robotloop.deploy.runtime import RobotRuntime
from robotloop.deploy.store import ReleaseStore
from robotloop.sim.constants import START_ARM_POSE
from robotloop.sim.env import joint_state
from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server
from robotloop.train.checkpoint import export_onnx_beside
from robotloop.train.policy import ACTSettings, build_policy

MB = 1_000_000
OPS = "bench-ops"
RUN = "hf://buckets/bench/deploy/models/act"


def save_variants(work: Path, image_size: tuple[int, int], onnx_at: str = "checkpoint") -> dict[str, Path]:
    """v1, fine-tune (non-backbone nudged) and retrain (all nudged) of the default ACT, saved with save_pretrained;
    with `onnx_at` "checkpoint", each with its ONNX export beside it, as the trainer leaves its last checkpoint."""
    torch.manual_seed(0)
    start = joint_state(START_ARM_POSE).astype(np.float32)
    vec = {"mean": start, "std": np.full(14, 0.05, np.float32), "min": start - 1, "max": start + 1}
    policy = build_policy(
        DatasetSpec.aloha(image_size).features(), {"observation.state": vec, "action": vec}, ACTSettings()
    )
    print(f"ACT: {sum(p.numel() for p in policy.policy.parameters()) / 1e6:.1f}M parameters")
    original = {k: v.clone() for k, v in policy.policy.state_dict().items()}
    out = {"v1": policy.save_pretrained(work / "v1")}
    for name, frozen in (("finetune", "model.backbone."), ("retrain", None)):
        with torch.no_grad():
            for key, tensor in policy.policy.state_dict().items():
                if tensor.is_floating_point() and not (frozen and key.startswith(frozen)):
                    tensor.copy_(original[key] + 1e-3 * torch.randn_like(tensor))
        out[name] = policy.save_pretrained(work / name)
    if onnx_at == "checkpoint":
        for name, path in out.items():
            made = export_onnx_beside(path)
            print(f"{name}: exported beside the checkpoint in {made['seconds']:.1f} s (training's time, not timed)")
    return out


def start_deploy_service(work: Path) -> tuple[subprocess.Popen, str]:
    service = start_local_deploy_service(work, OPS)
    return service.proc, service.url


class Bench:
    def __init__(self, work: Path, endpoint: str, token: str, deploy_url: str) -> None:
        self.work, self.bucket, self.deploy_url = work, BucketClient(endpoint, token), deploy_url
        self.ops = DeployClient(deploy_url, OPS)
        generate_keypair(work / "deploy.key")
        self.signer, self.trusted = (
            load_private_key(work / "deploy.key"),
            load_public_keys([public_path(work / "deploy.key")]),
        )
        self.steps = 0

    def served(self) -> int:
        r = httpx.get(
            f"{self.bucket.endpoint}/api/robotloop/stats", headers={"authorization": f"Bearer {self.bucket.token}"}
        )
        return r.json()["bytes_served"]

    def upload(self, ckpt: Path) -> str:
        self.steps += 1
        url = BucketUrl.parse(f"{RUN}/checkpoints/{self.steps:06d}")
        self.bucket.upload(ckpt, url / "pretrained_model")
        return str(url)

    def release(self, ckpt: Path, name: str, channel: str | None = None):
        return publish(self.bucket, self.upload(ckpt), name, self.signer, self.ops, channel)

    def fetcher(self, bucket: str) -> XetFetcher:
        return XetFetcher(self.bucket.endpoint, self.bucket.token, bucket)


@contextmanager
def running_bench(work: Path) -> Iterator[Bench]:
    """The embedded bucket server and the deploy service, their files under `work`, and the bench's bucket in them;
    both stopped after."""
    server = ensure_embedded_server(work / "buckets")
    proc, deploy_url = start_deploy_service(work)
    try:
        bench = Bench(work, server.endpoint, server.token, deploy_url)
        bench.bucket.create_bucket(BucketUrl.parse(RUN))
        yield bench
    finally:
        proc.terminate()
        stop_embedded_server(work / "buckets")


def bytes_per_update(bench: Bench, ckpts: dict[str, Path]) -> list[dict]:
    v1 = bench.release(ckpts["v1"], "bytes-v1")
    rows = []
    for case in ("finetune", "retrain"):
        new = bench.release(ckpts[case], f"bytes-{case}")
        store = ReleaseStore(Path(tempfile.mkdtemp(dir=bench.work)))
        store.pull(v1, bench.trusted, bench.fetcher(v1.manifest.bucket))
        old = {s.sha256 for f in v1.manifest.files for s in f.segments}
        # Each changed tensor once: the ONNX weights file holds the safetensors' tensors again, byte for byte.
        changed = sum(
            {s.sha256: s.length for f in new.manifest.files for s in f.segments if s.sha256 not in old}.values()
        )
        before = bench.served()
        report = store.pull(new, bench.trusted, bench.fetcher(new.manifest.bucket))
        served = bench.served() - before
        rows.append(
            {
                "case": case,
                "release_mb": new.manifest.total_bytes / MB,
                # The release's ONNX export (graph + external weights + meta): its weights are the safetensors'
                # tensors again, byte for byte, so the store finds them in the file it pulls beside it.
                "onnx_mb": sum(f.size for f in new.manifest.files if Path(f.path).name in ONNX_FILES) / MB,
                "changed_mb": changed / MB,
                "fetched_mb": report.bytes_fetched / MB,
                "served_mb": served / MB,
                "target_mb": (1.1 * changed + MB) / MB,
                "pull_s": round(report.seconds, 2),
            }
        )
        print(rows[-1])
    return rows


def publish_to_running(bench: Bench, ckpts: dict[str, Path], image_size: tuple[int, int]) -> dict:
    token = bench.ops.register_robot("bench-robot", channel="bench")
    made: list[RobotRuntime] = []

    def control() -> None:  # MuJoCo's EGL context belongs to this thread
        env = SimControlEnv("transfer_cube", image_size, episode_steps=400)
        made.append(
            RobotRuntime(
                env,
                DeployClient(bench.deploy_url, token),
                ReleaseStore(bench.work / "robot"),
                bench.trusted,
                RobotSettings(robot_id="bench-robot", poll_wait_s=30),
                bench.fetcher,
            )
        )
        made[0].run()
        env.close()

    threading.Thread(target=control, daemon=True).start()
    while not made:
        time.sleep(0.05)
    robot = made[0]
    out = {}
    for name, ckpt in (("run-v1", ckpts["v1"]), ("run-finetune", ckpts["finetune"]), ("run-retrain", ckpts["retrain"])):
        url = bench.upload(ckpt)  # the checkpoint is in the bucket, as the trainer leaves it
        t0 = time.monotonic()
        released = publish(bench.bucket, url, name, bench.signer, bench.ops, "bench")
        published = time.monotonic() - t0
        while robot.running != name:
            time.sleep(0.01)
        running = time.monotonic() - t0
        swap = robot.stats.swaps[-1]
        while swap["gap_s"] is None and swap["mid_episode"]:
            time.sleep(0.01)
        pull = robot.stats.pulls[-1]
        ready = robot.stats.ready_at[name] - t0  # pulled, verified, loaded and warmed up
        out[name] = {
            "publish_s": round(published, 2),
            "publish_to_ready_s": round(ready, 2),
            "publish_to_running_s": round(running, 2),
            "pull_s": round(pull.seconds, 2),
            "fetched_mb": pull.bytes_fetched / MB,
            "swap_gap_ms": None if swap["gap_s"] is None else round(1000 * swap["gap_s"], 1),
            # The ONNX step of publish: the checkpoint's export checked and reused, or an export made there.
            "onnx_reused": released.onnx.reused if released.onnx else None,
            "onnx_s": round(released.onnx.seconds, 2) if released.onnx else None,
        }
        print(name, out[name])
        time.sleep(3)  # let the loop run on the new release before the next one
    steps0, t0 = robot.stats.steps, time.monotonic()
    time.sleep(5)
    out["control_hz"] = round((robot.stats.steps - steps0) / (time.monotonic() - t0), 1)
    out["max_gap_ms_whole_run"] = round(1000 * robot.stats.max_gap_s, 1)
    robot.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", default="96x128")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--onnx-at",
        choices=("checkpoint", "publish"),
        default="checkpoint",
        help="Where the ONNX export is made: beside the checkpoint, as training does (publish reuses it), or at "
        "publish (checkpoints without one).",
    )
    parser.add_argument("--latency-only", action="store_true", help="Publish to running only, not bytes per update.")
    args = parser.parse_args()
    image_size = tuple(int(v) for v in args.image_size.split("x"))
    with tempfile.TemporaryDirectory() as tmp, running_bench(Path(tmp)) as bench:
        ckpts = save_variants(bench.work / "ckpt", image_size, args.onnx_at)
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.node()} {os.cpu_count()} cores",
            "onnx_at": args.onnx_at,
            "load_before": os.getloadavg()[0],
            "bytes": None if args.latency_only else bytes_per_update(bench, ckpts),
            "latency": publish_to_running(bench, ckpts, image_size),
        }
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
