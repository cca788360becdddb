"""Where an FP8 training step spends its GPU time, against bf16 (issue 14: FP8 ran at 0.71x of bf16 on the large ACT).

Run (GPU):  TORCH_LOGS=graph_breaks,recompiles,perf_hints python3 benchmarks/fp8_profile.py --case large-b128 \
                --modes off tensorwise --compiled --out-dir /tmp/fp8prof
Smoke (CPU): .venv/bin/python benchmarks/fp8_profile.py --quick --out-dir /tmp/fp8prof

For each mode, one process after the other in this one: build the step (`benchmarks/fp8.py`'s `build`: the same
model and settings as the speed table), warm up, time `--steps` steps (median), then profile `--profile-steps`
more with `torch.profiler`. Writes `<out-dir>/profile.json` (step medians, the GPU time by kernel class: GEMM,
FP8 GEMM, the casts and scaling reductions, convolutions, everything else) and one `kernels-<mode>.txt` table
(top kernels by GPU time). Eager by default: that shows whether the FP8 matmuls themselves win, with nothing
fused; `--compiled` profiles the compiled step with CUDA graphs, whose graph breaks and skipped graphs the
`TORCH_LOGS` above print to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from act_step import make_batch, time_steps
from fp8 import CASES, Case, build

from robotloop.train.policy import TINY_ACT

# Kernel classes by name fragment, first match wins (cuBLAS/CUTLASS names: "sm90_xmma_gemm", "cutlass", "gemm").
KERNEL_CLASSES = (
    ("fp8_gemm", ("e4m3", "e5m2", "f8", "fp8")),
    ("gemm", ("gemm", "cutlass", "matmul", "xmma", "nvjet", "aten::mm", "addmm")),
    ("conv", ("conv", "implicit", "wgrad", "dgrad")),
    ("attention", ("flash", "fmha", "attention")),
    ("cast_scale", ("amax", "abs", "clamp", "to_copy", "copy_", "reciprocal", "max")),
    ("triton_fused", ("triton",)),  # compiled: Inductor's fused kernels (casts and scaling among them)
)


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((cls for cls, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")


def profile_mode(mode: str, case: Case, args, device: torch.device) -> dict:
    h, w = args.hw
    tp = build(mode, case.arch, h, w, device, args.compiled)
    batch = make_batch(case.batch, tp.settings.chunk_size, h, w, device)
    t0 = time.perf_counter()
    time_steps(tp.train_step, batch, args.warmup, device)
    warmup_s = time.perf_counter() - t0
    med = statistics.median(time_steps(tp.train_step, batch, args.steps, device))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        time_steps(tp.train_step, batch, args.profile_steps, device)
    events = prof.key_averages()
    use_cuda = device.type == "cuda"
    by_class: dict[str, float] = {}
    for e in events:
        t = (e.self_device_time_total if use_cuda else e.self_cpu_time_total) / 1e3 / args.profile_steps
        if t > 0 and (not use_cuda or e.device_type.name == "CUDA"):
            by_class[kernel_class(e.key)] = by_class.get(kernel_class(e.key), 0.0) + t
    sort_by = "self_cuda_time_total" if use_cuda else "self_cpu_time_total"
    (args.out_dir / f"kernels-{mode}.txt").write_text(
        events.table(sort_by=sort_by, row_limit=40, max_name_column_width=90)
    )
    return {
        "mode": mode,
        "case": case.name,
        "batch": case.batch,
        "compiled": args.compiled,
        "fp8_layers": len(tp.fp8_layers),
        "median_step_ms": round(med * 1e3, 2),
        "samples_per_s": round(case.batch / med, 1),
        "warmup_s": round(warmup_s, 1),
        "gpu_ms_per_step_by_kernel_class": {k: round(v, 2) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="large-b128", choices=list(CASES))
    ap.add_argument("--modes", nargs="+", default=["off", "tensorwise"])
    ap.add_argument("--compiled", action="store_true", help="torch.compile + CUDA graphs (ACTSettings.fast())")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--image", default="480x640")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny ACT, 48x64, bf16 only")
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    case = CASES[args.case]
    if args.quick:
        case, args.image, args.modes, args.steps, args.warmup, args.profile_steps = (
            Case("tiny", 2, TINY_ACT),
            "48x64",
            ["off"],
            2,
            1,
            1,
        )
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
    args.hw = tuple(int(x) for x in args.image.split("x"))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in args.modes:
        rows.append(row := profile_mode(mode, case, args, device))
        print(json.dumps(row), file=sys.stderr, flush=True)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "image": list(args.hw),
        "rows": rows,
    }
    (args.out_dir / "profile.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
