"""Where the ONNX policy's step goes on this machine's CPU, and what ONNX Runtime's own options change.

Run:  MUJOCO_GL=egl .venv/bin/python benchmarks/robot_onnx_profile.py [--runs 40] [--out profile.json]

The policy is `benchmarks/robot_onnx.py`'s (the h200 preset's default-size ACT, random weights, the 480x640 camera
seen at 120x160), exported by `export_onnx`. One model pass per control step (temporal ensembling), batch 1:
1. Per operator type: ONNX Runtime's session profiling over `--runs` passes, kernel time per type and its share.
2. Side by side, interleaved pass by pass (so all see the same load): intra-op threads default / 1 / 2, spinning
   off, and MatMul and Gemm weights dynamically quantized to int8 (ONNX Runtime's `quantize_dynamic`), with the
   int8 graph's max |difference| from fp32 on the same inputs (fp32 parity, the issue's 1e-4, is not kept there).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.shape_inference import quant_pre_process
from robot_onnx import build_checkpoint

from robotloop.deploy.onnx_export import export_onnx
from robotloop.deploy.onnx_runner import ONNX_FILE


def session(path: Path, threads: int = 0, spin: bool = True, profile: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.enable_profiling = profile
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds(rng: np.random.Generator, camera: tuple[int, int]) -> dict[str, np.ndarray]:
    frame = rng.integers(0, 256, (1, *camera, 3), dtype=np.uint8)
    return {"observation.images.top": frame, "observation.state": rng.normal(0, 0.05, (1, 14)).astype(np.float32)}


def by_operator(path: Path, camera: tuple[int, int], runs: int) -> dict[str, dict[str, float]]:
    s = session(path, profile=True)
    rng = np.random.default_rng(0)
    for _ in range(runs):
        s.run(None, feeds(rng, camera))
    written = Path(s.end_profiling())  # in the working directory: read, then removed
    events = json.loads(written.read_text())
    written.unlink()
    total: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            total[e["args"]["op_name"]] = total.get(e["args"]["op_name"], 0.0) + e["dur"]
    whole = sum(total.values())
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:10]
    return {op: {"ms_per_pass": us / runs / 1000, "share": us / whole} for op, us in ranked}


def quantized(path: Path, work: Path) -> Path:
    pre, out = work / "pre.onnx", work / "int8.onnx"
    quant_pre_process(str(path), str(pre), skip_symbolic_shape=True, save_as_external_data=True)
    quantize_dynamic(str(pre), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt, camera = build_checkpoint(work / "pretrained_model", quick=False)
        graph = export_onnx(ckpt, work / "onnx").directory / ONNX_FILE
        operators = by_operator(graph, camera, args.runs)
        sessions = {
            "default": session(graph),
            "threads_1": session(graph, 1),
            "threads_2": session(graph, 2),
            "threads_2_no_spin": session(graph, 2, spin=False),
            "int8_matmul": session(quantized(graph, work)),
        }
        times: dict[str, list[float]] = {k: [] for k in sessions}
        diff = 0.0
        rng = np.random.default_rng(1)
        for i in range(args.runs + 5):
            inputs = feeds(rng, camera)
            outputs = {}
            for name, s in sessions.items():
                start = time.perf_counter()
                outputs[name] = s.run(None, inputs)[0]
                if i >= 5:  # first passes pay allocations
                    times[name].append(time.perf_counter() - start)
            diff = max(diff, float(np.abs(outputs["int8_matmul"] - outputs["default"]).max()))
    base = float(np.median(times["default"]))
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "onnxruntime": ort.__version__,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "operators": operators,
        "configs": {
            k: {
                "p50_ms": 1000 * float(np.median(v)),
                "p99_ms": 1000 * float(np.percentile(v, 99)),
                "vs_default": base / float(np.median(v)),
            }
            for k, v in times.items()
        },
        "int8_max_abs_diff": diff,
    }
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
