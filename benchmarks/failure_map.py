"""Where in the scene space a policy fails: its evaluations' failures by quarter of each object coordinate the
seeds sample (`robotloop.sim.scenes.scene_points`), and the scenes every evaluation failed. Evaluations of several
releases on the same seeds tell scene-bound failures (the same scenes each time) from chance.

    python benchmarks/failure_map.py benchmarks/results/flywheel_h100_20261206_1848_insertion_round0_eval.json \
        benchmarks/results/flywheel_h100_20261206_1606_insertion_chunks_eval.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from robotloop.deploy.evaluate import EvalReport
from robotloop.sim.scenes import scene_points

COORDINATES = {"transfer_cube": ("cube x", "cube y"), "insertion": ("peg x", "peg y", "socket x", "socket y")}


def quarters(values: np.ndarray, failed: np.ndarray) -> list[str]:
    """Failure rate (and scenes) in each quarter of `values`' range, low to high."""
    edges = np.linspace(values.min(), values.max(), 5)
    bins = np.clip(np.digitize(values, edges[1:-1]), 0, 3)
    return [f"{failed[bins == b].mean():.0%} of {(bins == b).sum()}" for b in range(4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="eval_report.json files of one task, the same seeds")
    args = parser.parse_args()
    reports = [EvalReport.load(path) for path in args.reports]
    task = reports[0].task
    seeds = sorted({e.seed for e in reports[0].episodes})
    failures = dict.fromkeys(seeds, 0)
    for report in reports:
        for e in report.episodes:
            failures[e.seed] += not e.success
    points = scene_points(task, seeds)
    points = points[:, points.max(axis=0) > points.min(axis=0)]
    failed = np.array([failures[s] / len(reports) for s in seeds])
    table = {"task": task, "evaluations": len(reports), "scenes": len(seeds), "failure_rate": failed.mean()}
    print(f"{task}: {len(reports)} evaluations of {len(seeds)} scenes, failure rate {failed.mean():.1%}")
    for name, column in zip(COORDINATES[task], points.T, strict=True):
        table[name] = quarters(column, failed)
        print(f"  {name:9} by quarter, low to high: {', '.join(table[name])}")
    if task == "insertion":  # both objects far from the robots (the y axis points away from them)
        table["peg y + socket y"] = quarters(points[:, 1] + points[:, 3], failed)
        print(f"  peg y + socket y by quarter: {', '.join(table['peg y + socket y'])}")
    every = [s for s in seeds if failures[s] == len(reports)]
    some = [s for s in seeds if 0 < failures[s] < len(reports)]
    table |= {"failed_by_every": every, "failed_by_some": some}
    print(f"  failed by every evaluation: {len(every)} scenes; by some, not all: {len(some)}")
    print(json.dumps(table, default=float))


if __name__ == "__main__":
    main()
