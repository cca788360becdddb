"""One renderer per worker against one per sim: what evaluation's lockstep workers pay to film their sims.

Each of `--workers` processes holds `--sims` TransferCube sims, as `SimBatch` slices a 200-episode evaluation on 16
cores (15 workers, ~13 sims each), and steps them all `--steps` times with a fixed action, filming each after its
step. Mode `own`: every sim has its renderer (its own EGL context), as before; `shared`: the sims of a process film
with the first one's. Both modes run one after the other in one command, on the same scenes, and the frames of the
two are checked equal. Then `--shadows` sizes (0: shadows off) with the shared renderer, each against the default
size's frames: the share of pixels more than 8 levels off.

    MUJOCO_GL=egl python benchmarks/render_share.py --workers 15 --sims 13 --steps 100 --size 120x160 \
        --shadows 2048 1024 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import platform
import statistics
import time

import numpy as np


def _work(job: tuple[str, int | None, int, int, tuple[int, int], int]) -> dict:
    mode, shadow, sims, steps, size, worker = job
    from robotloop.sim import AlohaSim

    first = AlohaSim("transfer_cube", image_size=size, shadow_map=shadow)
    camera = first.camera if mode == "shared" else None
    group = [first] + [AlohaSim("transfer_cube", image_size=size, camera=camera) for _ in range(sims - 1)]
    for j, sim in enumerate(group):
        sim.reset(seed=1000 + worker * sims + j)
    action = group[0].state()  # hold the start pose: the scene still changes as the objects settle
    for sim in group:  # the resets' first frames (context warm-up) are not counted
        sim.camera.render_s = 0.0
    digest = hashlib.sha256()
    start = time.perf_counter()
    for _ in range(steps):
        for sim in group:
            frame = sim.step(action)[0]["pixels"]["top"]
        digest.update(frame.tobytes())
    wall = time.perf_counter() - start
    cameras = {id(sim.camera): sim.camera for sim in group}.values()
    render = sum(c.render_s for c in cameras)
    for sim in group[::-1]:
        sim.close()
    return {"wall_s": wall, "render_s": render, "digest": digest.hexdigest(), "last": frame}


def run(mode: str, shadow: int | None, args: argparse.Namespace, size: tuple[int, int]) -> dict:
    jobs = [(mode, shadow, args.sims, args.steps, size, w) for w in range(args.workers)]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        start = time.perf_counter()
        parts = pool.map(_work, jobs)
        wall = time.perf_counter() - start
    frames = args.workers * args.sims * args.steps
    render = [p["render_s"] for p in parts]
    return {
        "mode": mode,
        "shadow_map": "default" if shadow is None else shadow or "off",
        "wall_s": round(wall, 2),
        "frames_per_s": round(frames / statistics.mean(p["wall_s"] for p in parts), 1),  # all workers together
        "render_ms_per_frame_median_worker": round(statistics.median(render) / (args.sims * args.steps) * 1e3, 3),
        "render_share_of_step": round(sum(render) / sum(p["wall_s"] for p in parts), 3),
        "digests": [p["digest"] for p in parts],
        "last_frames": np.stack([p["last"] for p in parts]).astype(np.int16),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sims", type=int, default=13)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", default="120x160")
    parser.add_argument("--shadows", type=int, nargs="*", default=[], help="shadow-map sides to try (0: off)")
    parser.add_argument("--out", default=None, help="write the results as JSON here too")
    args = parser.parse_args()
    size = tuple(int(x) for x in args.size.split("x"))
    results = [run("own", None, args, size), run("shared", None, args, size)]
    results += [run("shared", shadow, args, size) for shadow in args.shadows]
    reference = results[0]["last_frames"]
    for r in results:
        r["pixels_off_by_more_than_8"] = round(float((np.abs(r.pop("last_frames") - reference) > 8).mean()), 5)
    same = results[0].pop("digests") == results[1].pop("digests")
    for r in results:
        r.pop("digests", None)
    speedup = results[0]["render_ms_per_frame_median_worker"] / results[1]["render_ms_per_frame_median_worker"]
    report = {
        "machine": platform.node(),
        "args": vars(args),
        "results": results,
        "frames_equal": same,
        "render_speedup_shared": round(speedup, 2),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if not same:
        raise SystemExit("the shared renderer's frames differ from the sims' own renderers'")


if __name__ == "__main__":
    main()
