"""`Policy`: what a robot runs, whichever backend loaded it; `load_policy` picks the backend for one release.

Two backends run a release's policy:

- ``torch`` (`PolicyRunner`, `robotloop.deploy.runner`): the checkpoint's safetensors through lerobot's ACTPolicy and
  its saved processors. Needs torch, torchvision and lerobot.
- ``onnx`` (`OnnxRunner`, `robotloop.deploy.onnx_runner`): the release's ONNX export (made beside the run's last
  checkpoint by the trainer, or at publish; released beside the checkpoint's files) on ONNX Runtime, with numpy
  only.

Both act alike (the chunk queue or ACT's temporal ensembling, `at_chunk_boundary` for hot-swaps, `NonFiniteAction`
for NaN/inf), so `PolicySlots` and `RobotRuntime` never ask which one runs, except to report it (`backend`, `runs_on`).

`load_policy(model_dir, backend, device)` chooses per release: ``torch`` and ``onnx`` as named, ``auto`` ONNX where
the release holds an export and onnxruntime here runs on `device`, else torch. This module imports neither torch nor
onnxruntime: each is imported when a policy of its backend is loaded.

Example:
    ```python
    >>> policy = load_policy(store.model_dir("v7"), backend="auto", device="auto")
    >>> policy.backend, policy.runs_on
    ('onnx', 'CPUExecutionProvider')
    >>> policy.reset(); action = policy.act(obs)
    ```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, get_args, runtime_checkable

import numpy as np

from ..config import Backend
from ..errors import BadValue
from .errors import BackendUnavailable, PolicyLoadError
from .onnx_runner import PROVIDERS, has_onnx, import_onnxruntime

BACKENDS: tuple[str, ...] = get_args(Backend)  # robot.backend's choices
# What `save_pretrained` of the policy and of lerobot's processors writes: the torch backend's files, all needed.
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "policy_preprocessor.json",
    "policy_postprocessor.json",
)


@runtime_checkable
class Policy(Protocol):
    """A loaded policy as the robot runtime uses it: observation in, one action out, chunk by chunk.

    `act` raises `NonFiniteAction` for NaN/inf (checked for the whole chunk before any of it is used) and `ValueError`
    for an observation that does not fit; both are RuntimeErrors or ValueErrors, which the control loop rolls back on.
    """

    backend: str  # "torch", "onnx" or "onnx-int8" (`BACKENDS`, less "auto")
    # The sim cameras' shadow-map side its data was rendered with, where not gym-aloha's for the size (None: it
    # was); a sim that films for it renders with the same (`SimControlEnv.fit`, `evaluate`).
    shadow_map: int | None

    @property
    def image_size(self) -> tuple[int, int] | None:
        """(height, width) of the camera frames it takes (first camera); None without cameras."""
        ...

    @property
    def at_chunk_boundary(self) -> bool:
        """True when the next `act()` runs the model: a safe point to swap policies."""
        ...

    @property
    def runs_on(self) -> str:
        """Where it runs: a torch device (``cpu``) or an ONNX Runtime execution provider (``CPUExecutionProvider``)."""
        ...

    def reset(self) -> None:
        """Start a new episode: drop the queued actions and the temporal ensemble."""
        ...

    def replan(self) -> None:
        """Drop the rest of the current chunk, so the next `act()` runs the model on what it is given (an expert
        drove since the chunk was planned); with temporal ensembling nothing changes (it was fed every step)."""
        ...

    def warmup(self, obs: dict) -> None:
        """Run the model once on `obs`, keeping the queue as it was (first-call costs paid before it drives)."""
        ...

    def act(self, obs: dict) -> np.ndarray:
        """The action for this step, float32 (action_dim,)."""
        ...


def load_policy(
    directory: str | Path, backend: Backend = "auto", device: str = "auto", inference: dict[str, Any] | None = None
) -> Policy:
    """Load the policy in `directory` (a release's model folder, or a checkpoint's ``pretrained_model``) with `backend`.

    `backend`: ``auto`` (ONNX where `directory` holds an export and onnxruntime here runs on `device`, else torch),
    ``onnx`` or ``torch``. `device`: ``auto`` (the machine's accelerator when it has one: for ONNX the TensorRT or CUDA
    execution provider, for torch CUDA; else the CPU), ``cpu``, ``cuda``, ``cuda:N``, or ``tensorrt`` (ONNX Runtime's
    TensorRT provider; torch runs on the same GPU). `inference`: as `PolicyRunner.load`'s.

    Example:
        ```python
        >>> load_policy(store.model_dir("v7"), backend="onnx", device="cpu").runs_on
        'CPUExecutionProvider'
        ```

    Raises:
        BackendUnavailable (a PolicyLoadError): this machine cannot run the release with `backend`: onnxruntime or
            torch is not installed, `device`'s execution provider does not start, or (``onnx``) the release holds no
            ONNX export. The reason is in the message.
        PolicyLoadError: the files are missing, unreadable or do not fit (see `PolicyRunner.load`, `OnnxRunner.load`).
        BadValue: `backend` is not one of `BACKENDS`.
    """
    path = Path(directory)
    if backend not in BACKENDS:
        raise BadValue(f"backend {backend!r}: use {', '.join(BACKENDS)}")
    exported = has_onnx(path)
    if backend in ("onnx", "onnx-int8"):
        if not exported:
            raise BackendUnavailable(
                f"{path}: the release holds no ONNX policy (published without one: --no-onnx, or --onnx optional "
                "and its export failed), and this robot runs ONNX only (robot.backend onnx)"
            )
        return _onnx(path, device, inference, "int8" if backend == "onnx-int8" else "fp32")
    if backend == "auto" and exported and onnx_runs_here(device) is None:
        return _onnx(path, device, inference)
    if exported and not all((path / name).is_file() for name in REQUIRED_FILES):
        # An ONNX-only release where ONNX cannot run: that is the reason, not the checkpoint files it does not have.
        why = onnx_runs_here(device) if backend == "auto" else "this robot runs torch only (robot.backend torch)"
        raise BackendUnavailable(f"{path}: the release holds only an ONNX policy, which cannot run here: {why}")
    return _torch(path, device, inference, exported and backend == "auto")


def onnx_runs_here(device: str = "auto") -> str | None:
    """Why ONNX Runtime cannot run a policy on `device` here (not installed, no such execution provider); None when it
    can, as far as its listed providers tell (one listed may still fail to start: `OnnxRunner.load` says so)."""
    try:
        ort = import_onnxruntime()
    except BackendUnavailable as error:
        return str(error)
    if device == "auto":
        return None
    kind = device.partition(":")[0]
    if kind not in PROVIDERS or PROVIDERS[kind][0] not in ort.get_available_providers():
        return f"onnxruntime here does not run on {device!r} ({', '.join(ort.get_available_providers())})"
    return None


def _onnx(path: Path, device: str, inference: dict[str, Any] | None, precision: str = "fp32") -> Policy:
    from .onnx_runner import OnnxRunner

    return OnnxRunner.load(path, device, inference, precision=precision)


def _torch(path: Path, device: str, inference: dict[str, Any] | None, exported: bool) -> Policy:
    """The torch backend; `exported`: whether the release held an ONNX policy that auto could not take."""
    kind, _, index = device.partition(":")
    # TensorRT is ONNX Runtime's; torch runs the policy on the same GPU with CUDA.
    torch_device = f"cuda{':' + index if index else ''}" if kind == "tensorrt" else device
    try:  # torch at import, lerobot and safetensors inside load
        from .runner import PolicyRunner

        return PolicyRunner.load(path, torch_device, inference)
    except ImportError as error:
        why = f"its ONNX policy cannot run here: {onnx_runs_here(device)}" if exported else "it has no ONNX policy"
        raise BackendUnavailable(f"{path}: torch or lerobot is not installed here ({error}), and {why}") from None


__all__ = [
    "BACKENDS",
    "REQUIRED_FILES",
    "Backend",
    "Policy",
    "PolicyLoadError",
    "load_policy",
    "onnx_runs_here",
]
