"""Measure scripted-demo success rate and throughput.

python -m robotloop.sim.measure --task transfer_cube --seeds 50 --workers 2 --image-size 48x64
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DemoResult:
    seed: int
    success: bool
    mocap_success: bool
    max_reward: float
    steps: int
    final_object_z: float  # cube (or peg) height at the end, a sanity check that it is still held
    seconds: float


def run_one(args: tuple[str, int, tuple[int, int] | None, int | None, int | None]) -> DemoResult:
    from robotloop.sim.scripted import record_demo  # imported in the worker (spawned, fresh EGL context)

    task, seed, image_size, max_steps, shadow_map = args
    start = time.perf_counter()
    demo = record_demo(task, seed, image_size=image_size, max_steps=max_steps, shadow_map=shadow_map)
    return DemoResult(
        seed=seed,
        success=demo.success,
        mocap_success=demo.mocap_success,
        max_reward=demo.max_reward,
        steps=len(demo),
        final_object_z=float(demo.info["final_object_pose"][2]),
        seconds=time.perf_counter() - start,
    )


def measure(
    task: str,
    seeds: list[int],
    workers: int,
    image_size,
    max_steps: int | None = None,
    shadow_map: int | None = None,
) -> list[DemoResult]:
    jobs = [(task, s, image_size, max_steps, shadow_map) for s in seeds]
    if workers <= 1:
        return [run_one(j) for j in jobs]
    with mp.get_context("spawn").Pool(workers) as pool:
        return pool.map(run_one, jobs, chunksize=1)


def main(argv: list[str] | None = None) -> None:
    from robotloop.sim.env import parse_image_size

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="transfer_cube", help="transfer_cube | insertion")
    p.add_argument("--seeds", type=int, default=50, help="number of seeds, starting at --start-seed")
    p.add_argument("--start-seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--image-size", default="480x640", help='HxW, or "none" to skip rendering')
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument(
        "--shadow-map", type=int, default=None, help="side of the lights' shadow maps; 0: no shadows (faster on CPU)"
    )
    args = p.parse_args(argv)
    size = None if args.image_size.lower() == "none" else parse_image_size(args.image_size)
    seeds = list(range(args.start_seed, args.start_seed + args.seeds))

    start = time.perf_counter()
    results = measure(args.task, seeds, args.workers, size, args.max_steps, shadow_map=args.shadow_map)
    wall = time.perf_counter() - start

    ok = np.array([r.success for r in results])
    failed = [r.seed for r in results if not r.success]
    print(
        f"task={args.task} seeds={seeds[0]}..{seeds[-1]} image_size={size} workers={args.workers} "
        f"shadow_map={args.shadow_map}"
    )
    print(f"success rate: {ok.mean():.1%} ({ok.sum()}/{len(ok)})  failed seeds: {failed}")
    print(f"mocap-pass success: {np.mean([r.mocap_success for r in results]):.1%}")
    print(f"max reward histogram (0..4): {np.bincount([int(r.max_reward) for r in results], minlength=5).tolist()}")
    print(f"final object z: median {np.median([r.final_object_z for r in results]):.3f} m")
    print(
        f"wall {wall:.1f} s, {len(results) / wall * 60:.1f} demos/min, "
        f"{np.mean([r.seconds for r in results]):.2f} s per demo per worker"
    )


if __name__ == "__main__":
    main()
