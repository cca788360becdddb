"""Policy runner latency and sim evaluation throughput (figures for deploy, not required by BENCHMARKS.md).

Run:    .venv/bin/python benchmarks/eval.py [--size full|tiny] [--image-size 480x640] [--device cpu]
            [--episodes 4] [--workers 2] [--max-steps 100] [--chunks 5]
Smoke:  .venv/bin/python benchmarks/eval.py --size tiny --image-size 48x64 --episodes 2 --max-steps 20

A random-weight ACT (`--size full`: lerobot 0.6.1's default ACT, 51.6M params, chunk 100; `tiny`: dim 64,
chunk 10) saved with `save_pretrained`, as the trainer saves it. Measured:
  load_s                     PolicyRunner.load (config, weights, processors)
  first_act_cold_ms          the first act() of a fresh runner without warmup (includes first-call costs)
  first_act_warm_ms          the same after warmup(): what a hot-swap's first step costs
  boundary_act_ms            median act() that runs the model (one per chunk)
  queued_act_ms              median act() that pops the queue
  eval_episodes_per_min      evaluate() over --episodes episodes of --max-steps steps in --workers processes,
  eval_steps_per_s           worker start-up included (each worker imports torch/lerobot/mujoco, loads the policy)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from robotloop.deploy.evaluate import evaluate
from robotloop.deploy.runner import PolicyRunner, make_tiny_checkpoint
from robotloop.sim import AlohaSim
from robotloop.sim.env import parse_image_size
from robotloop.train.policy import ACTSettings


def timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - start)


def runner_latency(ckpt: Path, size: tuple[int, int], device: str, chunks: int) -> dict:
    start = time.perf_counter()
    runner = PolicyRunner.load(ckpt, device)
    load_s = time.perf_counter() - start
    with AlohaSim("transfer_cube", image_size=size) as sim:
        obs = sim.reset(seed=0)
    cold = timed_ms(lambda: runner.act(obs))
    warm_runner = PolicyRunner.load(ckpt, device)
    warm_runner.warmup(obs)
    warm = timed_ms(lambda: warm_runner.act(obs))
    runner.reset()
    boundary, queued = [], []
    chunk = runner.policy.config.n_action_steps
    for _ in range(chunks * chunk):
        (boundary if runner.at_chunk_boundary else queued).append(timed_ms(lambda: runner.act(obs)))
    return {
        "load_s": load_s,
        "first_act_cold_ms": cold,
        "first_act_warm_ms": warm,
        "boundary_act_ms": statistics.median(boundary),
        "queued_act_ms": statistics.median(queued) if queued else None,
        "n_action_steps": chunk,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=["full", "tiny"], default="full")
    ap.add_argument("--image-size", default="480x640")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=100)
    ap.add_argument("--chunks", type=int, default=5)
    args = ap.parse_args()
    size = parse_image_size(args.image_size)
    settings = ACTSettings(dropout=0.0) if args.size == "full" else None
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny_checkpoint(Path(tmp) / "pretrained_model", size, settings=settings)
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.node()} {os.cpu_count()} cores",
            "policy": args.size,
            "image_size": args.image_size,
            "device": args.device,
            **runner_latency(ckpt, size, args.device, args.chunks),
        }
        report = evaluate(
            ckpt, "transfer_cube", args.episodes, args.workers, max_steps=args.max_steps, device=args.device
        )
    steps = sum(e.steps for e in report.episodes)
    result.update(
        eval_workers=args.workers,
        eval_episodes=args.episodes,
        eval_wall_s=report.wall_s,
        eval_episodes_per_min=60 * args.episodes / report.wall_s,
        eval_steps_per_s=steps / report.wall_s,
    )
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()
