"""`OnnxRunner`: an exported ACT policy (`onnx_export`) run by ONNX Runtime, with numpy only: no torch, no lerobot.

It acts as `PolicyRunner` does (`act`, `act_batch`, `reset`, `warmup`, `at_chunk_boundary`, `image_size`), so the
robot runtime can hold either. The exported graph does the work lerobot's processors do around the model: it
takes the camera's raw frames and the robot's state and answers the un-normalized action chunk,

    observation.images.<cam>  uint8   [B, H, W, 3]      the camera's frames as they come (H x W: the camera's size)
    observation.state         float32 [B, state_dim]
    action                    float32 [B, chunk_size, action_dim]

and resizes (lerobot's `ImageCropResizeProcessorStep`, when the policy sees smaller frames), scales to [0, 1] and
normalizes inside. What is left to the runner is ACT's own acting, reimplemented here: the queue of the first
`n_action_steps` actions of each chunk, or ACT's temporal ensembling (`TemporalEnsembler`, lerobot's
`ACTTemporalEnsembler` in numpy), which runs the model every step.

The export writes three files (`ONNX_FILE`, its weights `ONNX_DATA_FILE`, and `ONNX_META_FILE`: how the policy
acts and what it takes), beside the checkpoint's own files in its `pretrained_model/` folder.

Example:
    ```python
    >>> runner = OnnxRunner.load(Path("run1/checkpoints/002000/pretrained_model"))
    >>> sim = AlohaSim("transfer_cube", image_size=runner.image_size)
    >>> obs = sim.reset(seed=0)
    >>> runner.reset(); runner.warmup(obs)
    >>> obs, reward, success, truncated, info = sim.step(runner.act(obs))
    ```
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BadValue
from ..features import ACTION_KEY, STATE_KEY
from .errors import BackendUnavailable, NonFiniteAction, PolicyLoadError, PolicyRunError
from .inputs import batch_inputs, next_queued, observation_inputs

ONNX_FILE = "policy.onnx"
ONNX_DATA_FILE = "policy.onnx.data"  # the weights, as ONNX external data: raw tensors, so Xet dedup finds them
ONNX_META_FILE = "policy.onnx.json"
ONNX_FILES = (ONNX_FILE, ONNX_DATA_FILE, ONNX_META_FILE)  # what an export writes: a release holds all three or none
# The opt-in int8 variant (`onnx_int8.quantize_int8`): the same graph, MatMul and Gemm weights in int8, and its facts.
INT8_FILE = "policy.int8.onnx"
INT8_META_FILE = "policy.int8.json"
INT8_FILES = (INT8_FILE, INT8_META_FILE)
PRECISIONS = ("fp32", "int8")  # which graph of an export a runner loads
META_FORMAT = 1
# The graph's dynamic batch dimension, as the export names it: a robot's session fixes it to 1 (see `OnnxRunner`).
BATCH_DIM = "batch"
# ONNX Runtime's execution providers per `device`, in order of preference (ONNX Runtime falls back along the list,
# node by node, for what the first cannot run).
PROVIDERS: dict[str, tuple[str, ...]] = {
    "cpu": ("CPUExecutionProvider",),
    "cuda": ("CUDAExecutionProvider", "CPUExecutionProvider"),
    "tensorrt": ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
}
# What `device="auto"` tries, best first: the first whose execution provider starts here runs the policy.
AUTO_DEVICES = ("tensorrt", "cuda", "cpu")


@dataclass(frozen=True)
class OnnxMeta:
    """What `ONNX_META_FILE` says: the graph's inputs and how the policy acts.

    Attributes:
        cameras: camera key (``observation.images.top``) -> (H, W, C) of the frames the graph takes.
        policy_image_size: (H, W) the model itself sees (the graph resizes to it), None without cameras.
        state_dim: the state's length, None for a policy without one. action_dim, chunk_size: the output's shape.
        n_action_steps, temporal_ensemble_coeff: how the saved policy acts (lerobot's ACTConfig fields).
        opset: the graph's ONNX opset. source: sha256 of the checkpoint files it was exported from.
        max_abs_diff: the largest |ONNX - torch| action the export measured on its check batch.
        exporter: the revision of the exporter that wrote it (`onnx_export.EXPORTER_REVISION`; 0: one older than
            the field). written: sha256 of the graph and weights files as the export wrote them (empty: older).
            With `source`, what `onnx_export.stale_export` checks before publish reuses an export.
        shadow_map: the shadow-map side the policy's data's sim cameras rendered with, None for gym-aloha's
            (`PolicyRunner.shadow_map`).
    """

    cameras: dict[str, tuple[int, int, int]]
    policy_image_size: tuple[int, int] | None
    state_dim: int | None
    action_dim: int
    chunk_size: int
    n_action_steps: int
    temporal_ensemble_coeff: float | None
    opset: int
    source: dict[str, str]
    max_abs_diff: float
    exporter: int = 0
    written: dict[str, str] = field(default_factory=dict)
    shadow_map: int | None = None

    def to_dict(self) -> dict[str, Any]:
        inputs = [
            {"name": key, "dtype": "uint8", "shape": ["batch", *shape], "layout": "NHWC"}
            for key, shape in self.cameras.items()
        ]
        if self.state_dim is not None:
            inputs.append({"name": STATE_KEY, "dtype": "float32", "shape": ["batch", self.state_dim]})
        return {
            "format": META_FORMAT,
            "policy": "act",
            "files": {"model": ONNX_FILE, "weights": ONNX_DATA_FILE},
            "inputs": inputs,
            "outputs": [{"name": ACTION_KEY, "dtype": "float32", "shape": ["batch", self.chunk_size, self.action_dim]}],
            "policy_image_size": list(self.policy_image_size) if self.policy_image_size else None,
            "chunk_size": self.chunk_size,
            "n_action_steps": self.n_action_steps,
            "temporal_ensemble_coeff": self.temporal_ensemble_coeff,
            "opset": self.opset,
            "source": self.source,
            "max_abs_diff": self.max_abs_diff,
            "exporter": self.exporter,
            "written": self.written,
            "shadow_map": self.shadow_map,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> OnnxMeta:
        """Raises: ValueError, KeyError, TypeError: not a metadata file of this format."""
        if raw.get("format") != META_FORMAT or raw.get("policy") != "act":
            raise ValueError(f"format {raw.get('format')!r} of policy {raw.get('policy')!r}; this runner reads ACT v1")
        cameras: dict[str, tuple[int, int, int]] = {}
        state_dim = None
        for spec in raw["inputs"]:
            if spec["name"] == STATE_KEY:
                state_dim = int(spec["shape"][1])
            else:
                _, h, w, c = spec["shape"]
                cameras[str(spec["name"])] = (int(h), int(w), int(c))
        _, chunk, action_dim = raw["outputs"][0]["shape"]
        seen = raw["policy_image_size"]
        coeff = raw["temporal_ensemble_coeff"]
        return cls(
            cameras=cameras,
            policy_image_size=(int(seen[0]), int(seen[1])) if seen else None,
            state_dim=state_dim,
            action_dim=int(action_dim),
            chunk_size=int(raw["chunk_size"]),
            n_action_steps=int(raw["n_action_steps"]),
            temporal_ensemble_coeff=None if coeff is None else float(coeff),
            opset=int(raw["opset"]),
            source={str(k): str(v) for k, v in raw["source"].items()},
            max_abs_diff=float(raw["max_abs_diff"]),
            # Absent from exports made before they were recorded: such an export is made again at publish.
            exporter=int(raw.get("exporter", 0)),
            written={str(k): str(v) for k, v in raw.get("written", {}).items()},
            shadow_map=int(raw["shadow_map"]) if raw.get("shadow_map") is not None else None,
        )


def has_onnx(directory: str | Path) -> bool:
    """Whether `directory` holds an exported policy (its three files)."""
    return all((Path(directory) / name).is_file() for name in ONNX_FILES)


def file_sha256(path: Path) -> str:
    """The sha256 of the file at `path`, hex."""
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def read_meta(directory: str | Path) -> OnnxMeta:
    """The exported policy's metadata in `directory`.

    Raises:
        PolicyLoadError: no metadata file, or not a readable one.
    """
    file = Path(directory) / ONNX_META_FILE
    try:
        return OnnxMeta.from_dict(json.loads(file.read_text()))
    except FileNotFoundError:
        raise PolicyLoadError(f"{Path(directory)}: no exported ONNX policy ({ONNX_META_FILE} is missing)") from None
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        raise PolicyLoadError(f"{file}: not a readable ONNX policy description: {error}") from None


class TemporalEnsembler:
    """ACT's temporal ensembling (Algorithm 2 of the ACT paper), lerobot's `ACTTemporalEnsembler` in numpy.

    Each step's chunk is averaged into the running average of every earlier chunk's prediction for the same step,
    with weights exp(-coeff * i), i = 0 for the oldest prediction; `update` answers the action for this step. The
    same online computation as lerobot's, in float32 as there, so the two agree to float rounding.
    """

    def __init__(self, coeff: float, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.weights = np.exp(-coeff * np.arange(chunk_size, dtype=np.float32)).astype(np.float32)
        self.cumsum = np.cumsum(self.weights, dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        """Start a new episode: no earlier predictions."""
        self._average: np.ndarray | None = None  # [B, chunk_size - 1 (after the first step), action_dim]
        self._count: np.ndarray | None = None  # [chunk_size (-1), 1]: predictions averaged per future step

    def update(self, chunk: np.ndarray) -> np.ndarray:
        """Fold in this step's chunk [B, chunk_size, action_dim]; answers this step's action [B, action_dim].

        Raises:
            BadValue: the chunk's length is not `chunk_size`, or its batch differs from the previous one's.
        """
        if chunk.ndim != 3 or chunk.shape[1] != self.chunk_size:
            raise BadValue(f"the ensemble takes chunks [B, {self.chunk_size}, A], got {list(chunk.shape)}")
        if self._average is None or self._count is None:
            average = chunk.astype(np.float32, copy=True)
            count = np.ones((self.chunk_size, 1), dtype=np.int64)
        else:
            if chunk.shape[0] != self._average.shape[0]:
                raise BadValue(f"a batch of {chunk.shape[0]} after {self._average.shape[0]}: reset() first")
            # Lerobot's order of operations, so the rounding is the same.
            average = self._average * self.cumsum[self._count - 1]
            average += chunk[:, :-1] * self.weights[self._count]
            average /= self.cumsum[self._count]
            count = np.minimum(self._count + 1, self.chunk_size)
            average = np.concatenate([average, chunk[:, -1:]], axis=1)
            count = np.concatenate([count, np.ones_like(count[-1:])])
        self._average, self._count = average[:, 1:], count[1:]
        return average[:, 0]


@dataclass(eq=False, repr=False)
class OnnxRunner:
    """One exported policy in an ONNX Runtime session: observation in, one action out, chunk by chunk.

    Not thread-safe: one runner per control loop. Build it with `OnnxRunner.load`. It is a
    `robotloop.deploy.policy.Policy`, as `PolicyRunner` is: the robot runtime holds either.

    Attributes:
        session: the onnxruntime InferenceSession, for one episode: its batch dimension fixed to 1, so that ONNX
            Runtime folds at load what does not depend on the observation (ACT's decoder self-attention over its
            zero input: ~15% of a step on the CPU). A batch of several episodes (`act_batch`) runs in a second
            session with the batch dynamic, opened at its first use by `open_batch_session`.
        meta: the export's `OnnxMeta`. path: the directory loaded from.
        n_action_steps, temporal_ensemble_coeff: how it acts (the saved policy's, or `load`'s `inference`).
    """

    session: Any  # onnxruntime.InferenceSession
    meta: OnnxMeta
    path: Path
    n_action_steps: int
    temporal_ensemble_coeff: float | None
    open_batch_session: Callable[[], Any] | None = None  # the session for batches of several; None: `session`'s
    precision: str = "fp32"  # which graph of the export runs: "fp32", or "int8" (`INT8_FILE`)

    def __post_init__(self) -> None:
        self.image_keys: list[str] = list(self.meta.cameras)
        # (C, H, W) per camera, as `PolicyRunner.image_shapes`: the frames the runner takes.
        self.image_shapes: dict[str, tuple[int, int, int]] = {
            k: (c, h, w) for k, (h, w, c) in self.meta.cameras.items()
        }
        self.state_dim: int | None = self.meta.state_dim
        self.shadow_map: int | None = self.meta.shadow_map
        self.action_dim: int = self.meta.action_dim
        self.chunk_size: int = self.meta.chunk_size
        self.ensembling: bool = self.temporal_ensemble_coeff is not None
        self._ensembler = (
            TemporalEnsembler(self.temporal_ensemble_coeff, self.chunk_size)
            if self.temporal_ensemble_coeff is not None
            else None
        )
        self._queue: deque[np.ndarray] = deque()  # [B, action_dim] per step still to execute
        self._batch: int | None = None  # the episodes' count since reset(); they share the queue
        self._batch_session: Any = None

    # -- loading -----------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        directory: str | Path,
        device: str = "cpu",
        inference: dict[str, Any] | None = None,
        threads: int | None = None,
        spinning: bool = False,
        precision: str = "fp32",
    ) -> OnnxRunner:
        """Load the exported policy in `directory` (a checkpoint's `pretrained_model/` or a release's model folder).

        `device`: "cpu", "cuda", "cuda:N", "tensorrt", "tensorrt:N" (ONNX Runtime's execution providers,
        `PROVIDERS`; N: the GPU) or "auto" (the best this machine starts, in `AUTO_DEVICES` order: TensorRT, CUDA,
        else the CPU). `inference` overrides how the policy acts, as in `PolicyRunner.load`:
        `{"n_action_steps": 1, "temporal_ensemble_coeff": 0.01}` or `{"n_action_steps": 20}`. `threads`: ONNX
        Runtime's intra-op threads (default: its own, one per physical core). `spinning`: let those threads
        busy-wait for work between operators (ONNX Runtime's default; off here: ~5% faster on an idle CPU, but 1.7x
        slower per step with one of two cores busy with other work, as a robot's cores are). `precision`: "fp32" (the
        export's graph) or "int8" (its opt-in int8 variant, `INT8_FILE`, made by `onnx_int8.quantize_int8`).

        Example:
            ```python
            >>> OnnxRunner.load(release_dir, device="auto").runs_on
            'CUDAExecutionProvider'
            ```

        Raises:
            BackendUnavailable (a PolicyLoadError): onnxruntime is not installed, or the device is not one it runs
                on or its execution provider does not start here: this machine's setup.
            PolicyLoadError: the files are missing or unreadable (an int8 graph asked of an export without one
                included), ONNX Runtime cannot load the graph, the graph does not take what its metadata says, or
                the `inference` overrides do not fit the policy.
            BadValue: `precision` is not one of `PRECISIONS`.
        """
        path = Path(directory)
        if precision not in PRECISIONS:
            raise BadValue(f"precision {precision!r}: use {', '.join(PRECISIONS)}")
        ort = import_onnxruntime(path)
        if not has_onnx(path):
            raise PolicyLoadError(f"{path}: no exported ONNX policy ({ONNX_FILE}, {ONNX_DATA_FILE}, {ONNX_META_FILE})")
        graph = path / (INT8_FILE if precision == "int8" else ONNX_FILE)
        if not graph.is_file():
            raise PolicyLoadError(
                f"{path}: the release holds no int8 graph ({INT8_FILE}): publish it with --onnx-int8, or run its fp32 "
                "graph (onnx_precision fp32)"
            )
        meta = read_meta(path)
        steps, coeff = _acting(meta, inference or {})
        attempts = _attempts(device, ort.get_available_providers())
        session = _start_session(ort, graph, _session_options(ort, threads, spinning, batch_of_one=True), attempts)
        _check_graph(session, meta, graph)
        started = [a for a in attempts if _first_provider(a[1]) == session.get_providers()[0]][:1]

        def open_batch_session() -> Any:
            return _start_session(ort, graph, _session_options(ort, threads, spinning, batch_of_one=False), started)

        fixed = session.get_inputs()[0].shape[0] == 1  # an export from before names it otherwise: dynamic
        return cls(session, meta, path, steps, coeff, open_batch_session if fixed else None, precision)

    # -- properties --------------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """What runs the policy, as `load_policy` names it: "onnx" (the fp32 graph) or "onnx-int8"."""
        return "onnx" if self.precision == "fp32" else f"onnx-{self.precision}"

    @property
    def image_size(self) -> tuple[int, int] | None:
        """(height, width) of the camera frames the runner takes (first camera): the policy resizes them itself."""
        return self.image_shapes[self.image_keys[0]][1:] if self.image_keys else None

    @property
    def provider(self) -> str:
        """The ONNX Runtime execution provider the policy runs on, e.g. ``CPUExecutionProvider``."""
        return self.session.get_providers()[0]

    @property
    def runs_on(self) -> str:
        """Where the policy runs, for a robot's status: its execution provider (`provider`)."""
        return self.provider

    @property
    def at_chunk_boundary(self) -> bool:
        """True when the next `act()` runs the model and starts a new chunk: a safe point to swap policies.

        Always True with temporal ensembling (the model runs every step)."""
        return self.ensembling or not self._queue

    # -- control -----------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new episode (or batch of episodes): drop the queued actions and the temporal ensemble."""
        self._queue.clear()
        self._batch = None
        if self._ensembler is not None:
            self._ensembler.reset()

    def replan(self) -> None:
        """Drop the rest of the current chunk: the next `act()` runs the model on the observation it is given. For a
        hand-back after an expert drove, whose states the queued actions never saw. The ensemble, when there is one,
        stays: it was fed every step."""
        self._queue.clear()

    def warmup(self, obs: dict) -> None:
        """Run the model once on `obs` and throw the result away (ONNX Runtime's first run allocates and picks
        kernels). The queue and the ensemble are left as they were.

        Raises:
            ValueError: `obs` does not fit the policy (see `to_inputs`).
        """
        self.predict_chunk(self.to_inputs(obs))

    def act(self, obs: dict) -> np.ndarray:
        """The action for this step, float32 (action_dim,). Runs the model at chunk boundaries only.

        Raises:
            ValueError: `obs` does not fit the policy (see `to_inputs`).
            NonFiniteAction: the model produced NaN/inf; checked for the whole chunk before any of it is used.
        """
        return self._step(self.to_inputs(obs))[0]

    def act_batch(self, images: dict[str, np.ndarray], states: np.ndarray | None) -> np.ndarray:
        """The actions of B episodes stepped in lockstep, float32 [B, action_dim]: one run of the model for all.

        `images` maps camera name (``top``) to uint8 [B, H, W, 3] frames, `states` is [B, state_dim]. The episodes
        share the queue (or ensemble): `reset()` starts a new batch, and B must stay the same until then.

        Midway through a chunk (`at_chunk_boundary` False) the action comes from the queue and `images` are not
        read: a lockstep evaluation renders only the frames the model will see.

        Raises:
            ValueError: a camera is missing or has the wrong shape or dtype, the state has the wrong shape, or B
                changed since `reset()`.
            NonFiniteAction: the model produced NaN/inf.
        """
        if not self.ensembling and self._queue:
            return next_queued(self._queue, states)
        feeds = batch_inputs(images, states, self.image_shapes, self.state_dim)
        return self._step(feeds)

    def predict_chunk(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """One run of the model: the un-normalized chunks float32 [B, chunk_size, action_dim], checked finite.

        Raises:
            NonFiniteAction: the model produced NaN/inf.
            PolicyRunError: ONNX Runtime failed (its own exceptions are not RuntimeErrors: a robot's control loop
                rolls back on this one).
        """
        session = self.session
        if len(next(iter(feeds.values()))) != 1 and self.open_batch_session is not None:
            if self._batch_session is None:
                self._batch_session = self.open_batch_session()
            session = self._batch_session
        try:
            (chunk,) = session.run([ACTION_KEY], feeds)
        except Exception as error:  # onnxruntime's Fail, RuntimeException, EPFail, ...
            raise PolicyRunError(f"{self.path}: ONNX Runtime failed to run the policy: {error}") from error
        return _finite(chunk)

    def _step(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        batch = len(next(iter(feeds.values())))
        if self._batch not in (None, batch):
            raise BadValue(f"a batch of {batch} episodes after {self._batch}: reset() starts another batch")
        self._batch = batch
        if self._ensembler is not None:
            return self._ensembler.update(self.predict_chunk(feeds))
        if not self._queue:
            chunk = self.predict_chunk(feeds)
            self._queue.extend(chunk[:, i] for i in range(self.n_action_steps))
        return self._queue.popleft()

    # -- observations ------------------------------------------------------------------------------------
    def to_inputs(self, obs: dict) -> dict[str, np.ndarray]:
        """An AlohaSim observation as the graph's inputs (batch of one): the frames as they are, the state float32.

        Raises:
            ValueError: a camera or the state is missing, or has the wrong shape, dtype or non-finite values (the
                torch runner's checks and messages: `robotloop.deploy.inputs`).
        """
        return observation_inputs(obs, self.image_shapes, self.state_dim)


def _acting(meta: OnnxMeta, inference: dict[str, Any]) -> tuple[int, float | None]:
    """(n_action_steps, temporal_ensemble_coeff): the saved ones with `inference`'s overrides, checked as
    `PolicyRunner.load` checks them."""
    steps, coeff = meta.n_action_steps, meta.temporal_ensemble_coeff
    for key, value in inference.items():
        if key == "n_action_steps":
            steps = int(value)
        elif key == "temporal_ensemble_coeff":
            coeff = None if value is None else float(value)
        else:
            raise PolicyLoadError(f"inference override {key!r}: only n_action_steps and temporal_ensemble_coeff")
    if coeff is not None and steps != 1:
        raise PolicyLoadError("temporal ensembling runs the model every step: it needs n_action_steps=1")
    if not 1 <= steps <= meta.chunk_size:
        raise PolicyLoadError(f"n_action_steps must be 1..{meta.chunk_size} (the chunk size), not {steps}")
    return steps, coeff


def import_onnxruntime(path: Path | None = None) -> Any:
    """The onnxruntime module.

    Raises:
        BackendUnavailable: onnxruntime is not installed here (or cannot be imported).
    """
    try:
        import onnxruntime
    except ImportError as error:
        where = f"{path}: " if path is not None else ""
        raise BackendUnavailable(
            f"{where}onnxruntime is not installed on this machine ({error}); pip install onnxruntime "
            "(onnxruntime-gpu for CUDA and TensorRT)"
        ) from None
    return onnxruntime


# One attempt at a session: the device's name and the providers as InferenceSession takes them (a name, or a name
# with its options).
Attempt = tuple[str, list[Any]]


def _attempts(device: str, available: list[str]) -> list[Attempt]:
    """The provider lists to try for `device`, in order: one, or for "auto" each of `AUTO_DEVICES` this onnxruntime
    lists (a listed provider may still not start: no CUDA or TensorRT libraries installed).

    Raises:
        BackendUnavailable: not a device the runner knows, or its provider is not in this onnxruntime.
    """
    if device == "auto":
        return [(d, _providers(d, None, available)) for d in AUTO_DEVICES if PROVIDERS[d][0] in available]
    kind, _, index = device.partition(":")
    if kind not in PROVIDERS or (index and (kind == "cpu" or not index.isdigit())):
        raise BackendUnavailable(
            f"device {device!r}: the ONNX runner runs on auto, cpu, cuda, cuda:N, tensorrt or tensorrt:N"
        )
    if PROVIDERS[kind][0] not in available:
        raise BackendUnavailable(
            f"device {device!r} needs ONNX Runtime's {PROVIDERS[kind][0]}; this onnxruntime has {', '.join(available)}"
        )
    return [(device, _providers(kind, int(index) if index else None, available))]


def _providers(kind: str, gpu: int | None, available: list[str]) -> list[Any]:
    """`PROVIDERS[kind]` that this onnxruntime has, the GPU ones on GPU `gpu` (default: ONNX Runtime's, 0)."""
    names = [p for p in PROVIDERS[kind] if p in available]
    return [(p, {"device_id": gpu}) if gpu is not None and p != "CPUExecutionProvider" else p for p in names]


def _session_options(ort: Any, threads: int | None, spinning: bool, *, batch_of_one: bool) -> Any:
    """ONNX Runtime's session options for the policy: `threads` intra-op threads (None: its default, one per
    physical core), spinning or not (`OnnxRunner.load`), the batch dimension fixed to 1 when `batch_of_one` (an
    export that does not name it `BATCH_DIM`, from before, keeps it dynamic)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings go to stderr, past robotloop's logging
    if threads is not None:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if batch_of_one:
        options.add_free_dimension_override_by_name(BATCH_DIM, 1)
    return options


def _first_provider(providers: list[Any]) -> str:
    return providers[0] if isinstance(providers[0], str) else providers[0][0]


def _start_session(ort: Any, graph: Path, options: Any, attempts: list[Attempt]) -> Any:
    """The first session whose first provider starts (ONNX Runtime falls back silently when one cannot: its CUDA
    libraries missing, ...); only the last attempt's failure to load the graph is an error, an earlier one's is a
    provider that does not work here.

    Raises:
        BackendUnavailable: no attempt's provider started. PolicyLoadError: ONNX Runtime cannot load the graph.
    """
    failed: list[str] = []
    for i, (device, providers) in enumerate(attempts):
        first = _first_provider(providers)
        try:
            session = ort.InferenceSession(str(graph), options, providers=providers)
        except Exception as error:  # onnxruntime's Fail / InvalidGraph / NoSuchFile / EPFail, ...
            if i == len(attempts) - 1:
                raise PolicyLoadError(f"{graph}: ONNX Runtime cannot load it: {error}") from error
            failed.append(f"{device}: {error}")
            continue
        if session.get_providers()[0] == first:
            return session
        failed.append(f"{device}: ONNX Runtime could not start {first} here (it runs on {session.get_providers()})")
    raise BackendUnavailable(f"{graph.parent}: {'; '.join(failed)}")


def _check_graph(session: Any, meta: OnnxMeta, graph: Path) -> None:
    """The graph takes and gives what the metadata says (a metadata file from another export would mislead)."""
    want = {k: ["uint8", h, w, c] for k, (h, w, c) in meta.cameras.items()}
    if meta.state_dim is not None:
        want[STATE_KEY] = ["float", meta.state_dim]
    got = {i.name: [i.type.removeprefix("tensor(").removesuffix(")"), *i.shape[1:]] for i in session.get_inputs()}
    outputs = {o.name: list(o.shape[1:]) for o in session.get_outputs()}
    if got != want or outputs.get(ACTION_KEY) != [meta.chunk_size, meta.action_dim]:
        raise PolicyLoadError(
            f"{graph.parent}: {graph.name} takes {got} and gives {outputs}, but {ONNX_META_FILE} says it takes {want} "
            f"and gives {ACTION_KEY} [{meta.chunk_size}, {meta.action_dim}]: the two files are not of one export"
        )


def _finite(actions: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(actions)):
        bad = np.argwhere(~np.isfinite(actions))[0].tolist()
        raise NonFiniteAction(
            f"the policy produced a non-finite action (first at index {', '.join(map(str, bad))}); the checkpoint's "
            f"weights or normalization stats hold NaN/inf or zero std"
        )
    return actions.astype(np.float32, copy=False)


__all__ = [
    "BATCH_DIM",
    "ONNX_DATA_FILE",
    "ONNX_FILE",
    "ONNX_FILES",
    "ONNX_META_FILE",
    "OnnxMeta",
    "OnnxRunner",
    "TemporalEnsembler",
    "has_onnx",
    "import_onnxruntime",
    "read_meta",
]
