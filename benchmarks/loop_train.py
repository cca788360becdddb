"""The loop's training alone: is training inside `robotloop loop` as fast as the same training run by itself?

Run (GPU machine, after a loop run, same bucket):
    python3 benchmarks/loop_train.py --dataset hf://buckets/local/loop/datasets/transfer_cube-<run> --batch 64 8

Each batch size trains `--steps` steps with the loop preset's own settings (`LoopSettings.preset(--preset)`: the
recipe, the decode workers, the device) on a dataset that is already complete, and waits until every episode is
in the frame buffer before step 1 (`deterministic`), so nothing runs beside it. The steady rate is taken between
the first progress report after `--skip` steps and the last one. The loop's report gives the in-loop rate of the
same settings (`train.samples_per_s`, recording running beside it for part of the stage). `--like-loop` trains as
the loop does (from the first decoded episodes, the bucket re-listed every 5 s); `--gc-every 0 500` compares
Python's automatic garbage collection with collecting by hand every 500 steps (`TrainSettings.gc_every`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from robotloop.loop import LoopSettings
from robotloop.storage import BucketUrl, connect
from robotloop.train.data import DataSettings
from robotloop.train.trainer import Progress, TrainSettings, train


def steady_rate(points: list[Progress], batch: int, skip: int) -> float:
    """Samples/s between the first report at or after `skip` steps and the last one."""
    first = next(p for p in points if p.step >= skip)
    last = points[-1]
    return batch * (last.step - first.step) / (last.elapsed_s - first.elapsed_s)


def measure(
    dataset: str,
    preset: str,
    batch: int,
    steps: int,
    skip: int,
    run: str,
    like_loop: bool = False,
    gc_every: int | None = None,
) -> dict:
    s = LoopSettings.preset(preset, batch_size=batch, steps=steps)
    points: list[Progress] = []
    t0 = time.monotonic()
    report = train(
        connect(),
        [BucketUrl.parse(dataset)],
        BucketUrl.parse(f"{s.bucket}/models/{run}-b{batch}"),
        TrainSettings(
            steps=steps,
            batch_size=batch,
            log_every=25,
            checkpoint_every=steps,
            device=s.device,
            deterministic=not like_loop,
            gc_every=gc_every,
        ),
        s.act(),
        DataSettings(decode_workers=s.decode_workers, refresh_every_s=5.0 if like_loop else 30.0),
        points.append,
    )
    return {
        "batch": batch,
        "like_loop": like_loop,
        "gc_every": gc_every,
        "steps": report.steps,
        "steady_samples_per_s": round(steady_rate(points, batch, skip), 1),
        "run_samples_per_s": report.samples_per_s,
        "wall_s": round(time.monotonic() - t0, 1),
        "final_loss": report.final_loss,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help="a complete dataset in the bucket, e.g. a loop run's")
    ap.add_argument("--preset", default="h200")
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 8])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--skip", type=int, default=100, help="steps left out of the steady rate")
    ap.add_argument(
        "--like-loop", action="store_true", help="as the loop trains: no wait for the buffer, re-list every 5 s"
    )
    ap.add_argument("--gc-every", type=int, nargs="+", default=[0], help="0: automatic GC; N: by hand every N steps")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    run = time.strftime("standalone-%Y%m%d-%H%M%S")
    rows = [
        measure(args.dataset, args.preset, b, args.steps, args.skip, f"{run}-gc{g}", args.like_loop, g or None)
        for b in args.batch
        for g in args.gc_every
    ]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"dataset": args.dataset, "preset": args.preset, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
