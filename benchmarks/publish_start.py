"""What a round's publish takes once its checkpoint is in the bucket: a publisher process started then (what
rounds did) against one started earlier, while the round trained (`Publisher`, what they do now), side by side.

Run:  MUJOCO_GL=egl .venv/bin/python benchmarks/publish_start.py [--pairs 3] [--head-start 20]
          [--out benchmarks/results/publish_start_2core.json]

Everything is real and on localhost, as in `benchmarks/deploy.py` (whose set-up this reuses): the embedded bucket
server, the deploy service, hf_xet transfers. The policy is the h200 preset's, as `benchmarks/robot_onnx.py` builds
it (lerobot's default-size ACT, 51.6M parameters, random weights, seeing the 480x640 camera at 120x160), saved
without an ONNX export beside it, so that every publish exports it (as a round's does: its training leaves none).
Each pair publishes the checkpoint under two new names, cold then warm (the warm publisher given `--head-start`
seconds first, standing in for the round's training); the figure is the time from the call to the signed,
registered release, as a round waits for it once its evaluation is done.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from deploy import Bench, running_bench  # benchmarks/: the same set-up
from robot_onnx import build_checkpoint

from robotloop.deploy.publish import Publisher


def timed_publish(bench: Bench, checkpoint: str, name: str, publisher: Publisher | None) -> float:
    """Seconds from the call to the registered release: through `publisher`, or a child started now."""
    start = time.perf_counter()
    with Publisher() if publisher is None else nullcontext(publisher) as child:
        child.publish(bench.bucket, checkpoint, name, bench.work / "deploy.key", bench.ops).result()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--head-start", type=float, default=20.0, help="seconds the warm publisher gets first")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp, running_bench(Path(tmp)) as bench:
        checkpoint = bench.upload(build_checkpoint(bench.work / "ckpt" / "pretrained_model", quick=False)[0])
        timed_publish(bench, checkpoint, "first", None)  # the export's bytes in the bucket: both arms dedup them
        for pair in range(args.pairs):
            times["cold"].append(timed_publish(bench, checkpoint, f"cold-{pair}", None))
            with Publisher() as publisher:
                time.sleep(args.head_start)
                times["warm"].append(timed_publish(bench, checkpoint, f"warm-{pair}", publisher))
            print(f"pair {pair}: cold {times['cold'][-1]:.1f} s, warm {times['warm'][-1]:.1f} s", flush=True)
    medians = {arm: statistics.median(values) for arm, values in times.items()}
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "policy": "the h200 preset's ACT, 480x640 seen at 120x160, random weights",
        "head_start_s": args.head_start,
        "seconds": times,
        "median_s": medians,
        "saved_s": medians["cold"] - medians["warm"],
    }
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
