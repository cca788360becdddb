"""What rendering only the frames a policy reads saves an evaluation (BENCHMARKS.md, "Frames the policy sees").

Run:    MUJOCO_GL=egl .venv/bin/python benchmarks/eval_frames.py [--task insertion] [--size full] [--image-size 240x320]
            [--episodes 4] [--workers 2] [--max-steps 400] [--turns 3] [--device cpu] [--shadow-map 2048]
Smoke:  MUJOCO_GL=egl .venv/bin/python benchmarks/eval_frames.py --size tiny --image-size 48x64 --max-steps 30 --turns 1

A random-weight ACT acting in whole chunks (`--size full`: lerobot's default ACT, chunk 100, as the h200 recipe
acts; `tiny`: chunk 10) runs the same seeds in lockstep, as `evaluate` runs them, two ways taking turns: `read`
renders the frames the policy reads (the first of each chunk), `every` renders every step's, as evaluations did
before 2026-12-07. Each turn builds its own sim workers. One JSON line per turn, then the medians and their ratio,
and whether both ways took the same actions (they must: rendering never changes the physics).
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
from typing import TYPE_CHECKING

import numpy as np

from robotloop.deploy.lockstep import SimBatch, Slot
from robotloop.sim.constants import parse_image_size

# The modules that import torch are imported in the functions that use them: each spawned sim worker imports this
# script again (as multiprocessing's spawn does a script's, never a package's `__main__`, so never the CLI's), and
# torch would add seconds to every worker's start that the loop's evaluations do not pay.
if TYPE_CHECKING:
    from robotloop.deploy.runner import PolicyRunner


class EveryFrame:
    """The runner, saying it reads every frame: the sims then render every step, as before."""

    def __init__(self, runner: PolicyRunner) -> None:
        self.runner = runner

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    at_chunk_boundary = True


def turn(runner: PolicyRunner, way: str, args, size: tuple[int, int]) -> tuple[dict, np.ndarray]:
    """One turn of `way` with `runner`: its row, and every action it took."""
    from robotloop.deploy.evaluate import LockstepTime, _run_lockstep

    policy = runner if way == "read" else EveryFrame(runner)
    slots = [Slot(i, 1000 + i) for i in range(args.episodes)]
    actions = []
    act_batch = runner.act_batch

    def logged(images, states):  # what the policy did, to check both ways did the same
        actions.append(act_batch(images, states))
        return actions[-1]

    runner.act_batch = logged
    split = LockstepTime()
    start = time.perf_counter()
    sims = SimBatch(args.task, args.episodes, args.workers, size, args.max_steps, shadow_map=args.shadow_map)
    started = time.perf_counter()
    with sims:
        episodes = list(_run_lockstep(policy, sims, slots, args.max_steps, split))
        split.add_workers(sims.busy())
    runner.act_batch = act_batch
    done = time.perf_counter()
    return {
        "way": way,
        "eval_s": done - started,  # the episodes, without building the workers
        "workers_start_s": started - start,
        "policy_s": split.policy_s,
        "sims_s": split.sims_s,
        "render_s": sum(split.workers_render_s),
        "frames": sum(split.workers_frames),
        "steps": sum(e.steps for e in episodes),
    }, np.stack(actions)


def main() -> None:
    from robotloop.deploy.runner import PolicyRunner, make_tiny_checkpoint
    from robotloop.train.policy import ACTSettings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="insertion")
    ap.add_argument("--size", choices=["full", "tiny"], default="full")
    ap.add_argument("--image-size", default="240x320")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=400)
    ap.add_argument("--turns", type=int, default=3, help="turns of each way, alternating")
    ap.add_argument("--shadow-map", type=int, default=2048, help="the h200 recipe's (0: the image's default)")
    ap.add_argument("--json", type=Path, help="also write the turns and the summary here")
    args = ap.parse_args()
    args.shadow_map = args.shadow_map or None
    size = parse_image_size(args.image_size)
    settings = ACTSettings(dropout=0.0, n_action_steps=100) if args.size == "full" else None
    rows, actions = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny_checkpoint(Path(tmp) / "pretrained_model", size, settings=settings)
        runner = PolicyRunner.load(ckpt, args.device)
        for i in range(2 * args.turns):
            way = ("read", "every")[i % 2]
            row, actions[way] = turn(runner, way, args, size)
            rows.append(row)
            print(json.dumps(row), flush=True)
    median = {way: statistics.median(r["eval_s"] for r in rows if r["way"] == way) for way in ("read", "every")}
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "task": args.task,
        "policy": args.size,
        "n_action_steps": runner.policy.config.n_action_steps,
        "image_size": args.image_size,
        "episodes": args.episodes,
        "workers": args.workers,
        "max_steps": args.max_steps,
        "device": args.device,
        "median_eval_s": median,
        "ratio_read_to_every": median["read"] / median["every"],
        "same_actions": bool(np.array_equal(actions["read"], actions["every"])),
    }
    print(json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"turns": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
