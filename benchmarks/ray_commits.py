"""Where a recording's time goes, process pool against Ray: when each episode was committed, and its commit's upload.

    MUJOCO_GL=egl .venv/bin/python benchmarks/ray_commits.py --backends pool ray --episodes 4 --workers 2

One line per backend: the run's seconds and, per committed episode, (seconds since the start, seed, encode_s,
upload_s). Scripted TransferCube demos at 120x160, h264, into a fresh embedded bucket server; Ray on a local cluster.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from robotloop.capture import DatasetRecorder, DatasetSpec
from robotloop.capture.sim_record import record_sim
from robotloop.cluster import ray_session
from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server

SIZE = (120, 160)


def run(backend: str, episodes: int, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        server = ensure_embedded_server(Path(tmp) / "server")
        try:
            client = BucketClient(server.endpoint, server.token)
            url = BucketUrl.parse(f"hf://buckets/bench/ray/datasets/{backend}")
            recorder = DatasetRecorder(client, url, DatasetSpec.aloha(SIZE, "h264"), staging=Path(tmp) / "stage")
            start, commits = time.perf_counter(), []

            def on_event(kind: str, seed: int, report) -> None:
                if report is not None:
                    at = round(time.perf_counter() - start, 1)
                    commits.append((at, seed, round(report.encode_s, 2), round(report.upload_s, 2)))

            ray = "local" if backend == "ray" else None
            record_sim(recorder, "transfer_cube", episodes, workers, SIZE, keep_failed=True, on_event=on_event, ray=ray)
            return {"backend": backend, "seconds": round(time.perf_counter() - start, 1), "commits": commits}
        finally:
            stop_embedded_server(Path(tmp) / "server")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", nargs="+", choices=("pool", "ray"), default=["pool", "ray"])
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    with ray_session("local"):  # started once, outside the timings, as ray_throughput.py does
        for backend in args.backends:
            print(json.dumps(run(backend, args.episodes, args.workers)), flush=True)


if __name__ == "__main__":
    main()
