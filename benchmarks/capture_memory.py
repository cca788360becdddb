"""Memory the capture service holds while it commits an episode: peak traced memory (numpy's buffers are traced
by tracemalloc) during `EpisodeSessions.close`, the open episode's frames included, for episodes streamed in
batches as robots send them (as fast as the service takes them). The ratio to the episode's image bytes is the
figure; the peak over the whole episode (streaming included: the batch in hand, the encoder's queue) is given too.

Run:  .venv/bin/python benchmarks/capture_memory.py [--frames 300 --image-size 240x320 --batch 50 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np

from robotloop.capture.sessions import EpisodeSessions, Frames, Limits
from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server


def close_peak(
    sessions: EpisodeSessions, url: BucketUrl, size: tuple[int, int], frames: int, batch: int, seed: int
) -> tuple[float, float]:
    """MiB at the peak of `close`, counting everything allocated since the episode opened; and at the peak of the
    whole episode, from open to the end of the close."""
    h, w = size
    episode = sessions.open("bench", url, {"top": (h, w, 3)}, 14, 14, fps=50)
    tracemalloc.start()
    rng = np.random.default_rng(seed)
    for start in range(0, frames, batch):
        n = min(batch, frames - start)
        sessions.add_frames(
            "bench",
            episode,
            Frames(
                (np.arange(start, start + n) + 0.5) / 50,
                np.zeros((n, 14), np.float32),
                np.zeros((n, 14), np.float32),
                {"top": rng.integers(0, 255, (n, h, w, 3), dtype=np.uint8)},
                np.zeros(n, np.float32),
                np.zeros(n, bool),
            ),
        )
    streaming = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.reset_peak()
    sessions.close("bench", episode, "bench task")
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return peak, max(peak, streaming)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--image-size", default="240x320")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.image_size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        server = ensure_embedded_server(Path(tmp) / "server")
        try:
            client = BucketClient(server.endpoint, server.token)
            sessions = EpisodeSessions(
                client, Limits(max_frames=100_000, max_bytes=2**34), vcodec="h264", staging=Path(tmp) / "staging"
            )
            # The first close also pays for imports and the encoder's set-up: reported apart, not in the median.
            peaks = [
                close_peak(
                    sessions, BucketUrl.parse(f"hf://buckets/bench/mem/datasets/d{k}"), size, args.frames, args.batch, k
                )
                for k in range(args.repeats + 1)
            ]
        finally:
            stop_embedded_server(Path(tmp) / "server")
    episode_mib = args.frames * size[0] * size[1] * 3 / 2**20
    median = statistics.median(p for p, _ in peaks[1:])
    episode_median = statistics.median(e for _, e in peaks[1:])
    print(
        json.dumps(
            {
                "episode_image_mib": round(episode_mib, 1),
                "first_close_peak_mib": round(peaks[0][0], 1),
                "close_peaks_mib": [round(p, 1) for p, _ in peaks[1:]],
                "median_mib": round(median, 1),
                "ratio_to_episode": round(median / episode_mib, 2),
                "episode_peaks_mib": [round(e, 1) for _, e in peaks[1:]],
                "episode_median_mib": round(episode_median, 1),
                "load_average": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
