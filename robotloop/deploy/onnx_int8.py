"""An int8 variant of an exported policy, for robot computers whose CPU cannot run the fp32 graph at the control rate.

`quantize_int8(directory)` takes the fp32 export there (`onnx_export.export_onnx`'s three files) and writes beside it
`INT8_FILE`, the same graph with its MatMul and Gemm weights quantized to int8 (ONNX Runtime's dynamic
quantization: activations are quantized per pass, so no calibration data is needed; given observations of the task
to calibrate on, its convolutions too, statically), and `INT8_META_FILE`: what it was made from (sha256 of the
fp32 graph and weights) and how far its actions are from the fp32 graph's on a check batch. The graph takes and
gives what the fp32 one does, so `OnnxRunner.load(..., precision="int8")` runs it with the same metadata.

Why opt-in: on the default-size ACT the int8 graph ran 1.35x faster per control step than fp32 on a 2-core CPU
(BENCHMARKS.md), but its actions moved by up to ~3.5e-3 (radians) from fp32's, over the 1e-4 an fp32 export is held
to. Whether that costs success is a property of the policy and the task: evaluate it (`robotloop eval --backend
onnx-int8`) before robots run it (`robot.backend onnx-int8`). `robotloop deploy publish --onnx-int8` puts it in a
release, signed like every other file.

Needs the `onnx` package (the full install's): the robot only runs what publish made.

Example:
    ```python
    >>> made = quantize_int8(Path("run1/checkpoints/002000/pretrained_model"))
    >>> made.file.name, made.max_abs_diff
    ('policy.int8.onnx', 0.0021)
    ```
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import OnnxExportError
from .onnx_runner import (
    ACTION_KEY,
    INT8_FILE,
    INT8_META_FILE,
    ONNX_DATA_FILE,
    ONNX_FILE,
    STATE_KEY,
    file_sha256,
    has_onnx,
    read_meta,
)

# The largest |int8 - fp32| action accepted, in the actions' units (radians, gripper): dynamic int8 ACT measured
# ~3.5e-3; a broken quantization is off by far more. Success in sim, not this bound, decides whether to ship it.
INT8_ATOL = 0.05
# The fp32 step's time on 2 cores: MatMul 39%, Gemm 4%, Conv 34% (the backbone: in int8 only with calibration data).
INT8_OPS = ["MatMul", "Gemm"]


@dataclass(frozen=True)
class Int8Export:
    """What `quantize_int8` wrote: the graph `file`, its `max_abs_diff` from fp32 on the check batch, the time."""

    file: Path
    max_abs_diff: float
    seconds: float


def quantize_int8(
    directory: str | Path,
    out_dir: str | Path | None = None,
    *,
    atol: float = INT8_ATOL,
    calibration: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> Int8Export:
    """Write `INT8_FILE` and `INT8_META_FILE` of the fp32 export in `directory` into `out_dir` (default: beside it),
    replacing earlier ones.

    `calibration`: the graph's inputs for observations like the robot's (`OnnxRunner.to_inputs` of a few dozen
    frames from the task). With them the convolutions (the vision backbone) are quantized too, statically: their
    activations' ranges are taken from those observations, their weights per channel. On 2 cores that made the
    default-size ACT's step 1.4x faster again than MatMul/Gemm alone (BENCHMARKS.md). Without them, MatMul and Gemm
    only, with no data needed.

    Raises:
        OnnxExportError: no fp32 export there, the `onnx` package is missing, or the int8 graph does not run or
            its actions differ from fp32's by more than `atol`. Nothing is written then.
    """
    start = time.perf_counter()
    folder = Path(directory)
    out = Path(out_dir) if out_dir is not None else folder
    if not has_onnx(folder):
        raise OnnxExportError(f"{folder}: no fp32 ONNX export to quantize (export it first: export_onnx)")
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as error:  # onnxruntime's quantizer imports onnx: the full install has it, a robot's not
        raise OnnxExportError(f"quantizing needs the onnx package (pip install 'robotloop[full]'): {error}") from None
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".onnx-int8-") as tmp:
        staged = Path(tmp)
        prepared = staged / "prepared.onnx"
        try:
            # Shape inference and graph clean-up first, as ONNX Runtime advises before quantizing.
            quant_pre_process(
                str(folder / ONNX_FILE), str(prepared), skip_symbolic_shape=True, save_as_external_data=True
            )
            if calibration:
                prepared = _quantize_convolutions(prepared, staged / "conv.onnx", calibration)
            quantize_dynamic(
                str(prepared), str(staged / INT8_FILE), weight_type=QuantType.QInt8, op_types_to_quantize=INT8_OPS
            )
        except Exception as error:  # the quantizer's own failures (onnx's checker, a graph it cannot read)
            raise OnnxExportError(f"{folder / ONNX_FILE}: ONNX Runtime's quantizer failed: {error}") from error
        diff = _compare(folder, staged / INT8_FILE, atol)
        facts = {
            "source": {name: file_sha256(folder / name) for name in (ONNX_FILE, ONNX_DATA_FILE)},
            "written": file_sha256(staged / INT8_FILE),
            "quantized": {"weights": "int8", "activations": "dynamic uint8", "ops": INT8_OPS}
            | ({"Conv": f"static uint8, per-channel weights, calibrated on {len(calibration)}"} if calibration else {}),
            "max_abs_diff": diff,
        }
        (staged / INT8_META_FILE).write_text(json.dumps(facts, indent=1) + "\n")
        for name in (INT8_FILE, INT8_META_FILE):  # its facts last: a reader that sees them sees the graph
            os.replace(staged / name, out / name)
    return Int8Export(out / INT8_FILE, diff, time.perf_counter() - start)


def _quantize_convolutions(model: Path, out: Path, calibration: Sequence[Mapping[str, np.ndarray]]) -> Path:
    """`model` with its Conv layers in int8 (QDQ: ONNX Runtime runs them as int8 convolutions), the activations'
    ranges from the calibration inputs (min/max), written to `out`."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Observations(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return dict(feed) if (feed := next(self.feeds, None)) is not None else None

    quantize_static(
        str(model),
        str(out),
        Observations(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["Conv"],
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        use_external_data_format=True,
    )
    return out


def _compare(folder: Path, int8: Path, atol: float) -> float:
    """max |int8 - fp32| over a fixed check batch of random frames and states near zero.

    Raises:
        OnnxExportError: the int8 graph does not run, gives non-finite actions where fp32 does not, or is off by
            more than `atol`.
    """
    import onnxruntime as ort

    meta = read_meta(folder)
    rng = np.random.default_rng(0)
    feed = {key: rng.integers(0, 256, (2, h, w, c), dtype=np.uint8) for key, (h, w, c) in meta.cameras.items()}
    if meta.state_dim is not None:
        feed[STATE_KEY] = rng.normal(0.0, 0.05, (2, meta.state_dim)).astype(np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    cpu = ["CPUExecutionProvider"]  # the comparison's reference, wherever the robot will run it
    (expected,) = ort.InferenceSession(str(folder / ONNX_FILE), options, providers=cpu).run([ACTION_KEY], feed)
    try:
        (got,) = ort.InferenceSession(str(int8), options, providers=cpu).run([ACTION_KEY], feed)
    except Exception as error:  # onnxruntime's own exception types
        raise OnnxExportError(f"the int8 graph does not run in ONNX Runtime: {error}") from error
    diff = float(np.max(np.abs(got - expected)))
    if not diff <= atol:  # NaN fails too
        raise OnnxExportError(f"the int8 graph's actions differ from fp32's by up to {diff:.3g} (at most {atol:g})")
    return diff


__all__ = ["INT8_ATOL", "Int8Export", "quantize_int8"]
