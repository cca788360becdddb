"""Append workload: a LeRobot v3 dataset (parquet + mp4) grows by one episode; what does re-uploading cost?

Run:  .venv/bin/python benchmarks/append.py [--episodes 10] [--frames 200] [--image 96x128]

Two cases, each comparing the bytes the server received for the second upload with the episode's own bytes
(how much the dataset's data and video files grew):
- grow: the same recording with N and then N+1 episodes (lerobot's writer, same seeds), so that
  data/file-000.parquet and videos/.../file-000.mp4 grow by one episode in place;
- resume: lerobot's LeRobotDataset.resume adds the episode, which it writes into new files.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from storage import server_bytes_received  # noqa: E402  (benchmarks/ is run as a script folder)

from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server


def features(h: int, w: int) -> dict:
    return {
        "observation.images.top": {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (14,), "names": None},
        "action": {"dtype": "float32", "shape": (14,), "names": None},
    }


def add_episode(ds: LeRobotDataset, seed: int, frames: int, h: int, w: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    for t in range(frames):  # a moving scene, so video frames differ as a camera's would
        img = np.roll(base, shift=t, axis=1)
        ds.add_frame(
            {
                "observation.images.top": img,
                "observation.state": rng.normal(size=14).astype(np.float32),
                "action": rng.normal(size=14).astype(np.float32),
                "task": "transfer the cube",
            }
        )
    ds.save_episode()


def dataset_bytes(root: Path) -> int:
    return sum(p.stat().st_size for sub in ("data", "videos") for p in (root / sub).rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--image", default="96x128")
    args = ap.parse_args()
    h, w = map(int, args.image.split("x"))
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "episodes_before": args.episodes,
        "frames": args.frames,
        "image": args.image,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = ensure_embedded_server(work / "server")
        client = BucketClient(server.endpoint, server.token)
        try:
            results["grow"] = measure(client, work, "grow", args, h, w, resume=False)
            results["resume"] = measure(client, work, "resume", args, h, w, resume=True)
        finally:
            stop_embedded_server(work / "server")
    print(json.dumps(results, indent=1))


def record(root: Path, episodes: range, args: argparse.Namespace, h: int, w: int, resume: bool, seed0: int) -> None:
    if resume:
        ds = LeRobotDataset.resume("bench/cube", root=root)
    else:
        ds = LeRobotDataset.create("bench/cube", fps=50, features=features(h, w), root=root)
    for ep in episodes:
        add_episode(ds, seed0 + ep, args.frames, h, w)
    ds.finalize()


def measure(
    client: BucketClient, work: Path, case: str, args: argparse.Namespace, h: int, w: int, resume: bool
) -> dict:
    url = BucketUrl.parse(f"hf://buckets/bench/append/{case}")
    client.create_bucket(url)
    first, second = work / f"{case}-n", work / f"{case}-n1"
    seed0 = 1000 * resume  # the server dedups globally: each case records content of its own
    record(first, range(args.episodes), args, h, w, resume=False, seed0=seed0)
    client.upload(first, url)
    if resume:
        second = first
        before = dataset_bytes(first)
        record(second, range(args.episodes, args.episodes + 1), args, h, w, resume=True, seed0=seed0)
    else:
        record(second, range(args.episodes + 1), args, h, w, resume=False, seed0=seed0)
        before = dataset_bytes(first)
    episode_bytes = dataset_bytes(second) - before
    received_before = server_bytes_received(client)
    report = client.upload(second, url)
    received = server_bytes_received(client) - received_before
    return {
        "episode_bytes": episode_bytes,
        "server_bytes_received": received,
        "client_bytes_sent": report.bytes_sent,
        "ratio": received / episode_bytes,
        "files": sorted(str(p.relative_to(second)) for p in second.rglob("*") if p.is_file() and "meta" not in p.parts),
    }


if __name__ == "__main__":
    main()
