"""Takeover recovery rate of the sim expert (`robotloop.sim.expert`): from the states a failing policy leaves, how
often does the scripted expert, re-planning from there, reach the task's success?

    MUJOCO_GL=egl .venv/bin/python benchmarks/expert_recovery.py --seeds 20 --workers 2

Each case: reset the sim to `seed`'s scene, run `FailingPolicy(task, seed, failure, at)` for `at + --hold`
steps (the hold: the stall a `StallTrigger` waits out), then hand over to `ScriptedExpert`, which re-plans from the
sim's state (`start`) and acts until `done`; the episode's frames from then on are expert frames. A case counts
as recovered when the sim (the caller's, replaying the expert's actions) reaches reward 4; as unrecoverable when
the expert declines (`Unrecoverable`, e.g. the cube thrown out of reach); otherwise as failed. A case whose
policy reached reward 4 before the takeover (TransferCube's reward counts a left finger touching the lifted cube:
a policy frozen at the handover often does) ended in success: it needs no takeover and is left out of the rate.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import time
from collections import Counter

# (name, task, failure, at): early = before the grasp, mid = the object held and lifted, late = at the handover /
# insertion; shake, drop and zero perturb the objects or the arms.
CASES = [
    ("early: freeze over the cube", "transfer_cube", "freeze", 100),
    ("grasp: freeze while closing", "transfer_cube", "freeze", 160),
    ("mid: freeze with the cube lifted", "transfer_cube", "freeze", 200),
    ("late: freeze at the handover", "transfer_cube", "freeze", 280),
    ("shake to step 150, freeze", "transfer_cube", "shake", 150),
    ("drop the lifted cube", "transfer_cube", "drop", 200),
    ("zero actions from step 100", "transfer_cube", "zero", 100),
    ("early: freeze over the objects", "insertion", "freeze", 100),
    ("grasp: freeze while closing", "insertion", "freeze", 200),
    ("mid: freeze with both lifted", "insertion", "freeze", 260),
    ("late: freeze at the meeting point", "insertion", "freeze", 320),
    ("shake to step 150, freeze", "insertion", "shake", 150),
    ("drop both lifted objects", "insertion", "drop", 260),
    ("zero actions from step 100", "insertion", "zero", 100),
]


def run_case(job: tuple[str, str, str, int, int, int]) -> dict:
    from robotloop.sim import AlohaSim
    from robotloop.sim.expert import ScriptedExpert, Unrecoverable
    from robotloop.sim.failing import FailingPolicy

    name, task, failure, at, seed, hold = job
    start = time.perf_counter()
    sim = AlohaSim(task, image_size=None, max_episode_steps=2**31)
    obs = sim.reset(seed)
    policy = FailingPolicy(task, seed, failure, at)
    rewards = [sim.step(policy.act(obs))[1] for _ in range(at + hold)]
    result = {"case": name, "task": task, "seed": seed, "stall_reward": rewards[-1], "policy_max": max(rewards)}
    if max(rewards) == sim.task.max_reward:  # the episode ended in success (a finger touched the lifted cube)
        return {**result, "outcome": "policy succeeded", "seconds": time.perf_counter() - start}
    expert = ScriptedExpert(task)
    try:
        expert.start(sim)
    except Unrecoverable as error:
        return {**result, "outcome": "unrecoverable", "why": str(error), "seconds": time.perf_counter() - start}
    frames = 0
    while not expert.done:
        sim.step(expert.act(obs))
        frames += 1
    outcome = "recovered" if sim.reward() == sim.task.max_reward else "failed"
    return {
        **result,
        "outcome": outcome,
        "expert_frames": frames,
        "phases": expert.phases,
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--hold", type=int, default=50, help="steps the failing policy stalls before the takeover")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--task", default=None, help="only this task's cases")
    p.add_argument("--json", default=None, help="write every case's result here")
    args = p.parse_args(argv)
    cases = [c for c in CASES if args.task in (None, c[1])]
    jobs = [(*case, seed, args.hold) for case in cases for seed in range(args.seeds)]
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers) as pool:
        results = pool.map(run_case, jobs, chunksize=1)
    wall = time.perf_counter() - start
    print(f"seeds 0..{args.seeds - 1}, hold {args.hold} steps, {platform.processor() or platform.machine()}")
    print(f"{'task':14} {'case':36} {'recovered':>10} {'unrecov.':>9} {'failed':>7} {'expert frames':>14}")
    for name, task, _, _ in cases:
        rows = [r for r in results if r["case"] == name and r["task"] == task]
        count = Counter(r["outcome"] for r in rows)
        frames = [r["expert_frames"] for r in rows if r["outcome"] == "recovered"]
        median = f"{statistics.median(frames):.0f}" if frames else "-"
        needed = len(rows) - count["policy succeeded"]
        print(
            f"{task:14} {name:36} {count['recovered']:>4}/{needed:<5} {count['unrecoverable']:>9} "
            f"{count['failed']:>7} {median:>14}"
            + (f"  ({count['policy succeeded']} policy successes left out)" if count["policy succeeded"] else "")
        )
    for r in results:
        if r["outcome"] not in ("recovered", "policy succeeded"):
            print(f"  {r['task']} {r['case']!r} seed {r['seed']}: {r['outcome']} {r.get('why', r.get('phases'))}")
    print(f"wall {wall:.0f} s for {len(jobs)} cases on {args.workers} workers")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
