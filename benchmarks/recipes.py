"""Training recipes side by side on one GPU: which ACT recipe makes a policy that succeeds, from random init.

Run (GPU machine):  python3 benchmarks/recipes.py --out-dir /tmp/sweep --recipes base shift frozen small
                    python3 benchmarks/recipes.py --task insertion --episodes 100 --steps 6000 \
                        --recipes base mid mid-long full --out-dir /tmp/sweep-ins
Smoke (CPU):        .venv/bin/python benchmarks/recipes.py --quick --out-dir /tmp/sweep

1. A bucket server on this machine (the embedded one, under --root) gets a dataset of scripted demos, recorded
   with `record_sim` (sim workers render and encode in parallel): episodes/min, and one demo's time split into
   the expert's mocap pass, the replay with rendering, and the video encode.
2. One training process per recipe, all at once on the one GPU (each streams the dataset from the server into
   its own frame buffer), for --steps steps or --max-train-s seconds, a checkpoint every third of the steps.
3. Every final checkpoint (and the first recipe's earlier ones) evaluated on the same seeds, new ones (from
   1000) and the first recipe also on its own training seeds, in parallel evaluation processes.
Writes `<out-dir>/sweep.json` (and a progress line per event to stderr). Recipes are changes to the
h200 preset's recipe (`robotloop.loop.pipeline.H200_RECIPE`); they differ from the loop's only in that several
share the GPU, so each trains slower.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from train_e2e import machine  # a sibling script: the benchmarks folder is on sys.path

from robotloop.loop.pipeline import H200_RECIPE
from robotloop.train.policy import TINY_ACT

DATASETS = "hf://buckets/bench/recipes/datasets"  # one dataset per task under it
RUNS = "hf://buckets/bench/recipes/models"
# Each recipe is a change to the h200 preset's recipe (bf16 compiled with CUDA graphs, lerobot's default-size ACT,
# temporal ensembling); the sweeps before 2026-12-01 18:00 ran it eager.
RECIPES: dict[str, dict] = {
    "base": {},
    "shift": {"random_shift": 8},
    "frozen": {"backbone_norm": "frozen"},  # lerobot's FrozenBatchNorm2d: the identity from random init
    "small": {"image_size": (120, 160)},
    "mid": {"image_size": (240, 320)},
    "mid-long": {"image_size": (240, 320), "steps_x": 2},  # steps_x: this recipe trains --steps x 2 steps
    "lr3e-4": {"lr": 3e-4, "lr_backbone": 3e-4},
    "full": {"image_size": None},  # the camera's 480x640
    # Compiled with CUDA graphs, as the preset's recipe is now (the names of the first compiled Insertion sweep).
    "mid-c": {"image_size": (240, 320), "compile": True, "cuda_graphs": True},
    "small-c": {"image_size": (120, 160), "compile": True, "cuda_graphs": True},
    "eager": {"compile": False, "cuda_graphs": False},
    "lerobot": {
        "image_size": None,
        "lr": 1e-5,
        "lr_backbone": 1e-5,
        "lr_schedule": "constant",
        "warmup_steps": 0,
        "backbone_norm": "frozen",
        "n_action_steps": 100,
        "temporal_ensemble_coeff": None,
    },
}


def recipe(name: str, quick: bool = False) -> dict:
    """ACTSettings fields of recipe `name`: the preset's recipe with its change (on a tiny ACT for --quick)."""
    quick_base = {"image_size": None, "warmup_steps": 2, "compile": False, "cuda_graphs": False}
    base = {**TINY_ACT, **H200_RECIPE, **quick_base} if quick else H200_RECIPE
    return {**base, **RECIPES[name]}


def dataset_url(task: str) -> str:
    return f"{DATASETS}/{task.replace('_', '-')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("/tmp/recipes-server"), help="bucket server data")
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--task", default="transfer_cube", help="the sim task recorded, trained and evaluated")
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--record-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--image-size", default="480x640")
    ap.add_argument("--recipes", nargs="+", default=["base", "shift", "frozen", "small"])
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-train-s", type=float, default=330.0)
    ap.add_argument("--buffer-gb", type=float, default=21.0, help="each trainer's frame buffer")
    ap.add_argument("--decode-workers", type=int, default=3)
    ap.add_argument("--eval-episodes", type=int, default=50)
    ap.add_argument("--eval-workers", type=int, default=3, help="per evaluation process")
    ap.add_argument(
        "--eval-plan",
        choices=["standard", "checkpoints"],
        default="standard",
        help="standard: every final checkpoint, and the first recipe's earlier ones, own seeds and chunked acting; "
        "checkpoints: every checkpoint of every recipe on new seeds (the earlier ones on --eval-episodes-early), "
        "one worker per 10 episodes: success against steps",
    )
    ap.add_argument("--eval-episodes-early", type=int, default=20, help="episodes for earlier checkpoints")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny images, tiny ACT, a few steps")
    ap.add_argument("--eval-only", action="store_true", help="evaluate the runs of <out-dir>/sweep.json again")
    args = ap.parse_args(argv)
    if args.quick:
        args.episodes, args.image_size, args.steps, args.batch, args.max_train_s = 2, "48x64", 6, 4, 120.0
        args.eval_episodes, args.eval_workers, args.record_workers, args.decode_workers = 2, 1, 2, 1
        args.eval_episodes_early = 1
        args.recipes, args.buffer_gb = args.recipes[:2], 1.0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    from robotloop.storage import BucketClient
    from robotloop.storage.embedded import ensure_embedded_server

    server = ensure_embedded_server(args.root.resolve())
    client = BucketClient(server.endpoint, server.token)
    env = {**os.environ, "ROBOTLOOP_STORAGE__ENDPOINT": server.endpoint, "ROBOTLOOP_STORAGE__TOKEN": server.token}
    if args.eval_only:
        result = json.loads((args.out_dir / "sweep.json").read_text())
    else:
        result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "args": _jsonable(vars(args))}
        result["record"] = record(client, args)
        _save(args, result)
        result["train"] = train_all(args, env)
        _save(args, result)
    result["eval"] = eval_all(args, env, result["train"])
    _save(args, result)
    for row in result["eval"]:
        print(json.dumps(row), flush=True)
    return 0


def record(client, args) -> dict:
    """Record --episodes demos into a fresh dataset; episodes/min, and one demo's time split (in this process)."""
    from robotloop.capture import DatasetRecorder, DatasetSpec
    from robotloop.capture.sim_record import record_sim
    from robotloop.storage import BucketUrl

    size = tuple(int(v) for v in args.image_size.split("x"))
    url = BucketUrl.parse(dataset_url(args.task))
    recorder = DatasetRecorder(
        client, url, DatasetSpec.aloha(size), staging=args.root.resolve().parent / "recipes-stage"
    )
    have = recorder.committed_episodes()
    split = demo_time_split(args.task, size, recorder) if have == 0 else None
    if have >= args.episodes:
        return {"episodes": have, "reused": True}
    report = record_sim(recorder, args.task, args.episodes - have, args.record_workers, size, seed_start=have)
    out = {
        "episodes": len(report.committed),
        "failed_seeds": report.failed_seeds,
        "wall_s": round(report.wall_s, 1),
        "episodes_per_min": round(report.episodes_per_minute, 2),
        "workers": args.record_workers,
        "split_s": split,
        "append_upload_s_median": _median([c.upload_s for c in report.committed]),
    }
    _log("record", out)
    return out


def demo_time_split(task_name: str, size, recorder) -> dict:
    """Seconds of one demo's parts, measured in this process (seed 10_000, not in the dataset)."""
    from robotloop.capture.episode import Episode
    from robotloop.capture.recorder import write_episode
    from robotloop.sim import get_task, record_demo
    from robotloop.sim.scripted import rollout_mocap

    task = get_task(task_name)
    t0 = time.perf_counter()
    rollout_mocap(task, task.sample_objects(10_000), task.episode_length)
    t1 = time.perf_counter()
    demo = record_demo(task, 10_000, image_size=size)  # mocap pass again + replay with rendering
    t2 = time.perf_counter()
    demo_no_render = record_demo(task, 10_000, image_size=None)
    t3 = time.perf_counter()
    episode = Episode({"top": demo.frames}, demo.states, demo.actions, "x", demo.rewards, demo.rewards >= 4)
    written = write_episode(recorder.spec, recorder.url.bucket_id, recorder.staging, episode)
    t4 = time.perf_counter()
    import shutil

    shutil.rmtree(Path(written.root).parent, ignore_errors=True)
    mocap = t1 - t0
    del demo_no_render
    return {
        "mocap": round(mocap, 2),
        "replay_physics": round(t3 - t2 - mocap, 2),
        "render": round((t2 - t1) - (t3 - t2), 2),
        "encode": round(t4 - t3, 2),
    }


def train_all(args, env: dict) -> dict:
    """One training process per recipe, all at once; their progress files and reports."""
    procs = {}
    for name in args.recipes:
        fields = recipe(name, args.quick)
        spec = {
            "name": name,
            "recipe": {k: v for k, v in fields.items() if k != "steps_x"},
            "steps": args.steps * fields.get("steps_x", 1),
            "dataset": dataset_url(args.task),
            "batch": args.batch,
            "max_s": args.max_train_s,
            "buffer_bytes": int(args.buffer_gb * 2**30),
            "decode_workers": args.decode_workers,
            "device": "cpu" if args.quick else "cuda",
            "run": f"{RUNS}/{name}-{time.strftime('%H%M%S')}",
            "out": str(args.out_dir / f"train-{name}.json"),
        }
        procs[name] = (spec, _spawn("train", spec, args.out_dir / f"train-{name}.log", env))
    out = {}
    for name, (spec, proc) in procs.items():
        code = proc.wait()
        path = Path(spec["out"])
        out[name] = json.loads(path.read_text()) if path.exists() else {"error": f"exit {code}, see train-{name}.log"}
        out[name]["spec"] = spec
        _log("trained", {"recipe": name, **{k: v for k, v in out[name].items() if k not in ("losses", "spec")}})
    return out


def train_worker(spec: dict) -> None:
    from robotloop.config import load_settings
    from robotloop.storage import BucketUrl, connect
    from robotloop.train.data import DataSettings
    from robotloop.train.policy import ACTSettings
    from robotloop.train.trainer import TrainSettings, train

    fields = {k: tuple(v) if k == "image_size" and v else v for k, v in spec["recipe"].items()}
    act = (ACTSettings.fast if spec["device"].startswith("cuda") else ACTSettings)(**fields)
    every = max(1, spec["steps"] // 3)
    settings = TrainSettings(
        steps=spec["steps"],
        batch_size=spec["batch"],
        log_every=max(1, min(100, every)),
        checkpoint_every=every,
        device=spec["device"],
    )
    data = DataSettings(decode_workers=spec["decode_workers"], buffer_bytes=spec["buffer_bytes"], refresh_every_s=0)
    progress: list[dict] = []
    t0 = time.perf_counter()
    report = train(
        connect(load_settings()),
        [BucketUrl.parse(spec["dataset"])],
        BucketUrl.parse(spec["run"]),
        settings,
        act,
        data,
        lambda p: progress.append(
            {
                "step": p.step,
                "loss": p.loss,
                "elapsed_s": round(p.elapsed_s, 1),
                "samples_per_s": round(p.samples_per_s, 1),
            }
        ),
        should_stop=lambda: time.perf_counter() - t0 > spec["max_s"],
    )
    steady = [p for p in progress if p["step"] >= min(500, settings.steps // 2)] or progress
    a, b = steady[0], steady[-1]
    rate = (
        (b["step"] - a["step"]) * spec["batch"] / (b["elapsed_s"] - a["elapsed_s"])
        if b["elapsed_s"] > a["elapsed_s"]
        else None
    )
    Path(spec["out"]).write_text(
        json.dumps(
            {
                "steps": report.steps,
                "wall_s": round(report.wall_s, 1),
                "samples_per_s": round(report.samples_per_s, 1),
                "steady_samples_per_s": rate and round(rate, 1),
                "data_wait_share": round(report.data_wait_share, 4),
                "final_loss": report.final_loss,
                "mean_last_losses": _mean([v for _, v in report.losses[-100:]]),
                "checkpoints": report.checkpoints,
                "progress": progress,
            }
        )
    )


def eval_all(args, env: dict, trained: dict) -> list[dict]:
    """Evaluate every final checkpoint on new seeds (the first recipe also at its earlier checkpoints, on its own
    training seeds, and acting in chunks without ensembling), all in parallel; one row per evaluation."""
    plan = checkpoint_jobs if args.eval_plan == "checkpoints" else standard_jobs
    return run_evals(args, env, plan(args, trained))


def checkpoint_jobs(args, trained: dict) -> list[dict]:
    """Every checkpoint of every recipe on new seeds: success against steps."""
    jobs = []
    for name, run in trained.items():
        for i, ckpt in enumerate(run.get("checkpoints") or []):
            last = i == len(run["checkpoints"]) - 1
            episodes = args.eval_episodes if last else args.eval_episodes_early
            jobs.append(
                {"recipe": name, "checkpoint": ckpt, "seed": 1000, "episodes": episodes, "workers": -(-episodes // 10)}
            )
    return jobs


def standard_jobs(args, trained: dict) -> list[dict]:
    jobs = []
    first = args.recipes[0]
    for name, run in trained.items():
        if not run.get("checkpoints"):
            continue
        jobs.append({"recipe": name, "checkpoint": run["checkpoints"][-1], "seed": 1000})
        if name == first:
            jobs += [{"recipe": name, "checkpoint": c, "seed": 1000} for c in run["checkpoints"][:-1]]
            jobs.append({"recipe": name, "checkpoint": run["checkpoints"][-1], "seed": 0, "episodes": 10})
            jobs.append(
                {
                    "recipe": name,
                    "checkpoint": run["checkpoints"][-1],
                    "seed": 1000,
                    "inference": {"temporal_ensemble_coeff": None, "n_action_steps": 25},
                }
            )
    return jobs


def run_evals(args, env: dict, jobs: list[dict]) -> list[dict]:
    """All evaluation `jobs` at once, one process each; one row per evaluation."""
    procs = []
    for i, job in enumerate(jobs):
        job = {
            "episodes": args.eval_episodes,
            "workers": args.eval_workers,
            "image_size": args.image_size,
            "task": args.task,
            "device": "cpu" if args.quick else "cuda",
            "out": str(args.out_dir / f"eval-{i}.json"),
            "cache": str(args.out_dir / "policies"),
            **job,
        }
        procs.append((job, _spawn("eval", job, args.out_dir / f"eval-{i}.log", env)))
    rows = []
    for job, proc in procs:
        code = proc.wait()
        path = Path(job["out"])
        row = {k: job[k] for k in ("recipe", "checkpoint", "seed", "episodes")} | {"inference": job.get("inference")}
        if not path.exists():
            rows.append({**row, "error": f"exit {code}, see {Path(job['out']).with_suffix('.log').name}"})
            continue
        summary = json.loads(path.read_text())["summary"]
        rows.append({**row, **summary})
        _log("evaluated", rows[-1])
    return rows


def eval_worker(job: dict) -> None:
    from robotloop.config import load_settings
    from robotloop.deploy.evaluate import evaluate
    from robotloop.deploy.resolve import resolve_policy
    from robotloop.storage import connect

    settings = load_settings()
    model = resolve_policy(job["checkpoint"], lambda: connect(settings), Path(job["cache"]))
    size = tuple(int(v) for v in job["image_size"].split("x"))
    report = evaluate(
        model,
        job["task"],
        job["episodes"],
        job["workers"],
        seed=job["seed"],
        image_size=size,
        device=job["device"],
        inference=job.get("inference"),
    )
    report.save(Path(job["out"]))


def _spawn(kind: str, spec: dict, log: Path, env: dict) -> subprocess.Popen:
    """This script as a `--<kind>-worker` process for `spec`, its output in `log`."""
    with open(log, "w") as out:
        cmd = [sys.executable, __file__, f"--{kind}-worker", json.dumps(spec)]
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def _save(args, result: dict) -> None:
    (args.out_dir / "sweep.json").write_text(json.dumps(result, indent=1, default=str))


def _log(event: str, data: dict) -> None:
    print(
        json.dumps({"event": event, "t": time.strftime("%H:%M:%S"), **data}, default=str), file=sys.stderr, flush=True
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def _jsonable(values: dict) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--train-worker":
        train_worker(json.loads(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--eval-worker":
        eval_worker(json.loads(sys.argv[2]))
    else:
        raise SystemExit(main())
