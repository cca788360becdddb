"""Render cost of the sim's `top` camera: MuJoCo's default 4096 shadow maps against `shadow_map_size`, side by
side in one run, with how many pixels the smaller maps change (the same scene state, frame for frame).

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
from robotloop.sim.env import TopCamera, shadow_map_size


def _rebuilt(sim: AlohaSim, size: tuple[int, int]) -> TopCamera:
    import mujoco

    camera = TopCamera.__new__(TopCamera)
    camera.renderer, camera.camera = mujoco.Renderer(sim.model, height=size[0], width=size[1]), "top"
    return camera


def measure(size: tuple[int, int], frames: int) -> dict:
    sim = AlohaSim("transfer_cube", image_size=size)
    sim.reset(seed=3)
    cameras = {}
    for side in (4096, shadow_map_size(*size)):
        sim.model.vis.quality.shadowsize = side
        cameras[side] = _rebuilt(sim, size)
    times: dict[int, list[float]] = {side: [] for side in cameras}
    diffs = []
    for _ in range(frames):
        sim.step(np.zeros(14))
        images = {}
        for side, camera in cameras.items():  # interleaved: the same moment of the machine's load for both
            t0 = time.perf_counter()
            images[side] = camera(sim.data).astype(np.int16)
            times[side].append(time.perf_counter() - t0)
        if len(images) == 2:
            a, b = images.values()
            diffs.append(np.abs(a - b).max(-1))
    for camera in cameras.values():
        camera.close()
    sim.close()
    ms = {side: 1000 * statistics.median(t[3:]) for side, t in times.items()}
    out = {
        "size": f"{size[0]}x{size[1]}",
        "shadowsize": shadow_map_size(*size),
        "ms_4096": round(ms[4096], 2),
        "ms_chosen": round(ms[shadow_map_size(*size)], 2),
    }
    out["speedup"] = round(out["ms_4096"] / out["ms_chosen"], 2)
    if diffs:
        d = np.stack(diffs)
        out |= {"mean_abs_diff": round(float(d.mean()), 3), "pixels_over_8_pct": round(float((d > 8).mean() * 100), 2)}
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
