"""robotloop.deploy.onnx_export / onnx_runner: an ACT exported to ONNX acts as the torch runner does, without torch.

CPU only: the tiny random-weight ACT (dim 64, chunk 10) of a 48x64 camera, seen at 24x32, so the exported graph
resizes as the saved preprocessor does. One export for the module (about 15 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from lerobot.policies.act.modeling_act import ACTTemporalEnsembler

from robotloop.deploy.errors import BackendUnavailable
from robotloop.deploy.onnx_export import EXPORTER_REVISION, OnnxExportError, export_onnx, export_runner, stale_export
from robotloop.deploy.onnx_int8 import INT8_ATOL, quantize_int8
from robotloop.deploy.onnx_runner import (
    INT8_FILE,
    INT8_META_FILE,
    ONNX_DATA_FILE,
    ONNX_FILE,
    ONNX_FILES,
    ONNX_META_FILE,
    OnnxRunner,
    TemporalEnsembler,
    file_sha256,
)
from robotloop.deploy.runner import NonFiniteAction, PolicyLoadError, PolicyRunner, make_tiny_checkpoint
from robotloop.errors import BadValue
from robotloop.sim import AlohaSim
from robotloop.sim.constants import NO_SHADOWS
from robotloop.train.policy import TINY_ACT, ACTSettings

CAMERA, SEEN, CHUNK = (48, 64), (24, 32), 10
ENSEMBLE = {"n_action_steps": 1, "temporal_ensemble_coeff": 0.01}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    settings = ACTSettings(
        **{**TINY_ACT, "chunk_size": CHUNK, "n_action_steps": CHUNK, "dropout": 0.0}, image_size=SEEN
    )
    return make_tiny_checkpoint(tmp_path_factory.mktemp("policy") / "pretrained_model", CAMERA, settings=settings)


@pytest.fixture(scope="module")
def exported(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx")
    export_onnx(tiny, out)
    return out


@pytest.fixture(scope="module")
def sim() -> AlohaSim:
    with AlohaSim("transfer_cube", image_size=CAMERA, shadow_map=NO_SHADOWS) as s:
        yield s


def test_export_writes_a_graph_with_external_weights_and_its_description(tiny: Path, exported: Path) -> None:
    assert sorted(p.name for p in exported.iterdir()) == sorted([ONNX_FILE, ONNX_DATA_FILE, ONNX_META_FILE])
    meta = json.loads((exported / ONNX_META_FILE).read_text())
    assert meta["inputs"] == [
        {"name": "observation.images.top", "dtype": "uint8", "shape": ["batch", *CAMERA, 3], "layout": "NHWC"},
        {"name": "observation.state", "dtype": "float32", "shape": ["batch", 14]},
    ]
    assert meta["outputs"][0]["shape"] == ["batch", CHUNK, 14] and meta["policy_image_size"] == list(SEEN)
    assert (meta["chunk_size"], meta["n_action_steps"], meta["temporal_ensemble_coeff"]) == (CHUNK, CHUNK, None)
    assert meta["opset"] >= 18 and meta["max_abs_diff"] <= 1e-4
    import hashlib

    assert meta["source"]["model.safetensors"] == hashlib.sha256((tiny / "model.safetensors").read_bytes()).hexdigest()
    graph = onnx.load(str(exported / ONNX_FILE), load_external_data=False)
    external = [t for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    # The weights are raw tensors in the data file, under their state_dict names (Xet finds unchanged ones)...
    assert "policy.model.backbone.conv1.weight" in {t.name for t in external}
    weights = (tiny / "model.safetensors").stat().st_size
    assert 0.9 * weights < (exported / ONNX_DATA_FILE).stat().st_size < 1.1 * weights
    # Every weight is stored as the checkpoint's bytes, none transposed by the exporter's constant folding (a
    # robot would fetch those again): all but a few small constants are found in the safetensors.
    from safetensors.numpy import load_file

    held = {hashlib.sha256(t.tobytes()).hexdigest() for t in load_file(tiny / "model.safetensors").values()}
    data = (exported / ONNX_DATA_FILE).read_bytes()
    foreign = {}
    for t in external:
        where = {e.key: int(e.value) for e in t.external_data if e.key in ("offset", "length")}
        chunk = data[where.get("offset", 0) : where.get("offset", 0) + where["length"]]
        if hashlib.sha256(chunk).hexdigest() not in held:
            foreign[t.name] = len(chunk)
    assert sum(foreign.values()) < 16_384, foreign  # 4 KB of constants; 139 KB of transposed weights before
    # ... the graph file is small, and holds no path of this machine (the exporter's stack traces are dropped).
    assert (exported / ONNX_FILE).stat().st_size < 1 << 20
    assert b"robotloop/deploy" not in (exported / ONNX_FILE).read_bytes()
    assert {n.op_type for n in graph.graph.node} >= {"Resize", "Conv", "Softmax"}  # resize and model in one graph


def test_an_export_is_reused_only_beside_the_files_it_was_made_from(tiny: Path, exported: Path, tmp_path: Path):
    """`stale_export` is what publish decides by, between the trainer's export and its own: hashing only."""
    ckpt = Path(shutil.copytree(tiny, tmp_path / "pretrained_model"))
    assert stale_export(ckpt) == f"no export here ({', '.join(ONNX_FILES)} missing)"
    for name in ONNX_FILES:
        shutil.copy(exported / name, ckpt / name)
    assert stale_export(ckpt) is None  # the export of exactly these files, by this exporter
    meta = json.loads((ckpt / ONNX_META_FILE).read_text())
    assert meta["exporter"] == EXPORTER_REVISION and set(meta["written"]) == {ONNX_FILE, ONNX_DATA_FILE}

    # Other weights (a later checkpoint's, say): what the export was made from is no longer there.
    weights = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(weights[:-1] + bytes([weights[-1] ^ 1]))
    assert stale_export(ckpt) == "exported from other checkpoint files: model.safetensors differs"
    (ckpt / "model.safetensors").write_bytes(weights)
    # Other normalization stats: the graph holds them too.
    stats = next(ckpt.glob("policy_postprocessor_step_*.safetensors"))
    kept = stats.read_bytes()
    stats.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
    assert stale_export(ckpt) == f"exported from other checkpoint files: {stats.name} differs"
    stats.write_bytes(kept)
    # A weights file that is not the one the export wrote (and checked).
    data = (ckpt / ONNX_DATA_FILE).read_bytes()
    (ckpt / ONNX_DATA_FILE).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert stale_export(ckpt) == f"{ONNX_DATA_FILE} not the file the export wrote"
    (ckpt / ONNX_DATA_FILE).write_bytes(data)
    # An export made by an older exporter (no revision recorded), or one that was over the tolerance.
    older = {k: v for k, v in meta.items() if k not in ("exporter", "written")}
    (ckpt / ONNX_META_FILE).write_text(json.dumps(older))
    assert stale_export(ckpt) == f"made by exporter revision 0, this one is {EXPORTER_REVISION}"
    (ckpt / ONNX_META_FILE).write_text(json.dumps({**meta, "max_abs_diff": 0.5}))
    assert stale_export(ckpt) == "its check against torch found 0.5, over 0.0001"
    (ckpt / ONNX_META_FILE).write_text("{")
    assert "not a readable ONNX policy description" in stale_export(ckpt)
    (ckpt / ONNX_META_FILE).write_text(json.dumps(meta))
    assert stale_export(ckpt) is None


def _run_both(torch_runner: PolicyRunner, onnx_runner: OnnxRunner, sim: AlohaSim, steps: int, seed: int) -> float:
    """Step the sim with the torch policy's actions, feeding both policies the same observations: max |diff|."""
    obs = sim.reset(seed=seed)
    torch_runner.reset()
    onnx_runner.reset()
    worst = 0.0
    for step in range(steps):
        if step == steps // 3:  # mid-chunk: a hand-back from an expert, both plan a new chunk from here
            torch_runner.replan()
            onnx_runner.replan()
        assert onnx_runner.at_chunk_boundary == torch_runner.at_chunk_boundary
        want, got = torch_runner.act(obs), onnx_runner.act(obs)
        assert got.shape == (14,) and got.dtype == np.float32
        worst = max(worst, float(np.abs(got - want).max()))
        obs, *_ = sim.step(want)
    return worst


def test_onnx_actions_match_torch_chunk_by_chunk_and_ensembled(tiny: Path, exported: Path, sim: AlohaSim) -> None:
    assert _run_both(PolicyRunner.load(tiny), OnnxRunner.load(exported), sim, 50, seed=0) <= 1e-4
    ensembled = OnnxRunner.load(exported, inference=ENSEMBLE)
    assert ensembled.ensembling and ensembled.n_action_steps == 1
    assert _run_both(PolicyRunner.load(tiny, inference=ENSEMBLE), ensembled, sim, 50, seed=1) <= 1e-4


def test_the_int8_graph_acts_near_fp32_and_runs_only_where_it_was_made(
    exported: Path, sim: AlohaSim, tmp_path: Path
) -> None:
    folder = Path(shutil.copytree(exported, tmp_path / "release"))
    with pytest.raises(PolicyLoadError, match="no int8 graph"):
        OnnxRunner.load(folder, precision="int8")
    with pytest.raises(BadValue, match="precision 'fp16'"):
        OnnxRunner.load(folder, precision="fp16")
    with pytest.raises(OnnxExportError, match="no fp32 ONNX export"):
        quantize_int8(tmp_path / "nothing-here")
    made = quantize_int8(folder)
    facts = json.loads((folder / INT8_META_FILE).read_text())
    assert made.file == folder / INT8_FILE and facts["max_abs_diff"] == made.max_abs_diff
    assert facts["source"][ONNX_DATA_FILE] == file_sha256(folder / ONNX_DATA_FILE)  # made of this export
    assert facts["written"] == file_sha256(folder / INT8_FILE)
    # Weights in int8: the quantized MatMuls, their activations quantized per pass.
    ops = {node.op_type for node in onnx.load(str(folder / INT8_FILE)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops, ops
    int8 = OnnxRunner.load(folder, inference=ENSEMBLE, precision="int8")
    fp32 = OnnxRunner.load(folder, inference=ENSEMBLE)
    assert (int8.backend, fp32.backend) == ("onnx-int8", "onnx")
    # Another graph than fp32's, acting near it step by step (temporal ensembling over 40 sim steps).
    assert 0 < _run_both(fp32, int8, sim, 40, seed=5) <= INT8_ATOL
    # Calibrated on the task's frames, the convolutions (the backbone) go to int8 as well, and it still acts near.
    observations = [fp32.to_inputs(sim.reset(seed=seed)) for seed in range(8)]
    calibrated = quantize_int8(folder, calibration=observations)
    again = json.loads((folder / INT8_META_FILE).read_text())
    assert again["quantized"]["Conv"].endswith("calibrated on 8") and again["written"] != facts["written"]
    assert calibrated.file == made.file and again["written"] == file_sha256(made.file)
    graph = onnx.load(str(folder / INT8_FILE)).graph
    convs = [n for n in graph.node if n.op_type == "Conv"]
    quantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    assert convs and all(n.input[0] in quantized and n.input[1] in quantized for n in convs)  # int8 in, QDQ form
    assert 0 < _run_both(fp32, OnnxRunner.load(folder, inference=ENSEMBLE, precision="int8"), sim, 40, 5) <= INT8_ATOL


def test_the_dynamic_pass_is_given_no_shapes_of_weights_to_go_stale(
    exported: Path, sim: AlohaSim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime 1.30's dynamic quantizer turns each Gemm with `transB` into a MatMul by transposing its weight in
    place, then infers shapes again: a shape of that weight left in `value_info` by the passes before stopped it
    (`ShapeInferenceError: ... differ in dimension 0: (14) vs (512)` on the H200 machine). Whatever version runs
    here, the graph it is given names no weight in `value_info`, and that rewrite leaves it inferable: with the
    calibrated convolutions and without."""
    import onnxruntime.quantization as quantization
    from onnx import numpy_helper

    real, given = quantization.quantize_dynamic, []

    def as_onnxruntime_1_30_rewrites_it(source: str, target: str, **options: object) -> None:
        model = onnx.load(source)
        weights = {tensor.name: tensor for tensor in model.graph.initializer}
        assert not weights.keys() & {info.name for info in model.graph.value_info}
        for node in model.graph.node:  # 1.30's Gemm to MatMul: the transB weight transposed under its own name
            transposed = [a for a in node.attribute if a.name == "transB" and a.i]
            if node.op_type == "Gemm" and transposed:
                weight = weights[node.input[1]]
                weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight).T.copy(), weight.name))
                transposed[0].i = 0  # so the node takes it as it now is (the MatMul 1.30 makes of it does)
                given.append(weight.name)
        onnx.shape_inference.infer_shapes(model, strict_mode=True)  # where 1.30 stopped
        real(source, target, **options)

    monkeypatch.setattr(quantization, "quantize_dynamic", as_onnxruntime_1_30_rewrites_it)
    folder = Path(shutil.copytree(exported, tmp_path / "release"))
    assert quantize_int8(folder).max_abs_diff <= INT8_ATOL
    assert "policy.model.encoder_robot_state_input_proj.weight" in given  # [64, 14]: transposed, its shape changes
    observations = [OnnxRunner.load(folder).to_inputs(sim.reset(seed=seed)) for seed in range(8)]
    calibrated = quantize_int8(folder, calibration=observations)
    assert calibrated.convolutions.startswith("static") and calibrated.max_abs_diff <= INT8_ATOL


def test_batch_of_episodes_matches_torch(tiny: Path, exported: Path) -> None:
    rng = np.random.default_rng(3)
    torch_runner, onnx_runner = (
        PolicyRunner.load(tiny, inference=ENSEMBLE),
        OnnxRunner.load(exported, inference=ENSEMBLE),
    )
    # One episode runs in a session whose batch is fixed to 1 (ONNX Runtime folds more of the graph); a batch of
    # several opens a second session, dynamic, at its first use.
    assert [i.shape[0] for i in onnx_runner.session.get_inputs()] == [1, 1] and onnx_runner._batch_session is None
    for _ in range(5):  # three episodes in lockstep: the batch dimension is dynamic in the graph
        frames = rng.integers(0, 256, (3, *CAMERA, 3), dtype=np.uint8)
        states = rng.normal(0, 0.05, (3, 14)).astype(np.float32)
        want = torch_runner.act_batch({"top": frames}, states)
        got = onnx_runner.act_batch({"top": frames}, states)
        assert got.shape == (3, 14) and np.abs(got - want).max() <= 1e-4
    assert onnx_runner._batch_session.get_inputs()[0].shape[0] == "batch"
    with pytest.raises(BadValue, match="a batch of 2 episodes after 3: reset"):
        onnx_runner.act_batch({"top": frames[:2]}, states[:2])
    onnx_runner.reset()
    for runner in (torch_runner, onnx_runner):  # refused before the model, with the same words by both backends
        with pytest.raises(BadValue, match="the robot's state holds NaN or infinite values"):
            runner.act_batch({"top": frames}, np.full((3, 14), np.nan, np.float32))
    with pytest.raises(NonFiniteAction, match="non-finite action"):  # finite, but past what float32 arithmetic holds
        onnx_runner.act_batch({"top": frames}, np.full((3, 14), 3e38, np.float32))


def test_chunk_boundaries_and_warmup(exported: Path, sim: AlohaSim) -> None:
    runner = OnnxRunner.load(exported)
    obs = sim.reset(seed=2)
    runner.warmup(obs)
    boundaries = []
    for _ in range(2 * CHUNK + 1):
        boundaries.append(runner.at_chunk_boundary)
        runner.act(obs)
    assert [i for i, b in enumerate(boundaries) if b] == [0, CHUNK, 2 * CHUNK]
    assert not runner.at_chunk_boundary
    runner.warmup(obs)  # leaves the queue alone
    assert not runner.at_chunk_boundary
    runner.reset()
    assert runner.at_chunk_boundary


def test_temporal_ensembler_matches_lerobots() -> None:
    rng = np.random.default_rng(4)
    ours, theirs = TemporalEnsembler(0.01, CHUNK), ACTTemporalEnsembler(0.01, CHUNK)
    for _ in range(3 * CHUNK):  # past the point where every step's average holds chunk_size predictions
        chunk = rng.normal(0, 1, (2, CHUNK, 14)).astype(np.float32)
        want = theirs.update(torch.from_numpy(chunk)).numpy()
        np.testing.assert_allclose(ours.update(chunk), want, rtol=0, atol=1e-6)
    ours.reset()
    theirs.reset()
    first = rng.normal(0, 1, (2, CHUNK, 14)).astype(np.float32)
    np.testing.assert_array_equal(ours.update(first), first[:, 0])  # a new episode: its first chunk's first action


def test_bad_observations_are_refused_with_what_the_policy_takes(exported: Path, sim: AlohaSim) -> None:
    runner = OnnxRunner.load(exported)
    obs = sim.reset(seed=0)
    small = {**obs, "pixels": {"top": obs["pixels"]["top"][:24, :32]}}
    with pytest.raises(BadValue, match=r"uint8 48x64x3 images, got uint8 24x32x3 .*--image-size 48x64"):
        runner.act(small)
    with pytest.raises(BadValue, match="camera 'top'; the observation's cameras: wrist"):
        runner.act({**obs, "pixels": {"wrist": obs["pixels"]["top"]}})
    with pytest.raises(BadValue, match="a state of 14 values; the robot's has 7"):
        runner.act({**obs, "agent_pos": obs["agent_pos"][:7]})
    with pytest.raises(BadValue, match=r"uint8 \[B, 48, 64, 3\] frames, got float32 2x48x64x3"):
        runner.act_batch({"top": np.zeros((2, *CAMERA, 3), np.float32)}, np.zeros((2, 14), np.float32))
    assert runner.at_chunk_boundary  # nothing ran


def test_load_refuses_what_does_not_fit(exported: Path, tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="no exported ONNX policy"):
        OnnxRunner.load(tmp_path)
    with pytest.raises(PolicyLoadError, match="needs n_action_steps=1"):
        OnnxRunner.load(exported, inference={"temporal_ensemble_coeff": 0.01})
    with pytest.raises(PolicyLoadError, match="CUDAExecutionProvider"):
        OnnxRunner.load(exported, device="cuda")  # this machine's onnxruntime is the CPU build
    copy = Path(shutil.copytree(exported, tmp_path / "other"))
    meta = json.loads((copy / ONNX_META_FILE).read_text())
    meta["chunk_size"] = meta["outputs"][0]["shape"][1] = 20
    (copy / ONNX_META_FILE).write_text(json.dumps(meta))
    with pytest.raises(PolicyLoadError, match="not of one export"):
        OnnxRunner.load(copy)
    (copy / ONNX_DATA_FILE).write_bytes(b"truncated")
    (copy / ONNX_META_FILE).write_text((exported / ONNX_META_FILE).read_text())
    with pytest.raises(PolicyLoadError, match="ONNX Runtime cannot load it"):
        OnnxRunner.load(copy)


def test_auto_takes_the_best_execution_provider_that_starts(exported: Path) -> None:
    # Test double for ONNX Runtime's sessions (this machine's onnxruntime is the CPU build): a GPU machine whose
    # onnxruntime lists TensorRT and CUDA, where TensorRT's libraries are missing, so that ONNX Runtime falls back
    # from it silently (as it does), and CUDA starts.
    from robotloop.deploy import onnx_runner

    trt, cuda, cpu = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"
    tried: list[list[str]] = []

    class Session:
        def __init__(self, path: str, options: object, providers: list) -> None:
            names = [p if isinstance(p, str) else p[0] for p in providers]
            tried.append(names)
            self.started = names[1:] if names[0] == trt else names

        def get_providers(self) -> list[str]:
            return self.started

    class Ort:
        InferenceSession = Session

    available = [trt, cuda, cpu]
    session = onnx_runner._start_session(Ort, exported, None, onnx_runner._attempts("auto", available))
    assert session.get_providers()[0] == cuda and tried == [[trt, cuda, cpu], [cuda, cpu]]
    assert onnx_runner._attempts("cuda:1", available) == [("cuda:1", [(cuda, {"device_id": 1}), cpu])]
    with pytest.raises(BackendUnavailable, match=f"could not start {trt} here"):  # asked for, it does not start
        onnx_runner._start_session(Ort, exported, None, onnx_runner._attempts("tensorrt", available))
    with pytest.raises(BackendUnavailable, match="device 'gpu': the ONNX runner runs on auto, cpu, cuda"):
        onnx_runner._attempts("gpu", available)
    assert onnx_runner._attempts("auto", [cpu]) == [("cpu", [cpu])]  # a CPU build: the CPU


# A robot without torch: every import of torch (or of what needs it) fails, as on a slim install.
NO_TORCH = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: not on this robot")
        return None
BLOCKED = set(sys.argv[2].split(","))
sys.meta_path.insert(0, Block())
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("torch imported")
import json
import numpy as np
from robotloop.deploy.onnx_runner import OnnxRunner
from robotloop.deploy.errors import BackendUnavailable, PolicyLoadError
from robotloop.deploy.policy import load_policy
backends = {}  # what each robot.backend makes of the export alone (an ONNX-only release) on this machine
for backend in ("auto", "onnx", "torch"):
    try:
        backends[backend] = load_policy(sys.argv[1], backend, "auto").backend
    except BackendUnavailable as error:
        backends[backend] = f"unavailable: {error}"
try:
    runner = OnnxRunner.load(sys.argv[1], inference={"n_action_steps": 1, "temporal_ensemble_coeff": 0.01})
except PolicyLoadError as error:
    print(json.dumps({"error": str(error), "backends": backends}))
    raise SystemExit(0)
obs = {"pixels": {"top": np.full((48, 64, 3), 128, np.uint8)}, "agent_pos": np.zeros(14)}
actions = [runner.act(obs).tolist() for _ in range(3)]
modules = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"actions": actions, "modules": modules, "backends": backends}))
"""


def _without(blocked: str, exported: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(exported), blocked], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_onnx_runner_needs_neither_torch_nor_lerobot(exported: Path) -> None:
    robot = _without("torch,torchvision,lerobot,safetensors", exported)
    assert robot["modules"] == []
    local = OnnxRunner.load(exported, inference=ENSEMBLE)
    obs = {"pixels": {"top": np.full((48, 64, 3), 128, np.uint8)}, "agent_pos": np.zeros(14)}
    np.testing.assert_allclose(robot["actions"], [local.act(obs) for _ in range(3)], rtol=0, atol=1e-6)
    # load_policy (what the robot runtime loads with) takes the export here, for auto and onnx; torch has nothing
    backends = robot["backends"]
    assert backends["auto"] == backends["onnx"] == "onnx", backends
    assert "holds only an ONNX policy, which cannot run here: this robot runs torch only" in backends["torch"]
    # and without onnxruntime either, the release is unloadable with the reason, whatever the backend
    unloadable = _without("torch,onnxruntime", exported)
    assert "onnxruntime is not installed" in unloadable["error"]
    for backend in ("auto", "onnx"):
        assert "unavailable: " in unloadable["backends"][backend], unloadable["backends"]
        assert "onnxruntime is not installed on this machine" in unloadable["backends"][backend]


@torch.library.custom_op("robotloop_test::mystery_conv", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    """An op with no ONNX translation, as a custom kernel would be."""
    return x.clone()


@_mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _CustomBackbone(torch.nn.Module):
    """Stands in for ResNet18 (its output's shape, from a pooled input) through the custom op."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        pooled = torch.nn.functional.adaptive_avg_pool2d(x, (1, 1))
        return {"feature_map": _mystery(pooled.repeat(1, 171, 1, 1)[:, :512])}


class _Branchy(torch.nn.Module):
    """A layer whose control flow depends on the data: it cannot be traced into one graph."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) if x.sum() > 0 else -self.inner(x)


@pytest.mark.parametrize(
    "breakage, message",
    [
        (
            lambda model: setattr(model, "backbone", _CustomBackbone()),
            r"layer policy\.model\.backbone \(_CustomBackbone\) cannot be exported to ONNX: op "
            r"robotloop_test\.mystery_conv\.default .*no ONNX translation",
        ),
        (
            lambda model: setattr(model, "encoder_img_feat_input_proj", _Branchy(model.encoder_img_feat_input_proj)),
            r"cannot be traced for ONNX export in layer policy\.model\.encoder_img_feat_input_proj \(_Branchy\)",
        ),
    ],
    ids=["op-without-translation", "data-dependent-branch"],
)
def test_a_layer_that_cannot_be_exported_is_named(tiny: Path, tmp_path: Path, breakage, message: str) -> None:
    runner = PolicyRunner.load(tiny)
    breakage(runner.policy.model)
    with pytest.raises(OnnxExportError, match=message):
        export_runner(runner, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written
