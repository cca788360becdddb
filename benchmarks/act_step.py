"""ACT training-step throughput: lerobot's own fp32 eager step vs robotloop's step, speed options stacked.

Run (GPU):  .venv/bin/python benchmarks/act_step.py [--batch 8 64] [--steps 50] [--warmup 10] [--out act_step.json]
Smoke (CPU, tiny ACT, no compile):  .venv/bin/python benchmarks/act_step.py --quick

Default ACT (lerobot 0.6.1 defaults, 51.6M params, ResNet18 random init), one 480x640 camera, 14-dim
state/action, chunk 100. Batches are synthetic and already on the device, so this measures the model step
alone: forward + backward + grad clip + AdamW.

Configurations (each adds one option to the previous robotloop one):
  lerobot_fp32_eager   lerobot-train's step: float/255, its preprocessor, ACTPolicy.forward (with its .item()
                       calls), backward, clip 10, AdamW (non-fused, lerobot's preset), loss.item()
  fp32                 robotloop's step: same math, no host syncs, fused AdamW
  +bf16, +fused_attention, +channels_last, +compile (inductor default mode), +cuda_graphs (reduce-overhead)
  +autotune            (only with --autotune) max-autotune: inductor's GEMM/conv template search

Per configuration: the first step is timed alone (includes torch.compile's compile time), then `warmup`
steps, then `steps` timed steps. On CUDA each step is bracketed by CUDA events and the host synchronizes
once after the timed window, so the step loop runs exactly as in training. samples/s = batch / median step.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors

from robotloop.train.policy import TINY_ACT, ACTSettings, build_policy, camera_stats_for, make_act_config

CAM = "observation.images.top"
STATE_DIM = ACTION_DIM = 14  # ALOHA bimanual


def features(h: int, w: int) -> dict:
    return {
        CAM: {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [STATE_DIM], "names": None},
        "action": {"dtype": "float32", "shape": [ACTION_DIM], "names": None},
    }


def stats() -> dict:
    vec = lambda v, n: [v] * n  # noqa: E731
    return {
        k: {"mean": vec(0.1, n), "std": vec(0.5, n), "min": vec(-1.0, n), "max": vec(1.0, n)}
        for k, n in (("observation.state", STATE_DIM), ("action", ACTION_DIM))
    }


def make_batch(b: int, chunk: int, h: int, w: int, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(0)
    pad = torch.zeros(b, chunk, dtype=torch.bool)
    pad[: b // 4, chunk * 3 // 4 :] = True  # some chunks run past their episode's end
    batch = {
        CAM: torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=g),
        "observation.state": torch.randn(b, STATE_DIM, generator=g),
        "action": torch.randn(b, chunk, ACTION_DIM, generator=g),
        "action_is_pad": pad,
    }
    return {k: v.to(device) for k, v in batch.items()}


def lerobot_step_fn(settings: ACTSettings, h: int, w: int, device: torch.device) -> Callable[[dict], Any]:
    """lerobot-train's update_policy, minus accelerate and logging (fp32, eager)."""
    cfg = make_act_config(features(h, w), settings, device)
    policy = ACTPolicy(cfg).to(device)
    pre, _ = make_pre_post_processors(cfg, dataset_stats=camera_stats_for(stats(), cfg, True))
    opt = cfg.get_optimizer_preset().build(policy.get_optim_params())
    clip = cfg.get_optimizer_preset().grad_clip_norm

    def step(batch: dict) -> float:
        policy.train()
        b = dict(batch)
        b[CAM] = b[CAM].to(dtype=torch.float32) / 255.0
        loss, _ = policy.forward(pre(b))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), clip)
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def robotloop_step_fn(settings: ACTSettings, h: int, w: int, device: torch.device) -> Callable[[dict], Any]:
    tp = build_policy(features(h, w), stats(), settings, device)
    return tp.train_step


def configs(autotune: bool, with_compile: bool, drop: tuple[str, ...] = ()) -> list[tuple[str, ACTSettings | None]]:
    """The stacked configurations; `drop` leaves those options out of every stack (an ablation)."""
    out: list[tuple[str, ACTSettings | None]] = [("lerobot_fp32_eager", None)]
    s = ACTSettings()
    out.append(("fp32", s))
    for name, change in (
        ("+bf16", dict(precision="bf16")),
        ("+fused_attention", dict(fused_attention=True)),
        ("+channels_last", dict(channels_last=True)),
        ("+compile", dict(compile=True)),
        ("+cuda_graphs", dict(cuda_graphs=True)),
        ("+autotune", dict(autotune=True)),
    ):
        if name in ("+compile", "+cuda_graphs") and not with_compile:
            continue
        if name == "+autotune" and not (autotune and with_compile):
            continue
        if name[1:] in drop:
            continue
        s = replace(s, **change)
        out.append((name, s))
    return out


def time_steps(step: Callable[[dict], Any], batch: dict, n: int, device: torch.device) -> list[float]:
    """Per-step seconds for n back-to-back steps; on CUDA one host sync after the window."""
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        torch.cuda.synchronize()
        events[0].record()
        for i in range(n):
            step(batch)
            events[i + 1].record()
        torch.cuda.synchronize()
        return [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(n)]
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step(batch)
        out.append(time.perf_counter() - t0)
    return out


def bench_one(name: str, settings: ACTSettings | None, base: ACTSettings, b: int, h: int, w: int, args, device) -> dict:
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    s = replace(base, **{k: getattr(settings, k) for k in _SPEED}) if settings else base
    step = lerobot_step_fn(base, h, w, device) if settings is None else robotloop_step_fn(s, h, w, device)
    batch = make_batch(b, base.chunk_size, h, w, device)
    first = time_steps(step, batch, 1, device)[0]  # includes compile for compiled configs
    time_steps(step, batch, args.warmup, device)
    times = time_steps(step, batch, args.steps, device)
    med = statistics.median(times)
    if args.profile and device.type == "cuda":
        try:
            profile(step, batch, name, b)
        except Exception as e:  # noqa: BLE001 - a profiler failure must not lose the timings
            print(f"profile failed: {e!r}", file=sys.stderr)
    row = {
        "config": name,
        "batch": b,
        "samples_per_s": round(b / med, 1),
        "median_step_ms": round(med * 1e3, 2),
        "mean_step_ms": round(statistics.fmean(times) * 1e3, 2),
        "first_step_s": round(first, 2),
    }
    if device.type == "cuda":
        row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del step, batch
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def profile(step: Callable[[dict], Any], batch: dict, name: str, b: int, n: int = 10) -> None:
    """Where a step's time goes: GPU busy time (sum of kernel times) against wall time, and the top kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            step(batch)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / n
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1e6 / n
    print(
        f"PROFILE {name} b{b}: wall {wall * 1e3:.2f} ms/step, GPU busy {busy * 1e3:.2f} ms/step, "
        f"{len(kernels) / n:.0f} kernels/step",
        file=sys.stderr,
        flush=True,
    )
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=25), file=sys.stderr, flush=True)


_SPEED = ("precision", "fused_attention", "channels_last", "compile", "cuda_graphs", "autotune")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--image", default="480x640", help="HxW of the one camera")
    ap.add_argument("--only", nargs="*", default=None, help="config names to run (default: all)")
    ap.add_argument(
        "--drop",
        nargs="*",
        default=[],
        choices=["bf16", "fused_attention", "channels_last"],
        help="leave these options out of the stack (ablation), e.g. --drop channels_last",
    )
    ap.add_argument("--autotune", action="store_true", help="add a max-autotune configuration (slow compile)")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny ACT, 48x64, no compile")
    ap.add_argument("--compile-on-cpu", action="store_true", help="with --quick: also the compiled configs")
    ap.add_argument("--out", default=None, help="also write the JSON table here")
    ap.add_argument("--profile", action="store_true", help="CUDA: also profile each configuration (GPU busy vs wall)")
    args = ap.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    base = ACTSettings()
    if args.quick:
        base = ACTSettings(**TINY_ACT)
        args.batch, args.steps, args.warmup, args.image = [2], 3, 1, "48x64"
    if device.type == "cuda":
        # lerobot-train's settings on CUDA, for every configuration.
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
    h, w = (int(x) for x in args.image.split("x"))
    with_compile = device.type == "cuda" or args.compile_on_cpu

    rows = []
    for b in args.batch:
        for name, settings in configs(args.autotune, with_compile, tuple(args.drop)):
            if args.only and name not in args.only:
                continue
            try:
                row = bench_one(name, settings, base, b, h, w, args, device)
            except Exception as e:  # keep the table going; report the failure in it
                row = {"config": name, "batch": b, "error": f"{type(e).__name__}: {e}"[:500]}
                torch._dynamo.reset()
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)

    cfg = make_act_config(features(h, w), base, torch.device("cpu"))
    n_params = sum(p.numel() for p in ACTPolicy(cfg).parameters())
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "params_m": round(n_params / 1e6, 2),
        "image": [h, w],
        "chunk_size": base.chunk_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "dropped": args.drop,
        "rows": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
