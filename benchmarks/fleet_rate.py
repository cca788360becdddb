"""A robot's control rate with fleet recording on against off (issue 29: within 5%), side by side in turns.

Everything real, on localhost: the embedded bucket server (a temporary root), the deploy service, one signed release
of a freshly built ACT (random weights: only timing matters), and sim robots (ALOHA TransferCube at 50 Hz) that run
it. Each turn starts a robot with recording `off` or `all` (every episode streamed into a fleet dataset and
committed), waits for its first action (and, recording, for its writer process to be ready: its start, a few CPU
seconds once per robot, is reported apart as `writer_start`), then counts its actions for `--seconds`: the steady
state of a robot that runs for hours. The modes take turns, so drift is shared. Printed and written: per mode, the
median control rate over turns, the longest gap between two actions, and the episodes recorded.

    MUJOCO_GL=egl .venv/bin/python benchmarks/fleet_rate.py --tiny --image-size 48x64 --turns 5 --seconds 30
    MUJOCO_GL=egl python3 benchmarks/fleet_rate.py --image-size 120x160 --device cuda   # the h200 preset's policy
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from robotloop.capture.recorder import DatasetSpec
from robotloop.config import RobotSettings
from robotloop.deploy.client import DeployClient
from robotloop.deploy.envs import SimControlEnv
from robotloop.deploy.fetch import XetFetcher
from robotloop.deploy.keys import generate_keypair, load_private_key, load_public_keys, public_path
from robotloop.deploy.local import start_local_deploy_service
from robotloop.deploy.publish import publish
from robotloop.deploy.runtime import RobotRuntime
from robotloop.deploy.store import ReleaseStore
from robotloop.fleet import FleetRecorder, RecordChoice
from robotloop.loop.pipeline import H200_RECIPE, TINY_ACT
from robotloop.output import log_to_console, quiet_encoders
from robotloop.sim.constants import START_ARM_POSE, parse_image_size
from robotloop.sim.env import joint_state
from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server
from robotloop.train.policy import ACTSettings, build_policy

OPS = "bench-ops"
RUN = "hf://buckets/bench/fleet/models/act"


def release(
    work: Path, bucket: BucketClient, ops: DeployClient, size, tiny: bool, device: str, channel: str = "bench"
) -> None:
    """One signed release on `channel`: the h200 recipe's acting (temporal ensembling: a model pass per step)."""
    torch.manual_seed(0)
    start = joint_state(START_ARM_POSE).astype(np.float32)
    vec = {"mean": start, "std": np.full(14, 0.05, np.float32), "min": start - 1, "max": start + 1}
    recipe = {k: H200_RECIPE[k] for k in ("n_action_steps", "temporal_ensemble_coeff")}
    settings = ACTSettings(**{**(TINY_ACT if tiny else {}), **recipe, "image_size": size})
    policy = build_policy(DatasetSpec.aloha(size).features(), {"observation.state": vec, "action": vec}, settings)
    url = BucketUrl.parse(f"{RUN}/checkpoints/000001")
    bucket.upload(policy.save_pretrained(work / "ckpt"), url / "pretrained_model")
    generate_keypair(work / "deploy.key")
    publish(bucket, str(url), "bench-v1", load_private_key(work / "deploy.key"), ops, channel)


def turn(work: Path, bucket, ops, mode: str, k: int, size, seconds: float, device: str, episode_steps: int) -> dict:
    robot_id = f"{mode}-{k}"
    token = ops.register_robot(robot_id, channel="bench")
    recording, writer_start = None, {}
    if mode != "off":  # "all", or "all-b1": ticks put one at a time (FleetRecorder's frame_batch)
        url = BucketUrl.parse(f"hf://buckets/bench/fleet/datasets/{robot_id}")
        started = time.monotonic()
        choice, _, batch = mode.partition("-b")
        batching = {"frame_batch": int(batch)} if batch else {}
        recording = FleetRecorder(bucket, url, RecordChoice(choice), vcodec="h264", **batching)
    made: list[RobotRuntime] = []

    def control() -> None:  # MuJoCo's EGL context belongs to this thread
        env = SimControlEnv("transfer_cube", size, episode_steps=episode_steps)
        made.append(
            RobotRuntime(
                env,
                DeployClient(ops.url, token),
                ReleaseStore(work / f"store-{robot_id}"),
                load_public_keys([public_path(work / "deploy.key")]),
                RobotSettings(robot_id=robot_id, device=device, poll_wait_s=5),
                lambda b: XetFetcher(bucket.endpoint, bucket.token, b),
                recording=recording,
            )
        )
        made[0].run()
        env.close()

    thread = threading.Thread(target=control, daemon=True)
    thread.start()
    while not made or made[0].stats.steps == 0:
        time.sleep(0.01)
    robot = made[0]
    if recording is not None:  # the steady state: the writer's start (its imports, once per robot) is not in it
        assert recording.wait_ready(120), "the fleet writer did not start"
        writer_start = {"s": round(time.monotonic() - started, 2), "cpu_s": round(cpu_seconds()["writer"], 2)}
    cpu0 = cpu_seconds()
    steps0, t0, gap0 = robot.stats.steps, time.monotonic(), robot.stats.max_gap_s
    time.sleep(seconds)
    hz = (robot.stats.steps - steps0) / (time.monotonic() - t0)
    cpu1 = cpu_seconds()
    robot.stop()
    thread.join(30)
    if recording is not None:
        recording.close()
    row = {
        "mode": mode,
        "turn": k,
        "control_hz": round(hz, 2),
        "max_gap_ms": round(1000 * max(robot.stats.max_gap_s, gap0), 1),
        "episodes": len(robot.stats.episodes),
        "recorded": recording.stats.recorded if recording else 0,
        "dropped": recording.stats.dropped if recording else 0,
        "writer_start": writer_start,  # seconds from the recorder's creation to its writer ready, and its CPU seconds
        # CPU seconds per second of the window, by process: what recording's work takes from the robot's cores.
        "cpu_per_s": {k: round((cpu1.get(k, 0.0) - cpu0.get(k, 0.0)) / seconds, 3) for k in cpu1},
    }
    print(row, flush=True)
    return row


def cpu_seconds() -> dict[str, float]:
    """CPU time (user + system) so far of the robot's process and of each kind of process it started: its fleet
    writer, the bucket server, the deploy service (on a real robot the last two run elsewhere)."""
    import psutil

    me = psutil.Process()
    used = {"robot": sum(me.cpu_times()[:2])}
    for child in me.children(recursive=True):
        try:
            line = " ".join(child.cmdline())
            kind = "bucket_server" if "services.bucket" in line else "deploy" if "services.deploy" in line else "writer"
            used[kind] = used.get(kind, 0.0) + sum(child.cpu_times()[:2])
        except psutil.Error:  # gone meanwhile
            continue
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", default="48x64")
    parser.add_argument("--tiny", action="store_true", help="the tiny ACT (CPU); default: lerobot's default size")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--episode-steps",
        type=int,
        default=400,
        help="the task's episode, a robot's default (100: four times the commits, a harder case)",
    )
    parser.add_argument(
        "--modes",
        default="off,all",
        help="taking turns; all-bN: recording with N ticks a put (the recorder's default 10)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    modes = args.modes.split(",")
    if modes[0] != "off" or len(modes) < 2:
        parser.error("--modes: off first, then at least one recording mode")
    quiet_encoders()
    log_to_console()
    size = parse_image_size(args.image_size)
    work = Path(tempfile.mkdtemp(prefix="fleet-rate-"))
    root = work / "buckets"
    server = ensure_embedded_server(root)
    endpoint, token = server.endpoint, server.token
    service = start_local_deploy_service(work / "deploy", OPS)
    try:
        bucket, ops = BucketClient(endpoint, token), DeployClient(service.url, OPS)
        bucket.create_bucket(BucketUrl.parse(RUN))
        release(work, bucket, ops, size, args.tiny, args.device)
        rows = [
            turn(work, bucket, ops, mode, k, size, args.seconds, args.device, args.episode_steps)
            for k in range(args.turns)
            for mode in modes
        ]
    finally:
        service.stop()
        stop_embedded_server(root, force=True)
        shutil.rmtree(work, ignore_errors=True)  # about 1 GB a run: buckets, releases and the robots' caches
    summary = {}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {
            "median_control_hz": statistics.median(r["control_hz"] for r in mine),
            "max_gap_ms": max(r["max_gap_ms"] for r in mine),
            "recorded": sum(r["recorded"] for r in mine),
            "dropped": sum(r["dropped"] for r in mine),
            "median_cpu_per_s": {
                k: statistics.median(r["cpu_per_s"].get(k, 0.0) for r in mine) for k in mine[0]["cpu_per_s"]
            },
        }
    ratios = {m: summary[m]["median_control_hz"] / summary["off"]["median_control_hz"] for m in modes if m != "off"}
    ratio = ratios[modes[1]]
    print(f"recording on / off: {ratios} of the control rate; {json.dumps(summary)}")
    write_out(args, rows=rows, summary=summary, ratio=ratio, ratios=ratios)


def write_out(args: argparse.Namespace, **figures) -> None:
    """The run's arguments and `figures` as JSON to `--out`, when given."""
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, **figures}, indent=1))


if __name__ == "__main__":
    main()
