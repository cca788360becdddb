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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..features import ACTION_KEY, STATE_KEY
from ..storage import BucketClient, BucketUrl
from .errors import OnnxExportError
from .onnx_runner import (
    INT8_FILE,
    INT8_META_FILE,
    ONNX_DATA_FILE,
    ONNX_FILE,
    file_sha256,
    has_onnx,
    read_meta,
)

# The largest |int8 - fp32| action accepted, in the actions' units (radians, gripper): dynamic int8 ACT measured
# ~3.5e-3; a broken quantization is off by far more. Success in sim, not this bound, decides whether to ship it.
INT8_ATOL = 0.05
# The fp32 step's time on 2 cores: MatMul 39%, Gemm 4%, Conv 34% (the backbone: in int8 only with calibration data).
INT8_OPS = ["MatMul", "Gemm"]
CALIBRATION_FRAMES = 50  # frames of the training data the convolutions' activation ranges are taken from
CHECK_EVERY = 5  # of the calibration frames, every 5th is held out to check the graph on (10 of 50)


@dataclass(frozen=True)
class Int8Export:
    """What `quantize_int8` wrote: the graph `file`, its `max_abs_diff` from fp32 on the check batch, the time."""

    file: Path
    max_abs_diff: float
    seconds: float
    convolutions: str | None = None  # with calibration: in int8 (how), or why they stayed fp32


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
    default-size ACT's step 1.5x faster again than MatMul/Gemm alone (BENCHMARKS.md). Every `CHECK_EVERY`-th is held
    out to check the graph on; where the calibrated convolutions move the actions more than `atol` from fp32's
    there, they stay fp32 (`INT8_META_FILE` says so and by how much). Without them, MatMul and Gemm only, with no
    data needed.

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
    calibrate_on, check_on = _held_out(calibration or [])
    with tempfile.TemporaryDirectory(dir=out, prefix=".onnx-int8-") as tmp:
        staged = Path(tmp)
        prepared, graph = staged / "prepared.onnx", staged / INT8_FILE
        # Shape inference and graph clean-up first, as ONNX Runtime advises before quantizing.
        _quantizer(
            quant_pre_process, folder / ONNX_FILE, prepared, skip_symbolic_shape=True, save_as_external_data=True
        )

        def matmuls_in_int8(source: Path) -> float:  # written as `graph`; its max |int8 - fp32| action
            source = _without_initializer_shapes(source, staged / f"{source.stem}.dynamic.onnx")
            _quantizer(quantize_dynamic, source, graph, weight_type=QuantType.QInt8, op_types_to_quantize=INT8_OPS)
            return _compare(folder, graph, check_on)

        conv_facts = None
        if calibrate_on:
            diff = matmuls_in_int8(_quantize_convolutions(prepared, staged / "conv.onnx", calibrate_on))
            conv_facts = f"static uint8, per-channel weights, calibrated on {len(calibrate_on)}"
            if not diff <= atol:  # a policy whose convolutions lose too much in int8 keeps them fp32
                conv_facts = f"fp32 (in int8, calibrated, its actions were {diff:.3g} from fp32's, over {atol:g})"
                diff = matmuls_in_int8(prepared)
        else:
            diff = matmuls_in_int8(prepared)
        if not diff <= atol:  # NaN fails too
            raise OnnxExportError(f"the int8 graph's actions differ from fp32's by up to {diff:.3g} (at most {atol:g})")
        facts = {
            "source": {name: file_sha256(folder / name) for name in (ONNX_FILE, ONNX_DATA_FILE)},
            "written": file_sha256(graph),
            "quantized": {"weights": "int8", "activations": "dynamic uint8", "ops": INT8_OPS}
            | ({"Conv": conv_facts} if conv_facts else {}),
            "max_abs_diff": diff,
            "checked_on": f"{len(check_on)} held-out calibration frames" if check_on else "2 random frames",
        }
        (staged / INT8_META_FILE).write_text(json.dumps(facts, indent=1) + "\n")
        for name in (INT8_FILE, INT8_META_FILE):  # its facts last: a reader that sees them sees the graph
            os.replace(staged / name, out / name)
    return Int8Export(out / INT8_FILE, diff, time.perf_counter() - start, conv_facts)


def calibration_inputs(
    client: BucketClient, datasets: Sequence[BucketUrl], directory: str | Path, count: int = CALIBRATION_FRAMES
) -> list[dict[str, np.ndarray]]:
    """`count` frames (with their states) drawn from `datasets`, the ones the policy trained on and so what its
    robots see, as inputs of the export in `directory`: what `quantize_int8(calibration=...)` calibrates on.

    Raises:
        DataError (robotloop.train.data): the datasets cannot be read or hold nothing to draw.
    """
    from ..train.data import DataSettings, StreamingSampler  # torch: the full install, where publish runs

    meta = read_meta(Path(directory))
    with StreamingSampler(client, list(datasets), DataSettings(decode_workers=1, refresh_every_s=0)) as sampler:
        batch = sampler.next_batch(count)
    feeds = []
    for i in range(count):  # the dataset's [3, H, W] frames as the graph takes them: [1, H, W, 3] uint8
        feed = {key: batch[key][i : i + 1].permute(0, 2, 3, 1).contiguous().numpy() for key in meta.cameras}
        if meta.state_dim is not None:
            feed[STATE_KEY] = batch[STATE_KEY][i : i + 1].float().numpy()
        feeds.append(feed)
    return feeds


def _quantizer(step: Callable[..., object], source: Path, target: Path, **options: object) -> None:
    """One of ONNX Runtime's quantizer steps, `source` to `target`, its failures as OnnxExportError."""
    try:
        step(str(source), str(target), **options)
    except Exception as error:  # the quantizer's own failures (onnx's checker, a graph it cannot read)
        raise OnnxExportError(f"{source}: ONNX Runtime's quantizer failed: {error}") from error


def _without_initializer_shapes(model: Path, out: Path) -> Path:
    """`model` without the shapes its `value_info` gives its initializers (weights), written to `out` in the same
    folder (its external weights stay where they are, named from there).

    Why: shape inference (`quant_pre_process`, `quantize_static`) leaves a shape for every weight in `value_info`,
    and ONNX Runtime 1.30's dynamic quantizer turns each Gemm whose weight is transposed (`transB`: every torch
    Linear) into a MatMul by transposing that weight in place under its own name, then infers shapes again: the
    weight's old shape there no longer fits it (`ShapeInferenceError: Inferred shape and existing shape differ in
    dimension 0: (14) vs (512)`: the state projection's [512, 14] weight). 1.32 writes the transposed weight under
    a new name instead. An initializer's own dims give its shape: nothing else is lost.
    """
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    weights = {tensor.name for tensor in proto.graph.initializer}
    kept = [info for info in proto.graph.value_info if info.name not in weights]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)
    onnx.save(proto, str(out))
    return out


def _quantize_convolutions(model: Path, out: Path, calibration: Sequence[Mapping[str, np.ndarray]]) -> Path:
    """`model` with its Conv layers in int8 (QDQ: ONNX Runtime runs them as int8 convolutions), the activations'
    ranges from the calibration inputs (min/max), written to `out`."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Observations(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return dict(feed) if (feed := next(self.feeds, None)) is not None else None

    _quantizer(
        quantize_static,
        model,
        out,
        calibration_data_reader=Observations(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["Conv"],
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        use_external_data_format=True,
    )
    return out


def _held_out(calibration: Sequence[Mapping[str, np.ndarray]]) -> tuple[list, list]:
    """(frames to calibrate on, frames to check on): every CHECK_EVERY-th frame is held out for the check, as
    the calibrated graph is only meant to be near fp32's on frames like the ones it was calibrated on (random
    frames drive its activations past the ranges it learned)."""
    frames = list(calibration)
    if len(frames) < 2 * CHECK_EVERY:
        return frames, frames
    return [f for i, f in enumerate(frames) if i % CHECK_EVERY], frames[::CHECK_EVERY]


def _compare(folder: Path, int8: Path, check_on: Sequence[Mapping[str, np.ndarray]] = ()) -> float:
    """max |int8 - fp32| over the `check_on` inputs (one batch), or a fixed check batch of random frames and
    states near zero (NaN where int8's actions are not finite).

    Raises:
        OnnxExportError: the int8 graph does not run.
    """
    import onnxruntime as ort

    meta = read_meta(folder)
    rng = np.random.default_rng(0)
    feed = {key: rng.integers(0, 256, (2, h, w, c), dtype=np.uint8) for key, (h, w, c) in meta.cameras.items()}
    if meta.state_dim is not None:
        feed[STATE_KEY] = rng.normal(0.0, 0.05, (2, meta.state_dim)).astype(np.float32)
    if check_on:
        feed = {key: np.concatenate([f[key] for f in check_on]) for key in check_on[0]}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    cpu = ["CPUExecutionProvider"]  # the comparison's reference, wherever the robot will run it
    (expected,) = ort.InferenceSession(str(folder / ONNX_FILE), options, providers=cpu).run([ACTION_KEY], feed)
    try:
        (got,) = ort.InferenceSession(str(int8), options, providers=cpu).run([ACTION_KEY], feed)
    except Exception as error:  # onnxruntime's own exception types
        raise OnnxExportError(f"the int8 graph does not run in ONNX Runtime: {error}") from error
    return float(np.max(np.abs(got - expected)))


__all__ = ["CALIBRATION_FRAMES", "INT8_ATOL", "Int8Export", "calibration_inputs", "quantize_int8"]
