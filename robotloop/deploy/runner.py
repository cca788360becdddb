"""`PolicyRunner`: a saved LeRobot ACT checkpoint driving the ALOHA sim (or a robot) one action at a time.

The runner loads what `TrainablePolicy.save_pretrained` wrote (lerobot's `ACTPolicy.from_pretrained` plus
the saved pre/post processors), maps an `AlohaSim` observation to the features the policy was trained on,
and hands back one 14-d joint command per control step:

    obs["pixels"][cam]  uint8 [H, W, 3]  ->  observation.images.<cam>  float32 [1, 3, H, W] in [0, 1]
    obs["agent_pos"]    float64 [14]     ->  observation.state          float32 [1, 14]

which is what training sees for a recorded frame: the recorder stores the sim's uint8 RGB frame and the
float32 state, the trainer decodes the frame to uint8 [3, H, W] and divides by 255 (lerobot's datasets and
`lerobot.envs.utils.preprocess_observation` do the same), and the saved preprocessor then normalizes
(ImageNet mean/std for cameras, dataset mean/std for the state).

Action chunks: ACT predicts `chunk_size` actions per forward pass and executes the first `n_action_steps`
of them. The runner keeps that queue itself, so `at_chunk_boundary` says when the next `act()` runs the
model: the one point where swapping weights never cuts a chunk in half. With temporal ensembling
(`temporal_ensemble_coeff` set in the saved config, `n_action_steps` 1) the model runs every step, so
every step is a boundary; a swap then starts the new policy with an empty ensemble, exactly as the first
step of an episode does.

Example:
    ```python
    >>> runner = PolicyRunner.load(Path("run1/checkpoints/002000/pretrained_model"))
    >>> sim = AlohaSim("transfer_cube", image_size=runner.image_size)
    >>> obs = sim.reset(seed=0)
    >>> runner.reset(); runner.warmup(obs)
    >>> obs, reward, success, truncated, info = sim.step(runner.act(obs))
    ```
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from ..features import ACTION_KEY, STATE_KEY
from ..sim.constants import check_shadow_map
from .errors import NonFiniteAction, PolicyLoadError  # noqa: F401 - also importable from here
from .inputs import batch_inputs, next_queued, observation_inputs
from .policy import REQUIRED_FILES  # what `save_pretrained` writes; all must be there to load

if TYPE_CHECKING:
    from ..train.policy import ACTSettings

log = logging.getLogger(__name__)


@dataclass(eq=False, repr=False)  # repr would print the whole ACT module tree
class PolicyRunner:
    """One loaded policy: observation in, one action out, chunk by chunk.

    Not thread-safe: one runner per control loop. Build it with `PolicyRunner.load`. It is a
    `robotloop.deploy.policy.Policy`, as `OnnxRunner` is: the robot runtime holds either.

    Attributes:
        policy: lerobot's ACTPolicy (eval mode). preprocessor / postprocessor: lerobot's saved pipelines.
        device: where the model runs. path: the directory it was loaded from.
        shadow_map: the shadow-map side its data's sim cameras rendered with, None for gym-aloha's (`INPUTS_FILE`).
    """

    backend: ClassVar[str] = "torch"
    policy: Any  # lerobot ACTPolicy
    preprocessor: Any  # lerobot PolicyProcessorPipeline
    postprocessor: Any
    device: torch.device
    path: Path

    def __post_init__(self) -> None:
        cfg = self.policy.config
        self.image_keys: list[str] = list(cfg.image_features)
        # The camera frames the runner takes, (C, H, W) per camera: the policy's input size, or the size its
        # preprocessor resizes from (written by the trainer beside config.json) when the policy sees smaller frames.
        cameras, self.shadow_map = _saved_inputs(self.path)
        self.image_shapes: dict[str, tuple[int, int, int]] = {
            k: (cfg.image_features[k].shape[0], *cameras.get(k, cfg.image_features[k].shape[1:]))
            for k in self.image_keys
        }
        state = cfg.robot_state_feature
        self.state_dim: int | None = state.shape[0] if state else None
        self.action_dim: int = cfg.action_feature.shape[0]
        self.ensembling: bool = cfg.temporal_ensemble_coeff is not None
        self._queue: deque[np.ndarray] = deque()

    # -- loading -----------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls, pretrained_dir: str | Path, device: str = "cpu", inference: dict[str, Any] | None = None
    ) -> PolicyRunner:
        """Load a LeRobot ACT checkpoint directory (`.../checkpoints/<step>/pretrained_model`), offline.

        The saved config's `pretrained_backbone_weights` is cleared before the model is built: those weights
        are overwritten by `model.safetensors` anyway, and building with them set makes torchvision download.
        `inference` overrides how the saved policy acts, e.g. `{"n_action_steps": 1, "temporal_ensemble_coeff":
        0.01}` (ACT's temporal ensembling) or `{"n_action_steps": 20}`; the weights stay the saved ones.

        Raises:
            PolicyLoadError: the directory or one of its files is missing, the config is not an ACT config,
                the device does not exist here, or the weights or processors cannot be read (corrupt file,
                keys or shapes that do not match).
        """
        from lerobot.policies.act.modeling_act import ACTPolicy
        from lerobot.policies.factory import make_pre_post_processors
        from safetensors.torch import load_model

        path = Path(pretrained_dir)
        _check_files(path)
        cfg = _read_config(path / "config.json")
        cfg.pretrained_backbone_weights = None
        for key, value in (inference or {}).items():
            if key not in ("n_action_steps", "temporal_ensemble_coeff"):
                raise PolicyLoadError(f"inference override {key!r}: only n_action_steps and temporal_ensemble_coeff")
            setattr(cfg, key, value)
        if cfg.temporal_ensemble_coeff is not None and cfg.n_action_steps != 1:
            raise PolicyLoadError("temporal ensembling runs the model every step: it needs n_action_steps=1")
        if not 1 <= cfg.n_action_steps <= cfg.chunk_size:
            raise PolicyLoadError(
                f"n_action_steps must be 1..{cfg.chunk_size} (the chunk size), not {cfg.n_action_steps}"
            )
        cfg.device = _check_device(device)
        try:
            # What `ACTPolicy.from_pretrained(path, config=cfg, strict=True)` does for a local folder, with the
            # same safetensors call, without its print("Loading weights from local directory") on stdout
            # (silencing it would swap sys.stdout, process-wide, while a robot's control thread runs).
            policy = ACTPolicy(cfg)
            load_model(policy, str(path / "model.safetensors"), strict=True, device="cpu")
            policy = policy.to(cfg.device).eval()
        # safetensors' HeaderTooLarge, torch's size mismatch, ...
        except Exception as error:
            raise PolicyLoadError(f"{path / 'model.safetensors'}: cannot load the weights: {error}") from error
        try:
            pre, post = make_pre_post_processors(
                cfg,
                pretrained_path=str(path),
                preprocessor_overrides={"device_processor": {"device": cfg.device}},
            )
        except Exception as error:
            raise PolicyLoadError(f"{path}: cannot load the saved pre/post processors: {error}") from error
        return cls(policy, pre, post, torch.device(cfg.device), path)

    # -- properties --------------------------------------------------------------------------------------
    @property
    def image_size(self) -> tuple[int, int] | None:
        """(height, width) of the camera frames the runner takes (first camera), e.g. for `AlohaSim(image_size=...)`.
        A policy that sees smaller frames resizes them in its preprocessor."""
        return self.image_shapes[self.image_keys[0]][1:] if self.image_keys else None

    @property
    def runs_on(self) -> str:
        """Where the policy runs, for a robot's status: the torch device (``cpu``, ``cuda:0``)."""
        return str(self.device)

    @property
    def at_chunk_boundary(self) -> bool:
        """True when the next `act()` runs the model and starts a new chunk: a safe point to swap policies.

        Always True with temporal ensembling (the model runs every step)."""
        return self.ensembling or not self._queue

    # -- control -----------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new episode: drop the queued actions (and the temporal ensemble)."""
        self._queue.clear()
        self.policy.reset()

    def replan(self) -> None:
        """Drop the rest of the current chunk: the next `act()` runs the model on the observation it is given. For a
        hand-back after an expert drove, whose states the queued actions never saw. The ensemble, when there is one,
        stays: it was fed every step."""
        self._queue.clear()

    def warmup(self, obs: dict) -> None:
        """Run one forward pass on `obs` and throw it away, so the first real `act()` pays no first-call
        cost (allocator, kernel selection). The action queue is left as it was.

        Raises:
            ValueError: `obs` does not fit the policy's features (see `to_batch`).
        """
        self._predict_chunk(self.to_batch(obs))

    def act(self, obs: dict) -> np.ndarray:
        """The action for this step, float32 (action_dim,). Runs the model at chunk boundaries only.

        Raises:
            ValueError: `obs` does not fit the policy's features (see `to_batch`).
            NonFiniteAction: the model produced NaN/inf; checked for the whole chunk before any of it is used.
        """
        if self.ensembling:
            with torch.inference_mode():
                action = self.policy.select_action(self.preprocessor(self.to_batch(obs)))
            return _finite(self.postprocessor(action)[0].cpu().numpy())
        if not self._queue:
            chunk = self._predict_chunk(self.to_batch(obs))
            self._queue.extend(chunk[: self.policy.config.n_action_steps])
        return self._queue.popleft()

    def act_batch(self, images: dict[str, np.ndarray], states: np.ndarray | None) -> np.ndarray:
        """The actions of B episodes stepped in lockstep, float32 [B, action_dim]: one forward pass for all.

        `images` maps camera name to uint8 [B, H, W, 3] frames, `states` is [B, state_dim]. The episodes share the
        runner's queue (or ensemble): `reset()` starts a new batch, and B must stay the same until then. Frames
        go to the device as uint8 and become floats there (a quarter of the bytes to copy).

        Midway through a chunk (`at_chunk_boundary` False) the action comes from the queue and `images` are not
        read: a lockstep evaluation renders only the frames the model will see.

        Raises:
            ValueError: a camera is missing or has the wrong shape or dtype, the states have the wrong shape or
                are not finite, or B changed since `reset()`.
            NonFiniteAction: the model produced NaN/inf.
        """
        if not self.ensembling and self._queue:
            return next_queued(self._queue, states)
        batch = self._tensors(batch_inputs(images, states, self.image_shapes, self.state_dim))
        if self.ensembling:
            with torch.inference_mode():
                actions = self.postprocessor(self.policy.select_action(self.preprocessor(batch)))
            return _finite(actions.float().cpu().numpy())
        # The queue kept here rather than in lerobot's `select_action`, so that `at_chunk_boundary` holds for a
        # batch too; lerobot queues the same first `n_action_steps` of each chunk.
        chunks = self._predict_chunks(batch)
        self._queue.extend(chunks[:, i] for i in range(self.policy.config.n_action_steps))
        return self._queue.popleft()

    def _predict_chunk(self, batch: dict[str, torch.Tensor]) -> np.ndarray:
        """Unnormalized float32 [chunk_size, action_dim] for one observation, checked finite."""
        return self._predict_chunks(batch)[0]

    def _predict_chunks(self, batch: dict[str, torch.Tensor]) -> np.ndarray:
        """Unnormalized float32 [B, chunk_size, action_dim], checked finite."""
        with torch.inference_mode():
            chunk = self.policy.predict_action_chunk(self.preprocessor(batch))
            chunk = self.postprocessor(chunk)
        return _finite(chunk.float().cpu().numpy())

    # -- observations ------------------------------------------------------------------------------------
    def to_batch(self, obs: dict) -> dict[str, torch.Tensor]:
        """An AlohaSim observation as the policy's input features, before normalization (batch of one).

        Images: uint8 [H, W, 3] -> float32 [1, 3, H, W] / 255; state: [S] -> float32 [1, S]. Extra
        cameras in `obs` are ignored.

        Raises:
            ValueError: a camera or the state is missing, or has the wrong shape, dtype or non-finite values.
        """
        return self._tensors(observation_inputs(obs, self.image_shapes, self.state_dim))

    def _tensors(self, feeds: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Checked inputs (`robotloop.deploy.inputs`) on the policy's device: frames go there as uint8 (a quarter
        of the bytes to copy) and become float32 [B, C, H, W] in [0, 1] there, as lerobot's datasets give them."""
        batch = {key: torch.from_numpy(value).to(self.device) for key, value in feeds.items()}
        for key in self.image_shapes:
            batch[key] = batch[key].permute(0, 3, 1, 2).float().div_(255.0)
        return batch


def _saved_inputs(path: Path) -> tuple[dict[str, tuple[int, int]], int | None]:
    """What the trainer recorded beside the policy (`INPUTS_FILE`): the camera sizes, and the sim cameras' shadow-map
    side where the data was not rendered as gym-aloha renders (None: it was). ({}, None) for checkpoints without it.
    """
    import json

    from ..train.policy import INPUTS_FILE

    file = path / INPUTS_FILE
    if not file.is_file():
        return {}, None
    try:
        saved = json.loads(file.read_text())
        cameras = {str(k): (int(v[0]), int(v[1])) for k, v in saved["cameras"].items()}
        shadow_map = saved.get("shadow_map")
        return cameras, check_shadow_map(int(shadow_map)) if shadow_map is not None else None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        raise PolicyLoadError(f"{file}: not a readable camera size file: {error}") from None


def _check_files(path: Path) -> None:
    if not path.is_dir():
        raise PolicyLoadError(f"{path}: no such checkpoint directory")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise PolicyLoadError(f"{path}: not a LeRobot pretrained_model directory, missing {', '.join(missing)}")


def _read_config(path: Path) -> Any:
    """The saved ACT config, decoded the way lerobot's `PreTrainedConfig.from_pretrained` does (drop the
    `type` tag, decode with draccus into the registered class). Not through that function: lerobot 0.6.1 writes
    the config to a temp file it never deletes, one per load, and robots load a release many times a day."""
    import json

    import draccus
    from lerobot.configs.policies import PreTrainedConfig

    try:
        raw = json.loads(path.read_text())
        policy_type = raw.pop("type") if isinstance(raw, dict) else None
        if policy_type != "act":
            raise PolicyLoadError(f"{path.parent}: a {policy_type!r} policy; the runner loads ACT policies only")
        return draccus.decode(PreTrainedConfig.get_choice_class(policy_type), raw)
    except PolicyLoadError:
        raise
    # json and draccus errors: report them all as one kind of failure
    except Exception as error:
        raise PolicyLoadError(f"{path}: not a readable lerobot policy config: {error}") from error


def _check_device(device: str) -> str:
    from ..train.device import resolve_device

    try:
        return str(torch.device(resolve_device(device)))
    except ValueError as error:
        raise PolicyLoadError(str(error)) from None


def _finite(actions: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(actions)):
        bad = np.argwhere(~np.isfinite(actions))[0].tolist()
        raise NonFiniteAction(
            f"the policy produced a non-finite action (first at index {', '.join(map(str, bad))}); the checkpoint's "
            f"weights or normalization stats hold NaN/inf or zero std"
        )
    return actions.astype(np.float32, copy=False)


def make_tiny_checkpoint(
    directory: str | Path,
    image_size: tuple[int, int] = (48, 64),
    seed: int = 0,
    chunk_size: int = 10,
    settings: ACTSettings | None = None,
    shadow_map: int | None = None,
) -> Path:
    """Save a small random-weight ACT for the ALOHA features (one `top` camera, 14-d state and action), for
    tests and benchmarks. Stats centre actions on the sim's start pose (std 0.05), so its commands stay near it.
    `shadow_map`: the camera's data was rendered with shadow maps of this side (`DatasetSpec.shadow_map`).

    `settings` replaces the tiny architecture (dim 64, one encoder layer, `chunk_size` actions per chunk),
    e.g. `ACTSettings()` for lerobot's full-size ACT in latency benchmarks.

    Example:
        ```python
        >>> runner = PolicyRunner.load(make_tiny_checkpoint(tmp / "tiny"))
        ```
    Returns `directory`, which then holds config.json, model.safetensors and the processors.
    """
    from ..capture.recorder import DatasetSpec
    from ..sim.constants import START_ARM_POSE
    from ..sim.env import joint_state
    from ..train.policy import TINY_ACT, ACTSettings, build_policy

    settings = settings or ACTSettings(
        **{**TINY_ACT, "chunk_size": chunk_size, "n_action_steps": chunk_size, "dropout": 0.0}
    )
    torch.manual_seed(seed)
    start = joint_state(START_ARM_POSE).astype(np.float32)
    vec = {
        "mean": start,
        "std": np.full(14, 0.05, np.float32),
        "min": start - 1,
        "max": start + 1,
    }
    features = DatasetSpec.aloha(image_size, shadow_map=shadow_map).features()
    # build_policy's "random backbone" warning is expected here
    with _quiet("robotloop.train.policy"):
        policy = build_policy(features, {STATE_KEY: vec, ACTION_KEY: vec}, settings)
    return policy.save_pretrained(directory)


@contextlib.contextmanager
def _quiet(logger: str):
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(logging.ERROR)
    try:
        yield
    finally:
        target.setLevel(level)


__all__ = [
    "NonFiniteAction",
    "PolicyLoadError",
    "PolicyRunner",
    "make_tiny_checkpoint",
]
