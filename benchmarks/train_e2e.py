"""End-to-end training from a bucket server: robotloop's streaming trainer vs what users run today.

Run (GPU machine):  python3 benchmarks/train_e2e.py --episodes 12 --batch 8 64 --steps 500 --out e2e.json
DDP (two GPUs):     python3 benchmarks/train_e2e.py --only robotloop --batch 64 --nproc 1 2 --out ddp_h200x2.json
Two nodes (CPU):    .venv/bin/python benchmarks/train_e2e.py --only robotloop --device cpu --tiny --image-size 48x64 \
                        --episodes 6 --batch 4 --nproc 2 --nodes --steps 400 --skip 50 --decode-workers 1
Smoke (CPU):        .venv/bin/python benchmarks/train_e2e.py --quick

1. A bucket server on this machine (the embedded one, under --root) holds a LeRobot v3 dataset of scripted
   TransferCube demos (one camera at --image-size), recorded with `record_sim` unless already there.
2. robotloop: `python -m robotloop.train` (torchrun with --nproc > 1) streams the dataset from the server:
   decode workers, frame buffer on the GPU, bf16 + compile + CUDA graphs. Its progress file gives the time
   and data wait at each log point: the steady rate is taken between the first log point after --skip
   steps and the last one (compile and the first decoded episodes excluded, and reported apart).
3. lerobot (what `lerobot-train` runs): `StreamingLeRobotDataset(repo_type="bucket")` against the same server,
   a DataLoader with lerobot-train's settings (4 spawn workers, prefetch 4, pinned memory), lerobot's
   preprocessor and its fp32 eager ACT update (clip 10, AdamW). Data wait = time blocked in `next(loader)`
   plus the preprocessor, as lerobot-train's own `dataloading_s` counts it. A run stops after --lerobot-max-s
   seconds: its rate is then measured over the steps it did, and the table says so.
4. With --nproc N > 1 (DDP, N GPUs at --batch B each): also one GPU at batch N x B, the same global batch, as
   the loss reference. Each robotloop run's final checkpoint gives its loss curve (the per-step losses it keeps,
   as means over 20 windows); an N-GPU run's checkpoint is loaded with lerobot's `ACTPolicy.from_pretrained`.
   `ddp` in the output: speed-up over one GPU at batch B (target >= 1.8x on 2 GPUs), and whether the loss
   curve follows the reference's (every window after --skip within 10%).
5. With --nodes, an N-process run is N torchrun launchers of one process each meeting at a c10d rendezvous on
   127.0.0.1: what `torchrun --nnodes N` does across machines (each rank its own caches, the global rank picks
   the checkpoint writer), here on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATASET = "hf://buckets/bench/aloha-transfer-cube"  # at a bucket's root: lerobot's bucket reader needs that
# NVLink multicast stays off on the lent GPU machines (a program using it can take a shared host's GPUs out of
# service): the image sets these; a child started with its own environment keeps them.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
DDP_TARGET = 1.8  # 2 GPUs against one, samples/s
LOSS_FOLLOW = 0.10  # each loss window of the N-GPU run within this of the same-global-batch reference
LOSS_WINDOWS = 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(".bench/e2e-server"), help="bucket server data (kept)")
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--record-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--image-size", default="480x640")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--skip", type=int, default=50, help="steps left out of the steady rate")
    ap.add_argument("--nproc", type=int, nargs="+", default=[1], help="GPUs per robotloop run (torchrun when > 1)")
    ap.add_argument("--decode-workers", type=int, default=8)
    ap.add_argument("--only", choices=["robotloop", "lerobot"], default=None)
    ap.add_argument("--lerobot-max-s", type=float, default=150.0)
    ap.add_argument("--nodes", action="store_true", help="--nproc N as N one-process nodes (c10d rendezvous)")
    ap.add_argument("--device", default=None, help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="the tiny ACT (what the suite trains), logged every step")
    ap.add_argument("--seed", type=int, default=None, help="the training runs' seed (default: robotloop train's)")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny images, tiny ACT, few steps")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.episodes, args.image_size, args.batch, args.steps, args.skip = 2, "48x64", [4], 6, 2
        args.decode_workers, args.lerobot_max_s, args.record_workers = 1, 60.0, 2
        args.device, args.tiny = "cpu", True
    args.device = args.device or "cuda"

    from robotloop.storage import BucketClient
    from robotloop.storage.embedded import ensure_embedded_server

    server = ensure_embedded_server(args.root.resolve())
    client = BucketClient(server.endpoint, server.token)
    record_s = ensure_dataset(client, args)
    env = {
        **os.environ,
        "ROBOTLOOP_STORAGE__ENDPOINT": server.endpoint,
        "ROBOTLOOP_STORAGE__TOKEN": server.token,
        "HF_ENDPOINT": server.endpoint,
        "HF_TOKEN": server.token,
        "HF_HUB_OFFLINE": "0",
        **MULTICAST_OFF,
    }
    rows = []
    for batch in args.batch:
        if args.only != "lerobot":
            for nproc in args.nproc:
                rows.append(run_robotloop(args, env, client, batch, nproc))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            for nproc in sorted({n for n in args.nproc if n > 1}):  # the same global batch on one GPU
                rows.append(run_robotloop(args, env, client, batch * nproc, 1))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if args.only != "robotloop":
            rows.append(run_lerobot(args, env, batch))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "dataset": DATASET,
        "image": args.image_size,
        "record_s": record_s,
        "steps": args.steps,
        "skip": args.skip,
        "seed": args.seed,
        "device": args.device,
        "launch": "nodes (c10d rendezvous, one process each)" if args.nodes else "torchrun --standalone",
        "rows": rows,
        "ddp": ddp_verdicts(rows, args.skip),
    }
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if any("error" in r for r in rows) else 0


def machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name()}, {os.cpu_count()} cores"
    except ImportError:
        pass
    return f"{platform.node()}, {os.cpu_count()} cores, CPU"


def ensure_dataset(client, args) -> float | None:
    """Record scripted demos into the server until the dataset holds --episodes; seconds spent (None: none)."""
    from robotloop.capture import DatasetRecorder, DatasetSpec
    from robotloop.capture.sim_record import record_sim
    from robotloop.storage import BucketUrl

    size = tuple(int(v) for v in args.image_size.split("x"))
    url = BucketUrl.parse(DATASET)
    client.create_bucket(url)
    recorder = DatasetRecorder(client, url, DatasetSpec.aloha(size), staging=args.root.resolve().parent / "e2e-stage")
    have = recorder.committed_episodes()
    if have >= args.episodes:
        return None
    report = record_sim(
        recorder, "transfer_cube", args.episodes - have, args.record_workers, size, seed_start=1000 + have
    )
    print(f"recorded {len(report.committed)} episodes in {report.wall_s:.0f} s", file=sys.stderr, flush=True)
    return round(report.wall_s, 1)


def ddp_verdicts(rows: list[dict], skip: int) -> dict:
    """Per N-GPU run: speed-up over one GPU at the same batch per GPU, and its loss curve against one GPU at the
    same global batch (relative differences of the window means after `skip` steps)."""
    one = {r["batch_per_gpu"]: r for r in rows if r.get("gpus") == 1 and r["run"].startswith("robotloop")}
    out = {}
    for r in rows:
        if r.get("gpus", 1) == 1 or "steady_samples_per_s" not in r:
            continue
        verdict: dict = {}
        if (base := one.get(r["batch_per_gpu"])) and "steady_samples_per_s" in base:
            x = r["steady_samples_per_s"] / base["steady_samples_per_s"]
            verdict |= {"speedup": round(x, 3), f"meets_{DDP_TARGET}x": x >= DDP_TARGET if r["gpus"] == 2 else None}
        ref = one.get(r["batch_per_gpu"] * r["gpus"])
        if ref and r.get("loss_curve") and ref.get("loss_curve"):
            theirs = dict(map(tuple, ref["loss_curve"]))
            diffs = [abs(v - theirs[s]) / theirs[s] for s, v in r["loss_curve"] if s > skip and theirs.get(s)]
            if diffs:
                verdict |= {
                    "loss_reference": ref["run"],
                    "loss_final_rel_diff": round(diffs[-1], 4),
                    "loss_max_rel_diff": round(max(diffs), 4),
                    "loss_follows": max(diffs) <= LOSS_FOLLOW,
                }
        verdict["from_pretrained"] = r.get("from_pretrained")
        out[r["run"]] = verdict
    return out


def checkpoint_facts(client, url: str, load: bool) -> dict:
    """The final checkpoint's loss curve (window means of its per-step losses) and, with `load`, whether lerobot's
    own ACTPolicy.from_pretrained loads it. Fetches only those parts (not the optimizer state)."""
    from robotloop.storage import BucketUrl

    checkpoint = BucketUrl.parse(url)
    with tempfile.TemporaryDirectory() as tmp:
        saved = client.download(checkpoint / "training_state" / "training_step.json", tmp)
        losses = json.loads(saved.read_text())["losses"]
        width = max(1, len(losses) // LOSS_WINDOWS)
        curve = [
            [losses[i + width - 1][0], round(sum(v for _, v in losses[i : i + width]) / width, 5)]
            for i in range(0, len(losses) - width + 1, width)
        ]
        facts: dict = {"loss_curve": curve}
        if load:
            try:
                from lerobot.policies.act.modeling_act import ACTPolicy

                client.fetch(checkpoint / "pretrained_model", Path(tmp) / "pretrained_model")
                policy = ACTPolicy.from_pretrained(Path(tmp) / "pretrained_model")
                facts["from_pretrained"] = {"ok": True, "parameters": sum(p.numel() for p in policy.parameters())}
            except Exception as e:  # noqa: BLE001 - reported in the table, not raised: the other runs still count
                facts["from_pretrained"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
    return facts


def launchers(args, nproc: int, tmp: str) -> list[tuple[list[str], dict]]:
    """The commands (and extra environment) that start one run of `nproc` processes: one plain process, one
    `torchrun --standalone`, or with --nodes one torchrun per node, meeting at a c10d rendezvous."""
    run = [sys.executable, "-m", "torch.distributed.run"]
    if nproc == 1:
        return [([sys.executable, "-m", "robotloop.train"], {})]
    if not args.nodes:
        return [([*run, "--standalone", "--nproc-per-node", str(nproc), "-m", "robotloop.train"], {})]
    from robotloop.service_process import free_port

    meet = ["--nnodes", str(nproc), "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "bench"]
    meet += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    # each node its own caches and staging, as on separate machines
    return [([*run, *meet, "-m", "robotloop.train"], {"XDG_CACHE_HOME": f"{tmp}/node{i}"}) for i in range(nproc)]


def run_robotloop(args, env: dict, client, batch: int, nproc: int) -> dict:
    name = f"robotloop-b{batch}-{'n' if args.nodes and nproc > 1 else 'g'}{nproc}"
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress.jsonl"
        train = [
            "--dataset",
            DATASET,
            "--output",
            f"hf://buckets/bench/e2e-runs/models/{name}-{time.time_ns()}",
            "--steps",
            str(args.steps),
            "--batch-size",
            str(batch),
            "--device",
            args.device,
            "--log-every",
            "25",
            "--checkpoint-every",
            str(10 * args.steps),
            "--decode-workers",
            str(args.decode_workers),
            "--progress-file",
            str(progress),
        ] + (["--tiny", "--log-every", "1"] if args.tiny else [])
        train += ["--seed", str(args.seed)] if args.seed is not None else []
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen([*cmd, *train], env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for cmd, extra in launchers(args, nproc, tmp)
        ]
        said = [p.communicate()[0].decode(errors="replace") for p in procs]
        wall = time.perf_counter() - t0
        records = [json.loads(line) for line in progress.read_text().splitlines()] if progress.exists() else []
    reports = [r for r in records if r["event"] == "progress"]
    done = next((r for r in records if r["event"] == "done"), None)
    if any(p.returncode != 0 for p in procs) or done is None or not reports:
        return {"run": name, "error": "\n".join(s[-3000:] for s in said), "progress": reports}
    steady = [r for r in reports if r["step"] >= args.skip] or reports
    a, b = steady[0], steady[-1]
    span = b["elapsed_s"] - a["elapsed_s"]
    rate = (b["step"] - a["step"]) * batch * nproc / span if span > 0 else float("nan")
    step_s = batch * nproc / rate
    return {
        "run": name,
        "batch_per_gpu": batch,
        "gpus": nproc,
        "steps": done["steps"],
        "steady_samples_per_s": round(rate, 1),
        "steady_window": [a["step"], b["step"]],
        "steady_data_wait_share": round((b["data_wait_s"] - a["data_wait_s"]) / span, 4) if span > 0 else None,
        # the data path's cost on the GPU: blocked on an empty buffer + GPU time of the sampler's gathers
        "steady_data_gpu_share": round((b["data_gpu_s"] - a["data_gpu_s"]) / span, 4) if span > 0 else None,
        "first_steps_s": round(a["elapsed_s"] - a["step"] * step_s, 1),  # compile + waiting for the first episode
        "train_loop_s": round(done["wall_s"], 1),
        "process_wall_s": round(wall, 1),
        "steady_500_steps_s": round(500 * step_s, 2),
        "final_loss": done["final_loss"],
        **(checkpoint_facts(client, done["checkpoints"][-1], load=nproc > 1) if done.get("checkpoints") else {}),
    }


def run_lerobot(args, env: dict, batch: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--lerobot-worker",
        json.dumps(
            {
                "batch": batch,
                "steps": args.steps,
                "max_s": args.lerobot_max_s,
                "skip": min(args.skip, 20),
                "quick": args.quick,
            }
        ),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**env, "HF_HOME": f"{tmp}/hf", "HF_LEROBOT_HOME": f"{tmp}/lerobot"}
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        return {"run": f"lerobot-b{batch}", "error": (run.stdout + run.stderr)[-3000:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def lerobot_worker(spec: dict) -> None:
    """lerobot-train's data path and update, timed. Runs in its own process: HF_ENDPOINT is read at import."""
    import torch
    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.utils.feature_utils import dataset_to_policy_features

    device = torch.device("cpu" if spec["quick"] else "cuda")
    torch.backends.cudnn.benchmark = True  # lerobot-train's CUDA settings
    torch.backends.cuda.matmul.allow_tf32 = True
    repo_id = DATASET.removeprefix("hf://buckets/")
    probe = StreamingLeRobotDataset(repo_id, repo_type="bucket")
    chunk = 5 if spec["quick"] else 100
    features = dataset_to_policy_features(probe.meta.features)
    from robotloop.train.policy import TINY_ACT

    # robotloop's --tiny architecture (this side sets its own chunk), so both sides train the same network
    tiny = {k: v for k, v in TINY_ACT.items() if k not in ("chunk_size", "n_action_steps")} if spec["quick"] else {}
    cfg = ACTConfig(
        device=device.type,
        chunk_size=chunk,
        n_action_steps=chunk,
        pretrained_backbone_weights=None,
        input_features={
            k: f for k, f in features.items() if k != "action" and "reward" not in k and "success" not in k
        },
        output_features={"action": features["action"]},
        **tiny,
    )
    delta = {"action": [i / probe.meta.fps for i in range(chunk)]}  # what resolve_delta_timestamps gives ACT
    dataset = StreamingLeRobotDataset(
        repo_id, repo_type="bucket", delta_timestamps=delta, max_num_shards=4, return_uint8=True
    )
    policy = ACTPolicy(cfg).to(device)
    pre, _ = make_pre_post_processors(cfg, dataset_stats=probe.meta.stats)
    opt = cfg.get_optimizer_preset().build(policy.get_optim_params())
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=spec["batch"],
        num_workers=4,
        pin_memory=device.type == "cuda",
        drop_last=False,
        prefetch_factor=4,
        persistent_workers=True,
        multiprocessing_context="spawn",
    )
    it, cams = iter(loader), probe.meta.camera_keys
    marks, wait, t0 = [], 0.0, time.perf_counter()
    for step in range(spec["steps"]):
        start = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # one pass over a small dataset: start the next, as lerobot-train's cycle does
            it = iter(loader)
            batch = next(it)
        for key in cams:
            batch[key] = batch[key].to(dtype=torch.float32) / 255.0
        batch = pre(batch)
        wait += time.perf_counter() - start
        policy.train()
        loss, _ = policy.forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.get_optimizer_preset().grad_clip_norm)
        opt.step()
        opt.zero_grad()
        loss_value = loss.item()  # lerobot-train logs it every step
        marks.append((step + 1, time.perf_counter() - t0, wait))
        if time.perf_counter() - t0 > spec["max_s"]:
            break
    skip = min(spec["skip"], len(marks) // 2)
    (s0, e0, w0), (s1, e1, w1) = marks[max(skip - 1, 0)], marks[-1]
    rate = (s1 - s0) * spec["batch"] / (e1 - e0) if e1 > e0 else float("nan")
    print(
        json.dumps(
            {
                "run": f"lerobot-b{spec['batch']}",
                "batch_per_gpu": spec["batch"],
                "gpus": 1,
                "steps": s1,
                "stopped_at_max_s": s1 < spec["steps"],
                "steady_samples_per_s": round(rate, 1),
                "steady_window": [s0, s1],
                "steady_data_wait_share": round((w1 - w0) / (e1 - e0), 4) if e1 > e0 else None,
                "first_steps_s": round(e0 - s0 * spec["batch"] / rate, 1),
                "train_loop_s": round(e1, 1),
                "steady_500_steps_s": round(500 * spec["batch"] / rate, 2),
                "final_loss": loss_value,
            }
        ),
        flush=True,
    )
    os._exit(0)  # persistent DataLoader workers: do not wait for their slow teardown


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--lerobot-worker":
        lerobot_worker(json.loads(sys.argv[2]))
    else:
        raise SystemExit(main())
