"""The options of `robotloop loop`, written once: a preset's name and what the caller changes on top of it.

`robotloop loop`'s flags are derived from `LoopOptions` (`robotloop.options.typer_command`); a field left None
keeps the preset's value (`LoopSettings.preset`, where the `cpu` and `h200` values live). A new option is one
field here and one line in `LoopOptions.settings`.

Example:
    ```python
    >>> LoopOptions(preset="h200", task="insertion", steps=8000).settings().episodes  # the preset's, for Insertion
    100
    ```
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..cluster import check_address
from ..options import Flag
from ..sim.constants import check_shadow_map, parse_image_size
from ..storage import BucketUrl

Preset = Literal["cpu", "h200"]


class LoopOptions(BaseModel):
    """What a caller chooses about a run of the loop: the preset, then any of its values."""

    model_config = ConfigDict(extra="forbid")

    preset: Preset = Field(
        default="cpu",
        description="cpu (minutes on 2 cores) or h200 (the real result on one H200); the options below default to "
        "the preset's values.",
    )
    task: Annotated[str | None, Flag("--sim", ("--task",))] = Field(
        default=None, description="Sim task: transfer_cube or insertion."
    )
    episodes: int | None = Field(default=None, ge=1, le=100_000, description="Scripted demos to record.")
    image_size: str | None = Field(default=None, description="Camera HxW, e.g. 48x64 or 480x640.")
    steps: int | None = Field(default=None, ge=1, le=100_000_000, description="Training steps.")
    batch_size: int | None = Field(default=None, ge=1, le=65536, description="Training samples per step.")
    device: str | None = Field(default=None, description="auto, cpu, cuda or cuda:N (default: the preset's).")
    eval_episodes: int | None = Field(
        default=None, ge=1, le=100_000, description="Evaluation episodes of the released policy."
    )
    eval_max_steps: int | None = Field(
        default=None, ge=1, le=100_000, description="Steps per evaluation episode (default 400)."
    )
    workers: int | None = Field(default=None, ge=1, le=512, description="Sim workers for recording and evaluation.")
    train_after: int | None = Field(
        default=None, ge=1, description="Start training once this many demos are in; record the rest beside it."
    )
    live: bool = Field(
        default=False, description="Keep recording while training; promote checkpoints that beat stable."
    )
    bucket: str = Field(
        default="hf://buckets/local/loop", description="Bucket for the dataset, checkpoints and releases."
    )
    report_dir: Path = Field(default=Path("loop-report"), description="Where the report (Markdown, PNG, JSON) goes.")
    backbone_weights: Path | None = Field(
        default=None, description="Local torchvision resnet18 weights (default: random init)."
    )
    ray: str | None = Field(
        default=None,
        description=(
            "Record, evaluate and run the fleet's robots on Ray: auto, local or a cluster ADDRESS (robotloop[ray])."
        ),
    )
    shadow_map: int | None = Field(
        default=None,
        description="Side of the sim lights' shadow maps for everything the run films, 256-8192, or 0 for no shadows "
        "(about 2x faster on a CPU; default: gym-aloha's, 4096 at 480x640). Saved with the data and the policy, "
        "so evaluation renders the same.",
    )

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, value: str | None) -> str | None:
        parse_image_size(value)  # BadValue (a ValueError): the model reports it under --image-size
        return value

    @field_validator("shadow_map")
    @classmethod
    def _shadow_map(cls, value: int | None) -> int | None:
        return check_shadow_map(value)  # BadValue: reported under --shadow-map

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        BucketUrl.parse(value)
        return value

    @field_validator("ray")
    @classmethod
    def _ray(cls, value: str | None) -> str | None:
        return None if value is None else check_address(value)  # BadValue: reported under --ray

    @field_validator("report_dir")
    @classmethod
    def _report_dir(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError(f"{value} is a file; the report needs a folder")
        return value

    @field_validator("backbone_weights")
    @classmethod
    def _weights_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no weights file at {value}")
        return value

    def settings(self):
        """The run's `LoopSettings`: the preset's values, then every option given.

        Raises:
            BadValue: an unknown task, a device that is not there, a bad recipe.
        """
        from .pipeline import LoopSettings

        given: dict[str, Any] = {
            "task": self.task,
            "episodes": self.episodes,
            "image_size": parse_image_size(self.image_size),
            "steps": self.steps,
            "batch_size": self.batch_size,
            "device": self.device,
            "eval_episodes": self.eval_episodes,
            "eval_max_steps": self.eval_max_steps,
            "train_after": self.train_after,
            "record_workers": self.workers,
            "eval_workers": self.workers,
        }
        chosen = {k: v for k, v in given.items() if v is not None}
        return LoopSettings.preset(
            self.preset,
            live=self.live,
            bucket=self.bucket,
            report_dir=self.report_dir,
            backbone_weights=self.backbone_weights,
            ray=self.ray,
            shadow_map=self.shadow_map,
            **chosen,
        )
