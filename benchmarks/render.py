"""Render cost of the sim's `top` camera: MuJoCo's default 4096 shadow maps, `shadow_map_size` (the default now) and
no shadows (`NO_SHADOWS`), side by side in one run, with how many pixels each changes against the default (the same
scene state, frame for frame).

    MUJOCO_GL=egl .venv/bin/python benchmarks/render.py --sizes 48x64 96x128 480x640 --frames 40
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from robotloop.sim import AlohaSim
from robotloop.sim.constants import NO_SHADOWS, shadow_map_size
from robotloop.sim.env import TopCamera


def measure(size: tuple[int, int], frames: int) -> dict:
    sim = AlohaSim("transfer_cube", image_size=None)
    sim.reset(seed=3)
    default = shadow_map_size(*size)
    cameras = {side: TopCamera(sim.model, size, shadow_map=side) for side in dict.fromkeys((4096, default, NO_SHADOWS))}
    times: dict[int, list[float]] = {side: [] for side in cameras}
    diffs: dict[int, list[np.ndarray]] = {side: [] for side in cameras if side != default}
    for _ in range(frames):
        sim.step(np.zeros(14))
        images = {}
        for side, camera in cameras.items():  # interleaved: the same moment of the machine's load for each
            t0 = time.perf_counter()
            images[side] = camera(sim.data).astype(np.int16)
            times[side].append(time.perf_counter() - t0)
        for side in diffs:
            diffs[side].append(np.abs(images[side] - images[default]).max(-1))
    for camera in cameras.values():
        camera.close()
    sim.close()
    ms = {side: 1000 * statistics.median(t[3:]) for side, t in times.items()}
    out = {
        "size": f"{size[0]}x{size[1]}",
        "shadowsize": default,
        "ms_4096": round(ms[4096], 2),
        "ms_chosen": round(ms[default], 2),
        "ms_no_shadows": round(ms[NO_SHADOWS], 2),
    }
    out["speedup"] = round(out["ms_4096"] / out["ms_chosen"], 2)
    out["no_shadows_speedup"] = round(out["ms_chosen"] / out["ms_no_shadows"], 2)
    for side, frames_diff in diffs.items():  # against the default, per side: "4096" and "none"
        d = np.stack(frames_diff)
        name = "none" if side == NO_SHADOWS else str(side)
        out |= {
            f"mean_abs_diff_{name}": round(float(d.mean()), 3),
            f"pixels_over_8_pct_{name}": round(float((d > 8).mean() * 100), 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["48x64", "96x128", "480x640"])
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    rows = [measure(tuple(map(int, s.split("x"))), args.frames) for s in args.sizes]
    for r in rows:
        print(json.dumps(r))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": platform.node(), "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
