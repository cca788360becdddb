"""The options of a training run, written once: `robotloop train`'s flags, the training service's `JobSpec` and
the agent's `start_training` tool are all derived from `TrainOptions` (see `robotloop.options`).

A new option is one field here (type, default, bounds, description); the trainer reads it from the
`TrainOptions` the command receives. tests/test_train_options.py checks that every field reaches all three.

Example:
    ```python
    >>> options = TrainOptions(datasets=["hf://buckets/lab/demos/datasets/cube"],
    ...                        output="hf://buckets/lab/demos/models/run1", steps=500, tiny=True)
    >>> to_argv(options)[:2]
    ['--dataset', 'hf://buckets/lab/demos/datasets/cube']
    ```
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..errors import BadValue
from ..options import Flag, to_argv
from ..storage import BucketUrl
from .weights import FrameWeights, parse_dataset_weight

if TYPE_CHECKING:
    from .data import DataSettings

# robotloop.train.fp8.FP8_MODES (which needs torch; this module must not): tests/test_fp8.py checks they agree.
Fp8Mode = Literal["off", "auto", "tensorwise", "rowwise", "rowwise_with_gw_hp"]
MAX_STEPS = 100_000_000
MAX_WEIGHT = 1e6


class TrainOptions(BaseModel):
    """What a caller chooses about a training run: data, output, length, size, device, seed, policy preset."""

    model_config = ConfigDict(extra="forbid")

    datasets: Annotated[list[str], Flag("--dataset")] = Field(
        min_length=1,
        max_length=64,
        description="Dataset URLs, hf://buckets/<ns>/<bucket>/datasets/<name> (the command's --dataset: repeat it "
        "for several).",
    )
    output: str = Field(description="Run URL: hf://buckets/<ns>/<bucket>/models/<run>")
    steps: int = Field(
        default=1000, ge=1, le=MAX_STEPS, description="Optimizer steps (the run's total, counting resumed ones)."
    )
    batch_size: int = Field(default=8, ge=1, le=65536, description="Samples per step (per GPU under torchrun).")
    device: str = Field(default="auto", description="auto (cuda when there is a GPU, else cpu), cpu, cuda or cuda:N.")
    resume: bool = Field(default=False, description="Continue from the run's last checkpoint.")
    init_from: str | None = Field(
        default=None,
        description="Start a new run from another's weights (how a round fine-tunes the last): a run URL (its last "
        "checkpoint) or <run>/checkpoints/<step>; its optimizer and step count are not taken.",
    )
    init_stats: Literal["checkpoint", "data"] = Field(
        default="checkpoint",
        description="With --init-from, the normalization stats: the checkpoint's (its weights were trained with "
        "them) or the new data's (lerobot-train's way for a pretrained policy on another dataset).",
    )
    log_every: int = Field(default=50, ge=1, le=MAX_STEPS, description="Steps between progress reports.")
    checkpoint_every: int = Field(
        default=1000, ge=1, le=MAX_STEPS, description="Steps between checkpoints (the last step always writes one)."
    )
    decode_workers: int = Field(default=4, ge=1, le=64, description="Processes decoding video for the frame buffer.")
    buffer_gib: float | None = Field(
        default=None,
        gt=0,
        le=4096,
        description="The frame buffer's size in GiB (default: half the GPU's free memory at the start, 8 on CPU); "
        "lower it where other work shares the GPU. Episodes beyond it are evicted and decoded again.",
    )
    # How often each kind of frame is drawn (robotloop.train.weights.FrameWeights): a fleet dataset's frames by who
    # drove them and whether the episode succeeded; a demo dataset's all alike. 0 drops a kind.
    demo_weight: float = Field(
        default=1.0, ge=0, le=MAX_WEIGHT, description="Weight of a demo dataset's frames (one without intervention)."
    )
    expert_weight: float = Field(
        default=2.0, ge=0, le=MAX_WEIGHT, description="Weight of a fleet dataset's expert frames (intervention)."
    )
    success_weight: float = Field(
        default=1.0,
        ge=0,
        le=MAX_WEIGHT,
        description="Weight of a fleet dataset's autonomous frames from which the policy reached success on its own.",
    )
    failed_weight: float = Field(
        default=0.0,
        ge=0,
        le=MAX_WEIGHT,
        description="Weight of a fleet dataset's autonomous frames in failed episodes or before a takeover (0: drop).",
    )
    dataset_weights: Annotated[list[str], Flag("--dataset-weight")] = Field(
        default_factory=list,
        max_length=64,
        description="URL=W: multiply every frame weight of one --dataset by W (repeat it for several).",
    )
    seed: int = Field(
        default=0, ge=0, le=2**32 - 1, description="Seed of the weights and the sampler."
    )  # torch seeds are 64-bit; numpy's 32
    tiny: bool = Field(default=False, description="A small ACT (policy.TINY_ACT: dim 64) for smoke tests on CPU.")
    # The policy, on top of lerobot's ACT (or --tiny's): unset keeps its value. LeRobot's spellings work too.
    chunk_size: Annotated[int | None, Flag("--chunk-size", ("--policy.chunk_size",))] = Field(
        default=None, ge=1, le=1000, description="Actions the policy predicts per step (ACT's chunk; default 100)."
    )
    n_action_steps: Annotated[int | None, Flag("--n-action-steps", ("--policy.n_action_steps",))] = Field(
        default=None, ge=1, le=1000, description="Actions run from each chunk (default: the chunk, at most 100)."
    )
    dim_model: Annotated[int | None, Flag("--dim-model", ("--policy.dim_model",))] = Field(
        default=None, ge=8, le=8192, description="Transformer width (lerobot's ACT: 512)."
    )
    lr: Annotated[float | None, Flag("--lr", ("--policy.optimizer_lr",))] = Field(
        default=None, gt=0, le=1, description="Learning rate (lerobot's ACT: 1e-5, tuned for an ImageNet backbone)."
    )
    image_size: Annotated[str | None, Flag("--policy-image-size", ("--policy.image_size",))] = Field(
        default=None,
        description="HxW the policy sees, e.g. 240x320 (default: the camera's; resized in its "
        "preprocessor, which lerobot's tools load too).",
    )
    fp8: Fp8Mode = Field(
        default="off",
        description="FP8 linear layers (TorchAO): off, auto (only shapes measured faster; bf16 where there is no "
        "FP8), tensorwise, rowwise, rowwise_with_gw_hp.",
    )
    onnx: Literal["auto", "off"] = Field(
        default="auto",
        description="ONNX export of the run's last checkpoint, for robots without torch (publish checks and reuses it "
        "instead of exporting): auto (where the exporter is installed) or off.",
    )

    @field_validator("datasets")
    @classmethod
    def _dataset_urls(cls, urls: list[str]) -> list[str]:
        return [str(BucketUrl.parse(u)) for u in urls]  # BadBucketUrl is a ValueError: reported per field

    @field_validator("output")
    @classmethod
    def _output_url(cls, url: str) -> str:
        return str(BucketUrl.parse(url))

    @field_validator("init_from")
    @classmethod
    def _init_url(cls, url: str | None) -> str | None:
        return None if url is None else str(BucketUrl.parse(url))

    @field_validator("dataset_weights")
    @classmethod
    def _dataset_weights(cls, items: list[str], info: ValidationInfo) -> list[str]:
        pairs = [(str(BucketUrl.parse(url)), weight) for url, weight in map(parse_dataset_weight, items)]
        datasets = info.data.get("datasets") or []  # validated before this field; absent when they were refused
        unknown = [url for url, _ in pairs if datasets and url not in datasets]
        if unknown:
            raise ValueError(f"{', '.join(unknown)} is not a --dataset of the run")
        return [f"{url}={weight}" for url, weight in pairs]

    def data_settings(self) -> DataSettings:
        """How the run streams its data (`robotloop.train.data.DataSettings`)."""
        from .data import DataSettings  # torch: not imported by the CLI's option parsing

        buffer = None if self.buffer_gib is None else int(self.buffer_gib * 2**30)
        return DataSettings(decode_workers=self.decode_workers, buffer_bytes=buffer, weights=self.frame_weights())

    def frame_weights(self) -> FrameWeights:
        """The run's frame weights (`robotloop.train.weights.FrameWeights`)."""
        return FrameWeights(
            demo=self.demo_weight,
            expert=self.expert_weight,
            autonomous_success=self.success_weight,
            autonomous_failed=self.failed_weight,
            datasets=dict(parse_dataset_weight(item) for item in self.dataset_weights),
        )

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, size: str | None) -> str | None:
        from ..sim.constants import parse_image_size  # numpy only: the service and the agent stay light

        return None if size is None else "x".join(map(str, parse_image_size(size)))

    def policy_overrides(self) -> dict:
        """The ACTSettings fields this run sets (unset ones keep the model's); n_action_steps follows a smaller
        chunk, which it may not exceed."""
        out = {k: getattr(self, k) for k in ("chunk_size", "n_action_steps", "dim_model", "lr") if getattr(self, k)}
        if self.image_size:
            out["image_size"] = tuple(int(v) for v in self.image_size.split("x"))
        return out

    @field_validator("fp8", mode="before")
    @classmethod
    def _fp8_mode(cls, mode: object) -> object:
        modes = get_args(Fp8Mode)
        if mode not in modes:  # robotloop.train.fp8.check_mode's message, which the CLI has always shown
            raise ValueError(f"fp8 must be one of {', '.join(modes)}, got {mode!r}")
        return mode


def read_train_config(path: Path) -> dict[str, Any]:
    """`robotloop train --config FILE`'s values: a YAML or JSON mapping of TrainOptions' flags (`dataset`, one URL or
    a list; `batch-size` or `batch_size`: see `robotloop.options.config_values`), or LeRobot's `train_config.json`
    (lerobot-train's `--config_path`), of which the fields that mean the same are taken: a bucket dataset
    (`repo_type: bucket`, repo_id `<ns>/<bucket>[/<path>]`), batch size, steps, seed, log and save intervals,
    workers, the policy's chunk, action steps, width and learning rate. Where it differs (its local `output_dir`,
    its device), give the flag.

    Example:
        ```python
        >>> read_train_config(Path("ckpt/pretrained_model/train_config.json"))
        {'datasets': ['hf://buckets/lab/cube'], 'batch_size': 64, 'steps': 3000, ...}
        ```

    Raises:
        BadValue: the file is not a mapping, or not YAML/JSON.
    """
    import yaml  # pyyaml: huggingface_hub's and lerobot's dependency (JSON is YAML)

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise BadValue(f"{path}: not YAML or JSON ({error})") from None
    if not isinstance(data, dict):
        raise BadValue(f"{path}: expected a mapping of options, got {type(data).__name__}")
    if isinstance(data.get("policy"), dict) or isinstance(data.get("dataset"), dict):
        return _from_lerobot(data)
    return data  # keys as the flags' or the fields' names: robotloop.options.config_values maps them


def _from_lerobot(cfg: dict[str, Any]) -> dict[str, Any]:
    dataset, policy, optimizer = (cfg.get(k) or {} for k in ("dataset", "policy", "optimizer"))
    out: dict[str, Any] = {}
    if dataset.get("repo_type") == "bucket" and dataset.get("repo_id"):
        out["datasets"] = [f"hf://buckets/{dataset['repo_id']}"]  # robotloop.train.train_config.lerobot_repo_id
    renames = {"batch_size": "batch_size", "steps": "steps", "seed": "seed", "log_freq": "log_every"}
    renames |= {"save_freq": "checkpoint_every", "num_workers": "decode_workers"}
    out |= {ours: cfg[theirs] for theirs, ours in renames.items() if cfg.get(theirs)}
    out |= {k: policy[k] for k in ("chunk_size", "n_action_steps", "dim_model") if policy.get(k)}
    lr = optimizer.get("lr") or policy.get("optimizer_lr")
    if lr:
        out["lr"] = lr
    return out


__all__ = ["Fp8Mode", "TrainOptions", "read_train_config", "to_argv"]
