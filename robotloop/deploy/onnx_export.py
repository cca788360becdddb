"""Export a saved LeRobot ACT checkpoint to ONNX, for robots that run it without torch (`onnx_runner.OnnxRunner`).

`export_onnx(pretrained_dir)` loads the checkpoint as the robot runtime does (`PolicyRunner.load`: lerobot's
`ACTPolicy` and its saved pre/post processors) and exports one graph around them:

    raw uint8 frames [B, H, W, 3] -> float [0, 1] NCHW -> the saved preprocessor (its resize to the size the policy
    sees, lerobot's ImageCropResizeProcessorStep, and its normalization) -> ACT -> the saved postprocessor
    (un-normalization) -> the action chunk float32 [B, chunk_size, action_dim]

The processors are traced as lerobot runs them, not rewritten, so the graph does what the torch runner does. The
batch is dynamic; the frame size is the camera's (`robotloop_inputs.json`, as the runner reads it). The weights are
ONNX external data (`ONNX_DATA_FILE`: the raw tensors one after another, as safetensors holds them), so Xet's
chunking finds the bytes of the tensors a fine-tune did not change; node metadata (the exporter's stack traces,
with this machine's paths) is dropped, so the same checkpoint exports to the same bytes anywhere.

Before anything is written, ONNX Runtime runs the graph on a check batch and its actions are compared with torch's:
an export that does not agree within `atol` is refused. A layer that cannot be exported (an op with no ONNX
translation, data-dependent control flow) is an `OnnxExportError` naming it.

The metadata records what the export was made from and what it wrote (sha256 of the checkpoint's files and of the
graph and weights files) and the exporter's revision, so that `stale_export` can tell, by hashing, whether an export
found beside a checkpoint is exactly the one this code would make of it: the trainer exports its last checkpoint,
and publish reuses that export instead of making it again (~10 s of a 2-core machine for the default ACT).

Example:
    ```python
    >>> export = export_onnx(Path("run1/checkpoints/002000/pretrained_model"))
    >>> export.files, export.max_abs_diff
    >>> stale_export(export.directory)  # None: the export is this checkpoint's
    ```
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..features import ACTION_KEY, STATE_KEY
from ..train.policy import INPUTS_FILE
from .errors import OnnxExportError, PolicyLoadError
from .onnx_runner import (
    BATCH_DIM,
    ONNX_DATA_FILE,
    ONNX_FILE,
    ONNX_FILES,
    ONNX_META_FILE,
    OnnxMeta,
    file_sha256,
    read_meta,
)
from .runner import REQUIRED_FILES, PolicyRunner

log = logging.getLogger(__name__)

# The largest |ONNX - torch| action accepted at export, in the actions' own units (radians, gripper): fp32 graphs of
# ACT agree to ~1e-6; a mis-export is off by far more.
DEFAULT_ATOL = 1e-4
CHECK_BATCH = 2  # the example batch: above 1, so the exporter keeps the batch dimension dynamic
# Raised whenever what the exporter writes for the same checkpoint changes (the graph, its weights' layout, the
# metadata): an export an older exporter made beside a checkpoint is then made again at publish, not reused.
# 1: the first with its revision recorded (batch dimension named, weights untransposed, written files hashed).
EXPORTER_REVISION = 1


@dataclass(frozen=True)
class OnnxExport:
    """What `export_onnx` wrote: `files` (in `directory`), the metadata, and the export's check."""

    directory: Path
    files: tuple[str, ...]
    meta: OnnxMeta
    max_abs_diff: float
    seconds: float


class _ActGraph(torch.nn.Module):
    """The exported computation: raw frames and state in, un-normalized action chunk out, through lerobot's own
    processors and ACTPolicy.predict_action_chunk."""

    def __init__(self, runner: PolicyRunner) -> None:
        super().__init__()
        self.policy = runner.policy
        self.preprocessor = runner.preprocessor
        self.postprocessor = runner.postprocessor
        self.image_keys = runner.image_keys
        self.has_state = runner.state_dim is not None

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        # The runner's `to_batch`, batched: uint8 NHWC -> float32 NCHW in [0, 1], as lerobot's datasets give frames.
        batch = {
            k: x.permute(0, 3, 1, 2).to(torch.float32) / 255.0 for k, x in zip(self.image_keys, inputs, strict=False)
        }
        if self.has_state:
            batch[STATE_KEY] = inputs[-1]
        return self.postprocessor(self.policy.predict_action_chunk(self.preprocessor(batch)))


def export_onnx(
    pretrained_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    atol: float = DEFAULT_ATOL,
    opset: int | None = None,
) -> OnnxExport:
    """Export the ACT checkpoint in `pretrained_dir` to `out_dir` (default: beside it, in `pretrained_dir`):
    `ONNX_FILE`, `ONNX_DATA_FILE` and `ONNX_META_FILE`, replacing an earlier export there. Runs on the CPU.

    `opset`: the ONNX opset (default: the exporter's, 18 or later; the antialiased resize needs 18).

    Raises:
        PolicyLoadError: the checkpoint cannot be loaded (see `PolicyRunner.load`).
        OnnxExportError: a layer cannot be exported (named), the graph does not load in ONNX Runtime, or its
            actions differ from torch's by more than `atol` on the check batch. Nothing is written then.
    """
    source = Path(pretrained_dir)
    runner = PolicyRunner.load(source, "cpu")
    return export_runner(runner, out_dir if out_dir is not None else source, atol=atol, opset=opset)


def export_runner(
    runner: PolicyRunner, out_dir: str | Path, *, atol: float = DEFAULT_ATOL, opset: int | None = None
) -> OnnxExport:
    """`export_onnx` of a policy already loaded on the CPU (its checkpoint: `runner.path`, for the sha256s).

    Raises:
        OnnxExportError: as `export_onnx`, or the runner is not on the CPU.
    """
    start = time.perf_counter()
    source = runner.path
    cfg = runner.policy.config
    if runner.device.type != "cpu":  # the check batch and the traced constants live on the CPU
        raise OnnxExportError(f"{source}: export a policy loaded on the CPU, not on {runner.device}")
    if cfg.env_state_feature is not None:
        raise OnnxExportError(
            f"{source}: the policy reads an environment state; the exported graph takes cameras "
            "and the robot's state only"
        )
    graph = _ActGraph(runner).eval()
    inputs = _check_inputs(runner)
    names = [*runner.image_keys, *([STATE_KEY] if runner.state_dim is not None else [])]
    with torch.inference_mode():
        expected = graph(*inputs).numpy()
    program = _export(graph, inputs, names, opset)
    _drop_node_metadata(program)
    _name_batch_dimension(program)
    _untranspose_weights(program, runner.policy.state_dict())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".onnx-export-") as tmp:
        staged = Path(tmp)
        # Saved under its final name: the graph refers to its weights file by that name.
        program.save(str(staged / ONNX_FILE), external_data=True)
        diff = _compare(staged, names, inputs, expected, atol)
        written = {name: file_sha256(staged / name) for name in (ONNX_FILE, ONNX_DATA_FILE)}
        meta = OnnxMeta(
            cameras={k: (h, w, c) for k, (c, h, w) in runner.image_shapes.items()},
            policy_image_size=tuple(cfg.image_features[runner.image_keys[0]].shape[1:]) if runner.image_keys else None,
            state_dim=runner.state_dim,
            action_dim=runner.action_dim,
            chunk_size=cfg.chunk_size,
            n_action_steps=cfg.n_action_steps,
            temporal_ensemble_coeff=cfg.temporal_ensemble_coeff,
            opset=_opset(program),
            source=_sha256s(source),
            max_abs_diff=diff,
            exporter=EXPORTER_REVISION,
            written=written,
            shadow_map=runner.shadow_map,
        )
        (staged / ONNX_META_FILE).write_text(json.dumps(meta.to_dict(), indent=1) + "\n")
        files = (ONNX_FILE, ONNX_DATA_FILE, ONNX_META_FILE)
        for name in files:  # the metadata last: a reader that sees it sees the graph it describes
            os.replace(staged / name, out / name)
    return OnnxExport(out, files, meta, diff, time.perf_counter() - start)


def _check_inputs(runner: PolicyRunner) -> tuple[torch.Tensor, ...]:
    """A fixed batch of frames and states near the state's mean: what the export is checked on."""
    rng = np.random.default_rng(0)
    frames = [
        torch.from_numpy(rng.integers(0, 256, (CHECK_BATCH, h, w, c), dtype=np.uint8))
        for c, h, w in runner.image_shapes.values()
    ]
    if runner.state_dim is None:
        return tuple(frames)
    state = rng.normal(0.0, 0.05, (CHECK_BATCH, runner.state_dim)).astype(np.float32)
    mean = _state_mean(runner)
    return (*frames, torch.from_numpy(state + mean))


def _state_mean(runner: PolicyRunner) -> np.ndarray:
    """The state's mean in the saved normalizer (0 without one): check states the policy could see."""
    from lerobot.processor import NormalizerProcessorStep

    from ..compat import normalizer_tensor_stats

    for step in runner.preprocessor.steps:
        if isinstance(step, NormalizerProcessorStep):
            mean = normalizer_tensor_stats(step).get(STATE_KEY, {}).get("mean")
            if mean is not None:
                return mean.cpu().numpy().astype(np.float32)
    return np.zeros(runner.state_dim or 0, np.float32)


def _export(graph: _ActGraph, inputs: tuple[torch.Tensor, ...], names: list[str], opset: int | None):
    """torch.export, then the ONNX translation; each failure named by the layer it is in.

    Raises:
        OnnxExportError: either step failed.
    """
    batch = torch.export.Dim("batch", min=1)
    dynamic = (tuple({0: batch} for _ in inputs),)  # forward(*inputs): one argument, a tuple
    # Under no_grad: ACTPolicy.predict_action_chunk is itself decorated with it, which traced with grad on becomes
    # a higher-order op around a sub-graph instead of plain nodes.
    with _quiet_exporter(), torch.no_grad():
        # A failed trace prints its partial graph (thousands of lines) to stderr, always: held back here, and
        # written out only when the trace succeeds (then it is whatever else was written meanwhile).
        held = io.StringIO()
        try:
            with contextlib.redirect_stderr(held):
                exported = torch.export.export(graph, inputs, dynamic_shapes=dynamic, strict=False)
            sys.stderr.write(held.getvalue())
        except Exception as error:  # torch's tracing errors have no common base
            layer = _layer_in_traceback(error, graph)
            raise OnnxExportError(
                f"the policy cannot be traced for ONNX export{f' in layer {layer}' if layer else ''}: "
                f"{type(error).__name__}: {_first_line(error)}"
            ) from error
        try:
            return torch.onnx.export(
                exported,
                inputs,
                input_names=names,
                output_names=[ACTION_KEY],
                opset_version=opset,
                dynamo=True,
                external_data=True,
                optimize=True,
                verbose=False,
            )
        except Exception as error:  # torch.onnx's ConversionError, DispatchError, ...
            node, op, layer = _layer_of_failed_node(error, exported)
            where = f"layer {layer}" if layer else "the policy"
            raise OnnxExportError(
                f"{where} cannot be exported to ONNX: op {op or '?'} (node {node or '?'}) has no ONNX translation: "
                f"{_root_cause(error)}"
            ) from error


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's warnings (deprecations, constant folding it skips, graph dumps of a failed trace) say nothing
    to the user of an export: its error does."""
    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx", "torch.export", "torch.fx")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _layer_in_traceback(error: BaseException, graph: torch.nn.Module) -> str | None:
    """The innermost module of `graph` whose forward the error went through: `policy.model.backbone.layer1`."""
    names = {id(module): name for name, module in graph.named_modules() if name}
    found = None
    tb = error.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if id(owner) in names:
            found = f"{names[id(owner)]} ({type(owner).__name__})"
        tb = tb.tb_next
    return found


_FAILED_NODE = re.compile(r"translating node %(\S+) : .*?target=(\S+?)\]")


def _layer_of_failed_node(error: BaseException, exported) -> tuple[str | None, str | None, str | None]:
    """(node, op, layer) of the node the ONNX translation failed on, found from its error message in the exported
    program (the layer: the innermost module in the node's `nn_module_stack`)."""
    text = "\n".join(str(e) for e in _chain(error))
    match = _FAILED_NODE.search(text)
    if match is None:
        return None, None, None
    node_name, target = match.groups()
    graphs = [m.graph for m in exported.graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
    nodes = [n for graph in graphs for n in graph.nodes if n.op == "call_function"]
    # Decompositions rename nodes before translation; an op without a translation is seldom decomposed, so its
    # target finds it when its name does not.
    node = next((n for n in nodes if n.name == node_name), None) or next(
        (n for n in nodes if f"torch.ops.{n.target}" == target or str(n.target) == target), None
    )
    stack = (node.meta.get("nn_module_stack") or {}) if node is not None else {}
    layers = [(path, kind) for path, kind in stack.values() if path]
    layer = f"{layers[-1][0]} ({layers[-1][1].rsplit('.', 1)[-1]})" if layers else None
    return node_name, target.removeprefix("torch.ops."), layer


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _root_cause(error: BaseException) -> str:
    return _first_line(list(_chain(error))[-1])


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _drop_node_metadata(program) -> None:
    """Node metadata holds the exporter's stack traces (this machine's file paths) and fx node dumps: not for a
    release, and it would make two exports of one checkpoint differ in bytes."""
    import onnx_ir

    for node in onnx_ir.traversal.RecursiveGraphIterator(program.model.graph):
        node.metadata_props.clear()


def _name_batch_dimension(program) -> None:
    """Name the dynamic batch dimension `BATCH_DIM` (the exporter's name for it is a counter, `s21`): what
    `OnnxRunner` fixes to 1 for a robot's single episode (ONNX Runtime's free dimension override), so that ONNX
    Runtime folds what does not depend on the observation (ACT's decoder queries: its self-attention over the zero
    input), and what the metadata calls it."""
    import onnx_ir

    graph = program.model.graph
    batch = graph.inputs[0].shape[0] if graph.inputs and graph.inputs[0].shape is not None else None
    if not isinstance(batch, onnx_ir.SymbolicDim) or batch.value is None:
        return
    values = [*graph.inputs, *graph.outputs]
    values += [v for node in onnx_ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs]
    for value in values:
        if value.shape is not None and any(
            isinstance(d, onnx_ir.SymbolicDim) and d.value == batch.value for d in value.shape
        ):
            value.shape = onnx_ir.Shape(
                [BATCH_DIM if isinstance(d, onnx_ir.SymbolicDim) and d.value == batch.value else d for d in value.shape]
            )


def _untranspose_weights(program, state: dict[str, torch.Tensor]) -> None:
    """Store every weight as the checkpoint's own bytes. The exporter's optimizer folds `Transpose(W)` into a new
    initializer (the default ACT's 10 feed-forward matrices, 66 MB): bytes no robot holds, fetched again with every
    release although the safetensors beside them carry the same numbers. Each such initializer becomes the
    checkpoint's tensor (named as in the checkpoint) and a Transpose node, which ONNX Runtime folds again when it
    loads the graph: the same graph in memory, and the weights file all found in the safetensors by hash.
    (Asking the exporter not to optimize keeps them too, but then the graph runs ~10-20% slower on ONNX Runtime.)"""
    import onnx_ir

    def digest(array: np.ndarray) -> str:
        return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()

    by_hash = {digest(t.detach().cpu().numpy()): k for k, t in state.items() if t.is_floating_point() and t.ndim == 2}
    graph = program.model.graph
    for name, value in list(graph.initializers.items()):
        array = value.const_value.numpy() if value.const_value is not None else None
        if array is None or array.ndim != 2 or digest(array) in by_hash:
            continue
        source = by_hash.get(digest(array.T))
        if source is None or source in graph.initializers:
            continue
        weight = onnx_ir.Value(name=source, const_value=onnx_ir.tensor(np.ascontiguousarray(array.T), name=source))
        graph.register_initializer(weight)
        transpose = onnx_ir.node("Transpose", [weight], {"perm": [1, 0]}, name=f"{source}.T")
        value.replace_all_uses_with(transpose.outputs[0])
        graph.initializers.pop(name)
        graph.insert_before(graph.node(0), transpose)


def _compare(
    staged: Path, names: list[str], inputs: tuple[torch.Tensor, ...], expected: np.ndarray, atol: float
) -> float:
    """Run the saved graph in ONNX Runtime on `inputs`; answers max |ONNX - torch|.

    Raises:
        OnnxExportError: ONNX Runtime cannot load or run it, or the difference is over `atol`.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(staged / ONNX_FILE), options, providers=["CPUExecutionProvider"])
        (got,) = session.run([ACTION_KEY], {n: x.numpy() for n, x in zip(names, inputs, strict=True)})
    except Exception as error:  # onnxruntime's own exception types
        raise OnnxExportError(f"the exported graph does not run in ONNX Runtime: {error}") from error
    # Agreement includes NaN/inf where torch gives them (weights or stats that hold NaN): the export reproduces the
    # checkpoint, it does not judge it; a robot refuses non-finite actions from either backend (`NonFiniteAction`).
    bad = ~np.isfinite(expected)
    if got.shape != expected.shape or not np.array_equal(got[bad], expected[bad], equal_nan=True):
        raise OnnxExportError(
            f"the exported graph's actions are not torch's on the check batch: shape {list(got.shape)} against "
            f"{list(expected.shape)}, or NaN/inf where torch has none (or the other way round)"
        )
    diff = float(np.max(np.abs(got[~bad] - expected[~bad]))) if (~bad).any() else 0.0
    if not diff <= atol:  # a NaN where torch is finite fails too
        raise OnnxExportError(
            f"the exported graph's actions differ from torch's by up to {diff:.3g} on the check batch "
            f"(at most {atol:g})"
        )
    return diff


def _opset(program) -> int:
    return int(program.model.opset_imports.get("", 0))


def stale_export(pretrained_dir: str | Path, *, atol: float = DEFAULT_ATOL) -> str | None:
    """Why the ONNX export in `pretrained_dir` is not the one `export_onnx` would make of the checkpoint there now;
    None when it is, so that it can be released as it is: its metadata names these checkpoint files (sha256 of each
    file that decides the graph, the safetensors included), its graph and weights files are the ones the export
    wrote (sha256), this exporter revision wrote it, and its check against torch was within `atol`. Hashing only:
    no torch, no ONNX Runtime (~1 s for the default ACT's 340 MB).

    The export's check against torch ran when it was made, on exactly these weights (which the sha256 ties it to),
    so a current export needs no second check.

    Example:
        ```python
        >>> stale_export(Path("run1/checkpoints/002000/pretrained_model"))
        'exported from other checkpoint files: model.safetensors differs'
        ```

    Raises:
        Nothing for a bad export: missing or unreadable files are a reason (a string) like any other.
    """
    directory = Path(pretrained_dir)
    missing = [name for name in ONNX_FILES if not (directory / name).is_file()]
    if missing:
        return f"no export here ({', '.join(missing)} missing)"
    try:
        meta = read_meta(directory)
    except PolicyLoadError as error:
        return str(error)
    if meta.exporter != EXPORTER_REVISION:
        return f"made by exporter revision {meta.exporter}, this one is {EXPORTER_REVISION}"
    if not meta.max_abs_diff <= atol:
        return f"its check against torch found {meta.max_abs_diff:.3g}, over {atol:g}"
    try:
        ours = _sha256s(directory)
        written = {name: file_sha256(directory / name) for name in (ONNX_FILE, ONNX_DATA_FILE)}
    except OSError as error:  # a checkpoint file missing: not a checkpoint the export can be of
        return f"the checkpoint cannot be read: {error}"
    differ = sorted(name for name in ours.keys() | meta.source.keys() if ours.get(name) != meta.source.get(name))
    if differ:
        return (
            f"exported from other checkpoint files: {', '.join(differ)} {'differs' if len(differ) == 1 else 'differ'}"
        )
    changed = sorted(name for name, digest in written.items() if meta.written.get(name) != digest)
    if changed:
        return f"{', '.join(changed)} not the file the export wrote"
    return None


def _sha256s(source: Path) -> dict[str, str]:
    """sha256 of the checkpoint files that decide the graph: which checkpoint an export belongs to.

    Raises:
        OSError: a required checkpoint file cannot be read.
    """
    names = {*REQUIRED_FILES, *(p.name for p in source.glob("*.safetensors"))}
    if (source / INPUTS_FILE).is_file():  # the camera sizes: the graph's input shapes
        names.add(INPUTS_FILE)
    return {name: file_sha256(source / name) for name in sorted(names)}


__all__ = [
    "DEFAULT_ATOL",
    "EXPORTER_REVISION",
    "OnnxExport",
    "OnnxExportError",
    "export_onnx",
    "export_runner",
    "stale_export",
]
