"""Evaluation and recording throughput, process pool against Ray actors, over a range of worker counts.

Run (16-core GPU machine, issue 31's target: Ray at 15 workers within 10% of the pool; benchmarks/h200_cluster.sh):
        .venv/bin/python benchmarks/ray_throughput.py --workers 1 2 4 8 15 --episodes-per-worker 2 --device cuda \\
        --size full --image-size 120x160 (the h200 preset's TransferCube camera and AV1 codec)
Smoke (CPU): .venv/bin/python benchmarks/ray_throughput.py --workers 1 2 --episodes 2 --max-steps 20 \\
        --image-size 48x64 --size tiny --codec h264

Per worker count and backend, one JSON line: episodes/min of `evaluate` (a random-weight ACT, `--episodes`
episodes; the pool runs them in lockstep with one batched forward in the driver, Ray in waves of
ceil(episodes / workers) on actors with a policy each) and of `record_sim` (`--episodes` scripted demos into a fresh
embedded bucket server). Worker start-up is inside the time for both, as a command pays it. Ray runs on a cluster of
this machine started once (`--ray local`) or the one at `--ray ADDRESS`, kept across the runs. `--commits` adds
each recording's commits (when, and their upload's seconds): where recording's time goes on each backend.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

from robotloop.capture import DatasetRecorder, DatasetSpec
from robotloop.capture.sim_record import record_sim
from robotloop.cluster import ray_session
from robotloop.deploy.evaluate import evaluate
from robotloop.deploy.runner import make_tiny_checkpoint
from robotloop.sim.env import parse_image_size
from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server
from robotloop.train.policy import ACTSettings


def episodes_for(args: argparse.Namespace, workers: int) -> int:
    return args.episodes_per_worker * workers if args.episodes_per_worker else args.episodes


def eval_rate(policy: Path, args: argparse.Namespace, workers: int, ray: str | None) -> float:
    episodes = episodes_for(args, workers)
    batch = math.ceil(episodes / workers) if ray else None
    start = time.perf_counter()
    report = evaluate(
        policy, args.task, episodes, workers, max_steps=args.max_steps, device=args.device, batch=batch, ray=ray
    )
    return 60 * len(report.episodes) / (time.perf_counter() - start)


def record_rate(
    args: argparse.Namespace, size: tuple[int, int], workers: int, ray: str | None
) -> tuple[float, list[tuple[float, int, float, float]]]:
    """Episodes per minute, and each commit as (seconds since the start, seed, encode_s, upload_s)."""
    commits: list[tuple[float, int, float, float]] = []

    def on_event(kind: str, seed: int, report) -> None:
        if report is not None:
            at = round(time.perf_counter() - start, 1)
            commits.append((at, seed, round(report.encode_s, 2), round(report.upload_s, 2)))

    with tempfile.TemporaryDirectory() as tmp:
        server = ensure_embedded_server(Path(tmp) / "server")
        try:
            client = BucketClient(server.endpoint, server.token)
            url = BucketUrl.parse(f"hf://buckets/bench/ray/datasets/w{workers}-{'ray' if ray else 'pool'}")
            recorder = DatasetRecorder(client, url, DatasetSpec.aloha(size, args.codec), staging=Path(tmp) / "stage")
            start = time.perf_counter()  # read by on_event
            report = record_sim(
                recorder,
                args.task,
                episodes_for(args, workers),
                workers,
                size,
                args.max_steps,
                keep_failed=True,
                on_event=on_event,
                ray=ray,
            )
        finally:
            stop_embedded_server(Path(tmp) / "server")
    return report.episodes_per_minute, commits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="transfer_cube")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 12, 15])
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument(
        "--episodes-per-worker",
        type=int,
        default=None,
        help="episodes = this x workers, instead of --episodes (each count's run then lasts about the same)",
    )
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--image-size", default="480x640")
    ap.add_argument("--codec", default="libsvtav1")
    ap.add_argument("--size", choices=("full", "tiny"), default="full", help="the ACT evaluated")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ray", default="local", help="auto, local or a cluster ADDRESS")
    ap.add_argument("--skip", choices=("eval", "record"), nargs="*", default=[])
    ap.add_argument("--commits", action="store_true", help="each row lists its recording's commits, as timed")
    args = ap.parse_args()
    size = parse_image_size(args.image_size)
    with tempfile.TemporaryDirectory() as tmp, ray_session(args.ray):  # one cluster connection for every Ray run
        settings = ACTSettings() if args.size == "full" else None
        policy = make_tiny_checkpoint(Path(tmp) / "pretrained_model", size, settings=settings)
        for workers in args.workers:
            for backend in ("pool", "ray"):
                ray = args.ray if backend == "ray" else None
                row = {"workers": workers, "backend": backend}
                if "eval" not in args.skip:
                    row["eval_episodes_per_min"] = round(eval_rate(policy, args, workers, ray), 2)
                if "record" not in args.skip:
                    rate, commits = record_rate(args, size, workers, ray)
                    row["record_episodes_per_min"] = round(rate, 2)
                    if args.commits:  # (seconds since the start, seed, encode_s, upload_s)
                        row["record_commits"] = commits
                row.update(machine=f"{platform.node()} {os.cpu_count()} cores", episodes=episodes_for(args, workers))
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
