"""Two checkouts side by side on one benchmark, alternating, medians: is a slower figure the code's or the machine's?

Run:  .venv/bin/python benchmarks/compare.py --old /tmp/old --new . --bench deploy --repeats 3

Each repeat runs the benchmark once in `--old`, then once in `--new` (each tree's own script, imported from that
tree: PYTHONPATH is the tree), so both see the same machine load in turn; the load average is printed beside
each run. Make the old tree with `git worktree add --detach /tmp/old <commit>`.

Benches:
- deploy: `benchmarks/deploy.py`; fine-tune and retrain publish, publish to ready, publish to running, control Hz.
- capture: `benchmarks/record.py --realtime --task transfer_cube --episodes 6 --image-size 480x640` (the robot
  case); the median and max episode end to visible.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COMMANDS = {
    "deploy": ["benchmarks/deploy.py"],
    "capture": ["benchmarks/record.py", "--realtime", "--task", "transfer_cube", "--image-size", "480x640"],
}


def figures(bench: str, out: dict) -> dict[str, float]:
    """The figures BENCHMARKS.md reports, from one run's JSON."""
    if bench == "capture":
        return {
            "end_to_visible_median_s": out["median_end_to_visible_s"],
            "end_to_visible_max_s": out["max_end_to_visible_s"],
        }
    lat = out["latency"]
    row = {"control_hz": lat["control_hz"], "max_gap_ms": lat["max_gap_ms_whole_run"]}
    for case in ("finetune", "retrain"):
        for key in ("publish_s", "publish_to_ready_s", "publish_to_running_s"):
            row[f"{case}.{key}"] = lat[f"run-{case}"][key]
    return row


def run_once(tree: Path, bench: str, episodes: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "MUJOCO_GL": "egl"}
    cmd = [sys.executable, *COMMANDS[bench]]
    with tempfile.TemporaryDirectory() as tmp:
        if bench == "deploy":
            cmd += ["--out", f"{tmp}/out.json"]
        else:
            cmd += ["--episodes", str(episodes)]
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{tree}: {' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        if bench == "deploy":
            return figures(bench, json.loads(Path(f"{tmp}/out.json").read_text()))
    text = done.stdout
    return figures(bench, json.loads(text[text.rindex("\n{") + 1 :]))  # the summary is the last JSON object


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, default=Path("."))
    parser.add_argument("--bench", choices=sorted(COMMANDS), required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=6, help="capture: episodes per run")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for repeat in range(args.repeats):
        for side in ("old", "new"):
            load = os.getloadavg()[0]
            row = run_once(getattr(args, side).resolve(), args.bench, args.episodes)
            runs[side].append(row)
            print(
                f"repeat {repeat} {side} (load {load:.1f} -> {os.getloadavg()[0]:.1f}): {json.dumps(row)}", flush=True
            )
    print(f"\nmedians of {args.repeats} ({args.old} against {args.new}):")
    for key in runs["old"][0]:
        old, new = (statistics.median(r[key] for r in runs[side]) for side in ("old", "new"))
        print(f"  {key:32s} old {old:8.2f}   new {new:8.2f}")


if __name__ == "__main__":
    main()
