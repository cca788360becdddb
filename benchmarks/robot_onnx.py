"""The robot's policy on ONNX Runtime against torch: action parity and per-step latency, on this machine's CPU
(or, `--device cuda`, its GPU: torch on CUDA against ONNX Runtime's CUDA execution provider).

Run:  MUJOCO_GL=egl .venv/bin/python benchmarks/robot_onnx.py [--steps 200] [--passes 3] [--threads 2] [--spinning]
          [--int8] [--int8-calibrated] [--out benchmarks/results/robot_onnx_cpu.json]
Smoke (the tiny ACT at 48x64, seconds):  ... benchmarks/robot_onnx.py --quick
GPU machine (onnxruntime-gpu carried: benchmarks/pack_ort_gpu.sh):  ... benchmarks/robot_onnx.py --device cuda

The policy is the h200 preset's (`robotloop.loop.pipeline.H200_RECIPE`): lerobot 0.6.1's default-size ACT (51.6M
parameters, random weights: only parity and time matter here) seeing the 480x640 camera at 120x160 (its
preprocessor's resize), acting with ACT's temporal ensembling (coefficient 0.01, n_action_steps 1: one inference
per control step). It is exported with `robotloop.deploy.onnx_export.export_onnx` (the resize, normalization and
un-normalization in the graph) and run by `OnnxRunner` (numpy + onnxruntime) against `PolicyRunner` (torch eager),
with the runner's session settings: the batch fixed to 1 (ONNX Runtime folds what does not depend on the
observation), intra-op threads not spinning (`--spinning`: ONNX Runtime's default, spinning).

1. Parity: TransferCube (MuJoCo, 480x640 frames) stepped `--steps` times with the torch policy's actions; both
   policies see the same observations. Max |ONNX - torch| over every action (after ensembling) and over every
   predicted chunk. Target: <= 1e-4 (fp32).
2. Latency: one control step = `runner.act(obs)` (frame and state in, ensembled action out: what the robot's control
   loop pays), over the same observations, `--passes` passes per backend, alternating torch and ONNX, each pass
   after a reset and 5 untimed steps. p50/p99/max per backend. Target: p99 <= 20 ms (50 Hz) on 2 CPU cores.
   The load average is recorded before and after: other work on the machine shows in it.
3. With `--int8`, the export's int8 graph too (`robotloop.deploy.onnx_int8.quantize_int8`, what `deploy publish
   --onnx-int8` ships and `--backend onnx-int8` runs): its parity against fp32 ONNX, and its latency in the same
   alternation (torch, ONNX fp32, ONNX int8).
4. With `--int8-calibrated`, the int8 graph with its convolutions quantized too (`quantize_int8(calibration=...)`),
   calibrated on 50 frames of another episode (seed 1) than the 200 timed and compared (seed 0).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from robotloop.deploy.onnx_export import export_onnx
from robotloop.deploy.onnx_int8 import quantize_int8
from robotloop.deploy.onnx_runner import ONNX_DATA_FILE, OnnxRunner
from robotloop.deploy.runner import PolicyRunner, make_tiny_checkpoint
from robotloop.loop.pipeline import H200_RECIPE
from robotloop.sim import AlohaSim
from robotloop.train.policy import TINY_ACT, ACTSettings

WARMUP_STEPS = 5
CALIBRATION_STEPS = 100  # every other one calibrates: 50 frames
ACTING = ("image_size", "n_action_steps", "temporal_ensemble_coeff", "backbone_norm")


def build_checkpoint(directory: Path, quick: bool) -> tuple[Path, tuple[int, int]]:
    """The h200 preset's policy (or, `quick`, the tiny ACT at 48x64 seen at 24x32), random weights."""
    acting = {k: H200_RECIPE[k] for k in ACTING}
    if quick:
        settings = ACTSettings(**{**TINY_ACT, **acting, "image_size": (24, 32), "n_action_steps": 1, "dropout": 0.0})
        return make_tiny_checkpoint(directory, (48, 64), settings=settings), (48, 64)
    return make_tiny_checkpoint(directory, (480, 640), settings=ACTSettings(**acting, dropout=0.0)), (480, 640)


def record_observations(runner: PolicyRunner, camera: tuple[int, int], steps: int, seed: int = 0) -> list[dict]:
    """`steps` TransferCube observations, the sim stepped with the torch policy's actions."""
    out = []
    with AlohaSim("transfer_cube", image_size=camera) as sim:
        obs = sim.reset(seed=seed)
        runner.reset()
        for _ in range(steps):
            out.append({"pixels": {"top": obs["pixels"]["top"].copy()}, "agent_pos": obs["agent_pos"].copy()})
            obs, *_ = sim.step(runner.act(obs))
    return out


def parity(torch_runner: PolicyRunner | OnnxRunner, onnx_runner: OnnxRunner, observations: list[dict]) -> dict:
    torch_runner.reset()
    onnx_runner.reset()
    actions, chunks = 0.0, 0.0
    for obs in observations:
        if isinstance(torch_runner, OnnxRunner):  # the int8 graph against fp32's
            want_chunk = torch_runner.predict_chunk(torch_runner.to_inputs(obs))[0]
        else:
            want_chunk = torch_runner._predict_chunk(torch_runner.to_batch(obs))
        got_chunk = onnx_runner.predict_chunk(onnx_runner.to_inputs(obs))[0]
        chunks = max(chunks, float(np.abs(got_chunk - want_chunk).max()))
        actions = max(actions, float(np.abs(onnx_runner.act(obs) - torch_runner.act(obs)).max()))
    return {"observations": len(observations), "max_abs_diff_actions": actions, "max_abs_diff_chunks": chunks}


def time_pass(runner, observations: list[dict]) -> list[float]:
    """ms per `act` over `observations`, after a reset and WARMUP_STEPS untimed steps."""
    runner.reset()
    for obs in observations[:WARMUP_STEPS]:
        runner.act(obs)
    times = []
    for obs in observations:
        start = time.perf_counter()
        runner.act(obs)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def summary(times: list[float]) -> dict:
    array = np.asarray(times)
    return {
        "steps": len(times),
        "p50_ms": round(float(np.percentile(array, 50)), 2),
        "p99_ms": round(float(np.percentile(array, 99)), 2),
        "max_ms": round(float(array.max()), 2),
        "mean_ms": round(float(array.mean()), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own)")
    parser.add_argument("--spinning", action="store_true", help="ONNX Runtime's threads busy-wait between operators")
    parser.add_argument("--int8", action="store_true", help="also the export's int8 graph (deploy publish --onnx-int8)")
    parser.add_argument(
        "--int8-calibrated", action="store_true", help="also the int8 graph with its convolutions calibrated"
    )
    parser.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="where both run (cuda: ONNX Runtime's CUDA provider)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, camera = build_checkpoint(Path(tmp) / "pretrained_model", args.quick)
        start = time.perf_counter()
        export = export_onnx(ckpt, Path(tmp) / "onnx")
        export_s = time.perf_counter() - start
        start = time.perf_counter()
        torch_runner = PolicyRunner.load(ckpt, device=args.device)
        torch_load_s = time.perf_counter() - start
        start = time.perf_counter()
        onnx_runner = OnnxRunner.load(
            export.directory, device=args.device, threads=args.threads, spinning=args.spinning
        )
        onnx_load_s = time.perf_counter() - start
        batch_fixed = onnx_runner.session.get_inputs()[0].shape[0] == 1
        assert torch_runner.ensembling and onnx_runner.ensembling  # one inference per step, on both
        observations = record_observations(torch_runner, camera, args.steps)
        matched = parity(torch_runner, onnx_runner, observations)
        eager, onnx = f"torch_eager_{args.device}", f"onnxruntime_{args.device}"
        runners = {eager: torch_runner, onnx: onnx_runner}
        int8 = None
        if args.int8:
            made = quantize_int8(export.directory)
            runners["onnxruntime_cpu_int8"] = OnnxRunner.load(
                export.directory, threads=args.threads, spinning=args.spinning, precision="int8"
            )
            int8 = {
                "quantize_s": round(made.seconds, 1),
                "check_batch_max_abs_diff": made.max_abs_diff,
                "mb": round(made.file.stat().st_size / 1e6, 1),
                "parity_against_fp32": parity(onnx_runner, runners["onnxruntime_cpu_int8"], observations),
            }
        calibrated = None
        if args.int8_calibrated:
            # Calibrated on another episode's frames (seed 1) than the ones timed and compared (seed 0).
            other = record_observations(torch_runner, camera, CALIBRATION_STEPS, seed=1)
            folder = Path(tmp) / "int8-calibrated"
            folder.mkdir()
            for path in export.directory.iterdir():  # the fp32 export beside it: the runner reads its metadata
                (folder / path.name).symlink_to(path)
            made = quantize_int8(
                export.directory, folder, calibration=[onnx_runner.to_inputs(obs) for obs in other[::2]]
            )
            runners["onnxruntime_cpu_int8_calibrated"] = OnnxRunner.load(
                folder, threads=args.threads, spinning=args.spinning, precision="int8"
            )
            calibrated = {
                "calibration_observations": len(other[::2]),
                "quantize_s": round(made.seconds, 1),
                "check_batch_max_abs_diff": made.max_abs_diff,
                "mb": round(made.file.stat().st_size / 1e6, 1),
                "parity_against_fp32": parity(onnx_runner, runners["onnxruntime_cpu_int8_calibrated"], observations),
            }
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.passes):  # alternating, so a burst of other load hits each
            for name, runner in runners.items():
                times[name] += time_pass(runner, observations)
        onnx_mb = (export.directory / ONNX_DATA_FILE).stat().st_size / 1e6
    latency = {name: summary(t) for name, t in times.items()}
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
        "device": args.device,
        "onnxruntime_provider": onnx_runner.runs_on,
        "threads": {"torch": torch.get_num_threads(), "onnxruntime": args.threads or "default"},
        "onnxruntime_session": {
            "batch_fixed_to_1": batch_fixed,
            "spinning": args.spinning,
            "graph_optimization_level": "ORT_ENABLE_ALL",
        },
        "policy": {
            "quick": args.quick,
            "camera": list(camera),
            "policy_image_size": list(export.meta.policy_image_size or ()),
            "chunk_size": export.meta.chunk_size,
            "temporal_ensemble_coeff": export.meta.temporal_ensemble_coeff,
            "parameters_m": round(sum(p.numel() for p in torch_runner.policy.parameters()) / 1e6, 1),
            "onnx_weights_mb": round(onnx_mb, 1),
            "opset": export.meta.opset,
        },
        "export_s": round(export_s, 1),
        "load_s": {"torch": round(torch_load_s, 2), "onnxruntime": round(onnx_load_s, 2)},
        "parity": matched,
        "latency": latency,
        "speedup_p50": round(latency[eager]["p50_ms"] / latency[onnx]["p50_ms"], 2),
        "int8": int8,
        "int8_calibrated": calibrated,
        "target_p99_ms": 20.0,
        "loadavg_before": [round(v, 2) for v in load_before],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()],
    }
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
