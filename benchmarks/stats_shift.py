"""How far a round's fleet episodes move the normalization stats of the demos a policy was trained on.

A round's fine-tune trains on the demos plus the fleet's episodes, which end at success instead of running the
task's whole episode. Scripted episodes stand in for both (no rendering: states and actions only): `--demos` whole
episodes against those plus `--fleet` episodes of fresh seeds, each cut at its first success, or at `--fleet-steps`
(the length of the policy's own successful episodes). Printed: each joint's mean shift in the demos' standard
deviations, and the ratio of the standard deviations, for the state and the action.

    MUJOCO_GL=egl .venv/bin/python benchmarks/stats_shift.py --task transfer_cube --demos 50 --fleet 60
"""

import argparse

import numpy as np

from robotloop.sim.scripted import record_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="transfer_cube")
    parser.add_argument("--demos", type=int, default=50)
    parser.add_argument("--fleet", type=int, default=60)
    parser.add_argument("--fleet-steps", type=int, help="cut each fleet episode here (default: at its first success)")
    args = parser.parse_args()
    demos = [record_demo(args.task, seed, image_size=None) for seed in range(args.demos)]
    fleet = [record_demo(args.task, 100_000 + seed, image_size=None) for seed in range(args.fleet)]
    ends = [args.fleet_steps or int(np.argmax(d.rewards >= d.rewards.max())) + 1 for d in fleet]
    print(f"fleet episodes: {args.fleet}, steps median {np.median(ends):.0f} (min {min(ends)}, max {max(ends)})")
    for key in ("states", "actions"):
        before = np.concatenate([getattr(d, key) for d in demos])
        after = np.concatenate([before, *(getattr(d, key)[:n] for d, n in zip(fleet, ends, strict=True))])
        std = before.std(0) + 1e-8
        shift = (after.mean(0) - before.mean(0)) / std
        ratio = after.std(0) / std
        print(f"{key}: mean shift in stds {[round(float(x), 2) for x in shift]} (largest {np.abs(shift).max():.2f})")
        print(f"{key}: std ratio {[round(float(x), 2) for x in ratio]} ({ratio.min():.2f}-{ratio.max():.2f})")


if __name__ == "__main__":
    main()
