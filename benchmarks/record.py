"""Recording figures for BENCHMARKS.md: scripted demos/min, bytes sent per episode, commit latency.

Run:  .venv/bin/python benchmarks/record.py --task transfer_cube --episodes 16 --workers 16 --image-size 480x640

Records into a fresh embedded bucket server with `record_sim` (the code behind `robotloop record`).
Commit latency = from the moment the episode's frames are complete to the commit being visible to readers:
lerobot's encode + finalize, then the data/video upload and the metadata upload (the server applies each
batch atomically, so the dataset is readable when the metadata batch is acknowledged).

`--realtime`: the robot case. Recorded demos are replayed frame by frame at the task's 50 Hz into a live
episode (`DatasetRecorder.begin`), as a robot or the capture service feeds them, and latency is measured from
the last frame to the commit being visible. `--service`: the same frames go through the capture service's
`EpisodeSessions` (wire-format batches of `--batch` frames, each sent when its last frame exists; no HTTP), and
latency runs from the last batch to its close returning.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from robotloop.capture import DatasetRecorder, DatasetSpec
from robotloop.capture.sim_record import record_sim
from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server


@contextmanager
def fresh_recorder(name: str, args: argparse.Namespace, size: tuple[int, int]) -> Iterator[DatasetRecorder]:
    """A recorder writing into a fresh embedded bucket server, stopped afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        server = ensure_embedded_server(Path(tmp) / "server")
        try:
            client = BucketClient(server.endpoint, server.token)
            url = BucketUrl.parse(f"hf://buckets/bench/{name}/datasets/{args.task}")
            yield DatasetRecorder(client, url, DatasetSpec.aloha(size, args.codec), staging=Path(tmp) / "stage")
        finally:
            stop_embedded_server(Path(tmp) / "server")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="transfer_cube")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--image-size", default="480x640")
    ap.add_argument("--codec", default="libsvtav1")
    ap.add_argument("--realtime", action="store_true", help="feed frames at 50 Hz into live episodes")
    ap.add_argument("--service", action="store_true", help="with --realtime: through the capture service's sessions")
    ap.add_argument("--batch", type=int, default=10, help="with --service: frames per batch")
    args = ap.parse_args()
    if args.realtime:
        return realtime(args)
    size = tuple(int(v) for v in args.image_size.split("x"))
    with fresh_recorder("record", args, size) as recorder:
        report = record_sim(recorder, args.task, args.episodes, args.workers, size)
    commits = report.committed
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "task": args.task,
        "image_size": args.image_size,
        "codec": args.codec,
        "workers": args.workers,
        "episodes": len(commits),
        "scripted_success": report.success_rate,
        "failed_seeds": report.failed_seeds,
        "episodes_per_minute": report.episodes_per_minute,
        "wall_s": report.wall_s,
        "bytes_sent_per_episode_bytes": sum(c.bytes_sent for c in commits) / sum(c.episode_bytes for c in commits),
        "median_episode_bytes": statistics.median(c.episode_bytes for c in commits),
        "median_encode_s": statistics.median(c.encode_s for c in commits),
        "median_upload_s": statistics.median(c.upload_s for c in commits),
        "median_end_to_visible_s": statistics.median(c.encode_s + c.upload_s for c in commits),
    }
    print(json.dumps(result, indent=1), flush=True)


def realtime(args: argparse.Namespace) -> None:
    from robotloop.capture.sim_record import TASK_TEXT
    from robotloop.sim import record_demo

    size = tuple(int(v) for v in args.image_size.split("x"))
    demos = [record_demo(args.task, seed, image_size=size) for seed in range(args.episodes)]
    latencies, sent, own = [], 0, 0
    with fresh_recorder("realtime", args, size) as recorder:
        feed = service_episode(recorder, args) if args.service else None
        for demo in demos:
            if feed is not None:
                report, latency = feed(demo, TASK_TEXT[args.task])
                latencies.append(latency)
                sent, own = sent + report.bytes_sent, own + report.episode_bytes
                print(f"episode {report.episode_index}: visible {latency:.2f} s after its last batch", flush=True)
                continue
            live, start = recorder.begin(TASK_TEXT[args.task]), time.perf_counter()
            for t in range(len(demo)):
                time.sleep(max(0.0, start + t / 50 - time.perf_counter()))  # frames arrive at 50 Hz
                live.add_frame(
                    {
                        "observation.images.top": demo.frames[t],
                        "observation.state": demo.states[t],
                        "action": demo.actions[t],
                        "next.reward": demo.rewards[t : t + 1],
                        "next.success": demo.rewards[t : t + 1] >= 4,
                    }
                )
            end = time.perf_counter()
            report = live.commit()
            latencies.append(time.perf_counter() - end)
            sent, own = sent + report.bytes_sent, own + report.episode_bytes
            print(f"episode {report.episode_index}: visible {latencies[-1]:.2f} s after its last frame", flush=True)
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{platform.node()} {os.cpu_count()} cores",
                "task": args.task,
                "image_size": args.image_size,
                "codec": args.codec,
                "via": f"EpisodeSessions, batches of {args.batch}" if args.service else "DatasetRecorder.begin",
                "load_average": os.getloadavg(),
                "episodes": len(latencies),
                "median_end_to_visible_s": statistics.median(latencies),
                "max_end_to_visible_s": max(latencies),
                "bytes_sent_per_episode_bytes": sent / own,
            },
            indent=1,
        )
    )


def service_episode(recorder: DatasetRecorder, args: argparse.Namespace):
    """A function recording one demo through `EpisodeSessions`, as the capture service does for a robot: batches
    sent at the task's 50 Hz, then the close. Returns (CommitReport, seconds from the last batch to visible)."""
    import numpy as np

    from robotloop.capture.sessions import EpisodeSessions, encode_frames

    spec = recorder.spec
    sessions = EpisodeSessions(recorder.client, vcodec=args.codec, staging=recorder.staging / "sessions")

    def feed(demo, task: str):
        eid = sessions.open("bench", recorder.url, spec.cameras, spec.state_dim, spec.action_dim, 50, spec.robot_type)
        start = time.perf_counter()
        for first in range(0, len(demo), args.batch):
            t = np.arange(first, min(first + args.batch, len(demo)))
            time.sleep(max(0.0, start + t[-1] / 50 - time.perf_counter()))  # the batch's last frame exists now
            body = encode_frames(
                t / 50,
                demo.states[t],
                demo.actions[t],
                {"top": demo.frames[t]},
                demo.rewards[t],
                demo.rewards[t] >= 4,
            )
            sessions.add_frames("bench", eid, body)
        end = time.perf_counter()
        report = sessions.close("bench", eid, task)
        return report, time.perf_counter() - end

    return feed


if __name__ == "__main__":
    main()
