"""What a training job runs: its `JobSpec` (every `robotloop train` option, the launcher, the storage), turned
into the child's command line and environment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, model_validator

from ...errors import BadValue
from ...options import to_argv
from ..options import TrainOptions


class JobSpec(TrainOptions):
    """What to train: every `robotloop train` option (`TrainOptions`), plus how the job runs and the storage it
    reads and writes."""

    # A job says where it runs: "auto" would pick a GPU on one service host and the CPU on another.
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d{1,2})?)$", description="cpu, cuda or cuda:N.")
    gpus: int = Field(default=1, ge=1, le=64, description="1: plain process; more: torchrun, one rank per GPU")
    storage_endpoint: str | None = Field(default=None, pattern=r"^https?://\S+$", description="default: the service's")
    storage_token: SecretStr | None = Field(default=None, description="default: the service's (with its endpoint only)")
    backbone_weights: str | None = Field(
        default=None,
        max_length=4096,
        description="A torchvision resnet18 weights file in the service's weights folder (trainer.weights_dir), by "
        "name; default none: random init.",
    )

    @model_validator(mode="after")
    def _gpus_need_cuda(self) -> JobSpec:
        if self.gpus > 1 and self.device != "cuda":
            raise BadValue(f"gpus={self.gpus} needs device 'cuda' (each rank takes its own GPU)")
        return self

    def with_storage(self, endpoint: str | None, token: str | None) -> JobSpec:
        """This spec with the service's storage filled in where the caller named none.

        The service's token goes only with the service's endpoint: a caller naming its own endpoint without a
        token must not receive the service's token there.
        """
        if self.storage_endpoint is not None:
            return self
        secret = self.storage_token or (SecretStr(token) if token else None)
        return self.model_copy(update={"storage_endpoint": endpoint, "storage_token": secret})

    def with_weights(self, folder: Path | None) -> JobSpec:
        """This spec with its backbone weights named by a caller resolved in the service's `folder`: a caller names
        a file there, never a path of the service's machine.

        Raises:
            BadValue: weights named but the service has no weights folder, a name that is a path, or no such file.
        """
        name = self.backbone_weights
        if name is None:
            return self
        if folder is None:
            raise BadValue("this training service has no weights folder (trainer.weights_dir): omit backbone_weights")
        if name != Path(name).name or name.startswith("."):
            raise BadValue(f"backbone_weights names a file of the service's weights folder, not a path: {name!r}")
        path = Path(folder) / name
        if not path.is_file():
            raise BadValue(f"no weights file {name!r} in the service's weights folder")
        return self.model_copy(update={"backbone_weights": str(path.resolve())})

    def public(self) -> dict[str, Any]:
        """The spec as JSON, without the token (what job.json and the API show)."""
        return {**self.model_dump(exclude={"storage_token"}), "storage_token_set": self.storage_token is not None}

    def command(self, progress_file: Path) -> list[str]:
        """The child's argv. Uses this interpreter (the service's venv), so `torchrun` needs no PATH entry."""
        launcher = [sys.executable]
        if self.gpus > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.gpus)]
        options = to_argv(self, TrainOptions.model_fields)  # every option, derived: none is forgotten here
        args = ["-m", "robotloop.train", *options, "--progress-file", str(progress_file)]
        if self.backbone_weights:  # resolved by `with_weights`
            args += ["--backbone-weights", self.backbone_weights]
        return launcher + args

    def child_env(self, base: dict[str, str], job_dir: Path) -> dict[str, str]:
        """The child's environment: `base` with this spec's storage endpoint and token (and no other token)."""
        env = {
            k: v
            for k, v in base.items()
            if k not in ("ROBOTLOOP_STORAGE__ENDPOINT", "ROBOTLOOP_STORAGE__TOKEN", "HF_TOKEN")
        }
        # Without a token of its own, the child must not fall back to a Hub login saved on this machine.
        env["HF_TOKEN_PATH"] = str(job_dir / "no-hf-token")
        env["PYTHONUNBUFFERED"] = "1"  # log lines reach log.txt as they happen
        if self.storage_endpoint:
            env["ROBOTLOOP_STORAGE__ENDPOINT"] = self.storage_endpoint
        if self.storage_token:
            env["ROBOTLOOP_STORAGE__TOKEN"] = self.storage_token.get_secret_value()
        return env
