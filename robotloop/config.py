"""One settings model for the CLI, the services and the agent tools.

Sources, lowest priority first: defaults, `robotloop.toml` (or the file named by `ROBOTLOOP_CONFIG`),
environment variables `ROBOTLOOP_<SECTION>__<FIELD>`, then explicit overrides (CLI flags).

Example:
    ```python
    >>> from robotloop.config import load_settings
    >>> settings = load_settings({"storage": {"endpoint": "http://127.0.0.1:8750"}})
    >>> settings.storage.endpoint
    'http://127.0.0.1:8750'
    ```
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

# The one place the default ports are written.
from services.ports import CAPTURE_PORT, DEPLOY_PORT, TRAINER_PORT, UI_PORT

from .errors import BadInput, BadValue

# The choices of two settings, named once: the settings fields below and the library (`robotloop.deploy.policy`,
# `robotloop.deploy.publish`) take them from here.
Backend = Literal["auto", "onnx", "onnx-int8", "torch"]
OnnxMode = Literal["required", "optional", "off"]


def cache_home() -> Path:
    """robotloop's cache folder: ``$XDG_CACHE_HOME/robotloop``, else ``~/.cache/robotloop``.

    Read at each call, not at import, so that a variable set later (by a test, a notebook) counts.

    Example:
        ```python
        >>> os.environ["XDG_CACHE_HOME"] = "/tmp/c"
        >>> cache_home()
        PosixPath('/tmp/c/robotloop')
        ```
    """
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "robotloop"


def in_cache(*parts: str) -> Callable[[], Path]:
    """A settings default under `cache_home()`, found when the settings are made (a pydantic `default_factory`)."""
    return lambda: cache_home().joinpath(*parts)


class Section(BaseModel):
    """A settings section: unknown keys are errors, so a typo in robotloop.toml is caught early."""

    model_config = ConfigDict(extra="forbid")


class StorageSettings(Section):
    """Where buckets live and how robotloop reaches them."""

    endpoint: str | None = Field(
        default=None,
        description="Hub-compatible endpoint (the public Hub or a robotloop bucket server). "
        "Unset: HF_ENDPOINT if set, else the embedded bucket server on localhost.",
    )
    token: SecretStr | None = Field(
        default=None, description="Access token. Unset: HF_TOKEN / the saved Hub login, or the embedded server's own."
    )
    cache_dir: Path = Field(default_factory=in_cache("read-cache"), description="Local read cache, keyed by Xet hash.")
    cache_max_bytes: int = Field(default=20 * 2**30, ge=0, description="Bound of the read cache in bytes.")
    embedded_root: Path = Field(default_factory=in_cache("buckets"), description="Data root of the embedded server.")
    embedded_port: int = Field(
        default=0, ge=0, le=65535, description="Port of the embedded server; 0 picks a free one."
    )


class CaptureSettings(Section):
    """The capture service: robots stream frames over HTTP, the service commits episodes to buckets."""

    host: str = Field(default="127.0.0.1", description="Address the capture service listens on.")
    port: int = Field(default=CAPTURE_PORT, ge=1, le=65535, description="Port of the capture service.")
    tokens_file: Path | None = Field(
        default=None, description="Robot tokens, one '<token> <read|write> <namespace|*>' per line (required to serve)."
    )
    max_body_bytes: int = Field(
        default=64 * 2**20, ge=1024, description="Largest request body; larger is refused (413)."
    )
    max_episode_frames: int = Field(
        default=50 * 60 * 10, ge=1, description="Frames one episode may hold (10 min at 50 Hz)."
    )
    max_episode_bytes: int = Field(
        default=2 * 2**30, ge=1, description="Image bytes one open episode may hold in memory."
    )
    max_open_per_robot: int = Field(default=4, ge=1, description="Episodes one robot may have open at once.")
    idle_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds an open episode may go without a request before it is dropped, uncommitted (its robot "
        "vanished); a request body that stops arriving this long is answered 408.",
    )
    vcodec: str = Field(default="libsvtav1", description="Video codec of the datasets it writes (h264: faster on CPU).")


class ServiceSection(Section):
    """A service's section: where it listens (`host`, `port`) and where callers reach it (`url`)."""

    host: str = Field(default="127.0.0.1", description="Address the service listens on.")
    port: int = Field(ge=1, le=65535, description="Port of the service (each service has its own default).")
    url: str | None = Field(
        default=None,
        description="Where callers reach the service. Unset: http://host:port "
        "(127.0.0.1 when it listens on every address).",
    )

    @property
    def client_url(self) -> str:
        """`url`, or the address this machine reaches the service on from `host` and `port`."""
        if self.url:
            return self.url
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


class TrainerServiceSettings(ServiceSection):
    """The training service: jobs are `robotloop train` subprocesses, submitted and watched over HTTP."""

    port: int = Field(default=TRAINER_PORT, ge=1, le=65535, description="Port of the training service.")
    tokens_file: Path | None = Field(
        default=None,
        description="Caller tokens, one '<token> <read|write> <namespace|*>' per line (required to serve).",
    )
    root: Path = Field(
        default_factory=in_cache("train-jobs"), description="Job directories: spec, log, progress, exit code."
    )
    max_running: int = Field(default=1, ge=1, description="Jobs run at once; later ones wait as 'queued'.")
    weights_dir: Path | None = Field(
        default=None,
        description="Backbone weights files (torchvision resnet18 state_dicts) that a job may name "
        "(JobSpec.backbone_weights).",
    )
    max_queued: int = Field(default=32, ge=1, description="Jobs that may wait at once; more are refused (429).")
    cancel_grace_s: float = Field(
        default=120.0, gt=0, description="After cancel's SIGTERM, how long a job may take to checkpoint before SIGKILL."
    )
    token: SecretStr | None = Field(
        default=None, description="Caller token used by `robotloop trainer watch` and the agent."
    )


class DeploySettings(ServiceSection):
    """The deploy service and publishing: releases, channels, robots and their assignments."""

    port: int = Field(default=DEPLOY_PORT, ge=1, le=65535, description="Port of the deploy service.")
    tokens_file: Path | None = Field(
        default=None, description="Operator tokens, one '<token> <read|write> *' per line (required to serve)."
    )
    token: SecretStr | None = Field(default=None, description="Operator token used by `robotloop deploy` commands.")
    db: Path = Field(default_factory=in_cache("deploy", "deploy.sqlite"), description="The service's SQLite state.")
    database: str | None = Field(
        default=None,
        description="The service's state in PostgreSQL instead (postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME), "
        "shared by every replica given it. None: SQLite, `db`.",
    )
    key_file: Path = Field(
        default_factory=in_cache("deploy", "deploy.key"), description="Private ed25519 key that signs releases."
    )
    trusted_keys: list[Path] = Field(
        default_factory=list,
        description="The service accepts only releases signed by these keys (robots verify "
        "against their own trusted keys regardless). Without any, the service does not start unless allow_any_signer.",
    )
    allow_any_signer: bool = Field(
        default=False,
        description="Register releases signed by any key when no trusted_keys are given (say it: "
        "operators then see releases listed that robots may refuse).",
    )
    # required by default: a release is what robots without torch run too, so a policy that cannot be exported is
    # found at publish, by the person who can fix it, not by a robot that has nothing to run. optional is the way out
    # when that person decides torch robots are enough for this one.
    onnx: OnnxMode = Field(
        default="required",
        description="ONNX export in the release (the checkpoint's own when current, else made at publish): required (a "
        "policy that cannot be exported is an error naming the layer, and nothing is published), optional (it is "
        "then released without ONNX, and publish says why) or off.",
    )
    # Opt-in: its actions are ~1e-3 from fp32's; a team turns it on once `robotloop eval --backend onnx-int8` says
    # their policy keeps its success with it.
    onnx_int8: bool = Field(
        default=False,
        description="Also the ONNX export's int8 graph in the release (MatMul and Gemm weights in int8; the "
        "convolutions too, calibrated on the training data the checkpoint's lineage names), for robot CPUs too "
        "slow for fp32: robots run it with robot.backend onnx-int8.",
    )


class UiSettings(ServiceSection):
    """The dashboard (`robotloop ui`): web pages over the deploy, training and bucket services."""

    port: int = Field(default=UI_PORT, ge=1, le=65535, description="Port of the dashboard.")
    tokens_file: Path | None = Field(
        default=None, description="Viewer tokens, one '<token> <read|write> *' per line (required to serve)."
    )
    reports: list[Path] = Field(
        default_factory=list,
        description="Folders searched for loop reports (report.md) and evaluations (eval_report.json) to show, "
        "beside those uploaded next to the runs in their buckets.",
    )
    namespaces: list[str] = Field(
        default_factory=list, description="Bucket namespaces whose buckets the datasets page lists."
    )


def acting_overrides(temporal_ensemble: str | None = None, action_steps: int | None = None) -> dict[str, Any] | None:
    """How a saved ACT policy acts, overriding its config (`load_policy`'s `inference`), from lerobot-eval's two
    knobs (`--policy.temporal_ensemble_coeff`, `--policy.n_action_steps`): `temporal_ensemble` "off" or ACT's
    coefficient (a model pass every step; above 0 the older predictions of an action weigh more, below 0 the newer
    ones, 0 all alike), `action_steps` the actions executed from each predicted chunk. Given alone, `action_steps`
    above 1 turns ensembling off, and a coefficient sets one action a step; what is not given stays as saved (None:
    all of it).

    Example:
        ```python
        >>> acting_overrides("0.01")
        {'temporal_ensemble_coeff': 0.01, 'n_action_steps': 1}
        >>> acting_overrides(action_steps=25)
        {'n_action_steps': 25, 'temporal_ensemble_coeff': None}
        ```

    Raises:
        BadValue: `temporal_ensemble` is neither "off" nor a finite number, `action_steps` is below 1, or ensembling
            is asked with more than one action a step.
    """
    if temporal_ensemble is None and action_steps is None:
        return None
    if action_steps is not None and action_steps < 1:
        raise BadValue(f"action steps: at least 1, not {action_steps}")
    acting: dict[str, Any] = {}
    if temporal_ensemble is not None:
        acting["temporal_ensemble_coeff"] = _coefficient(temporal_ensemble)
    if action_steps is not None:
        acting["n_action_steps"] = action_steps
    if acting.get("temporal_ensemble_coeff") is not None:
        if acting.setdefault("n_action_steps", 1) != 1:
            raise BadValue(f"temporal ensembling acts one step per model pass: not {action_steps} action steps")
    elif (action_steps or 1) > 1:  # more than one action a step: no ensembling, whatever was saved
        acting["temporal_ensemble_coeff"] = None
    return acting


def _coefficient(text: str) -> float | None:
    try:
        coeff = None if text == "off" else float(text)
    except ValueError:
        coeff = math.nan
    if coeff is not None and not math.isfinite(coeff):
        raise BadValue(f"temporal ensemble {text!r}: 'off' or a coefficient, e.g. 0.01")
    return coeff


class RobotSettings(Section):
    """The robot runtime: where releases come from, which keys it trusts, how it judges a new release."""

    robot_id: str | None = Field(default=None, description="This robot's id, as registered with the deploy service.")
    token: SecretStr | None = Field(default=None, description="This robot's deploy token (issued at registration).")
    trusted_keys: list[Path] = Field(default_factory=list, description="Public key files of trusted release signers.")
    store_dir: Path = Field(
        default_factory=in_cache("robot"), description="Local release store (verified releases, staging)."
    )
    device: str = Field(
        default="auto",
        description="Where the policy runs: auto (the machine's accelerator when it has one: ONNX Runtime's TensorRT "
        "or CUDA provider, torch's CUDA; else the CPU), cpu, cuda, cuda:N, or tensorrt (ONNX Runtime's TensorRT "
        "provider; a torch policy runs on the same GPU).",
    )
    # A robot computer may have torch, onnxruntime or both: the release carries both formats (publish exports ONNX),
    # and each robot runs what it can, the fast portable one first.
    backend: Backend = Field(
        default="auto",
        description="What runs a release's policy: auto (its ONNX export on ONNX Runtime where the release has one "
        "and onnxruntime here runs on robot.device, else torch), onnx (ONNX only: a release without an export, or a "
        "robot without onnxruntime, is refused with the reason), onnx-int8 (the export's int8 graph, for a CPU too "
        "slow for fp32: releases published with --onnx-int8 only) or torch (the checkpoint through lerobot).",
    )
    temporal_ensemble: str | None = Field(
        default=None,
        description="How each release's policy acts, over its saved config: ACT's temporal ensembling off, or its "
        "coefficient (a model pass every step). Unset: as saved. lerobot's policy.temporal_ensemble_coeff.",
    )
    action_steps: int | None = Field(
        default=None,
        ge=1,
        description="Actions executed from each predicted chunk (above 1 turns ensembling off). Unset: as saved. "
        "lerobot's policy.n_action_steps.",
    )
    poll_wait_s: float = Field(default=30.0, gt=0, le=60, description="Long-poll length for assignment changes.")
    heartbeat_s: float = Field(default=2.0, gt=0, description="Seconds between heartbeats.")
    health_window: int = Field(
        default=5, ge=1, description="Episodes of a new release judged against the previous one."
    )
    health_margin: float = Field(
        default=0.0,
        ge=0,
        description="Roll back when the new release's mean episode score is below the previous "
        "release's by more than this.",
    )
    keep_releases: int = Field(
        default=3, ge=2, description="Releases kept on disk (the running and previous never pruned)."
    )
    # What the robot did, recorded for the next release to learn from (robotloop.fleet): its failures above all.
    record: Literal["off", "failures", "all"] = Field(
        default="off",
        description="Episodes to record into the fleet dataset: off, failures (not successful; without a reward, "
        "those the expert took over) or all.",
    )
    record_sample: float = Field(default=1.0, gt=0, le=1, description="Share of episodes recorded, chosen at random.")
    record_to: str | None = Field(
        default=None, description="Fleet dataset URL, hf://buckets/<ns>/<bucket>/datasets/<name> (needed to record)."
    )
    record_via: str | None = Field(
        default=None,
        description="A capture service's URL: the robot sends its recorded episodes there and the service writes the "
        "fleet dataset (how a slim 'robotloop[robot]' install, without lerobot, records). Unset: the robot writes it.",
    )
    record_token: SecretStr | None = Field(
        default=None, description="This robot's token on the capture service (its tokens file), with record_via."
    )
    record_queue_frames: int = Field(
        default=1000,
        ge=1,
        description="Frames the control loop may queue for the recorder; past that the episode is dropped, never a "
        "tick.",
    )

    @model_validator(mode="after")
    def _acting_is_one_lerobot_takes(self) -> RobotSettings:
        self.acting()  # BadValue (a ValueError): pydantic names the settings
        return self

    def acting(self) -> dict[str, Any] | None:
        """`temporal_ensemble` and `action_steps` as the overrides a policy is loaded with (`acting_overrides`)."""
        return acting_overrides(self.temporal_ensemble, self.action_steps)


class AgentSettings(Section):
    """`robotloop agent`: which model drives the tools. Bedrock by default; any OpenAI-compatible or Ollama endpoint."""

    provider: Literal["bedrock", "openai", "ollama"] = Field(default="bedrock", description="Model provider.")
    model_id: str | None = Field(
        default=None,
        description="Model id (Bedrock model or inference profile, OpenAI/Ollama model name). "
        "Unset: strands' Bedrock default; required for openai and ollama.",
    )
    base_url: str | None = Field(
        default=None,
        description="openai: an OpenAI-compatible endpoint (vLLM, llama.cpp, LM Studio: "
        "http://127.0.0.1:8000/v1); ollama: the server (default http://127.0.0.1:11434); bedrock: a custom endpoint.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="openai: the endpoint's API key (unset: "
        "OPENAI_API_KEY); bedrock: a Bedrock API key instead of AWS credentials.",
    )
    region: str | None = Field(
        default=None, description="bedrock: AWS region (unset: the AWS profile's, else us-west-2)."
    )
    max_tokens: int = Field(default=4096, ge=1, description="Most tokens the model may write per turn.")
    temperature: float | None = Field(default=None, ge=0, description="Sampling temperature (unset: the provider's).")


class Settings(BaseSettings):
    """All of robotloop's settings. Sections are added by the layers that use them."""

    model_config = SettingsConfigDict(env_prefix="ROBOTLOOP_", env_nested_delimiter="__", extra="forbid")

    storage: StorageSettings = Field(default_factory=StorageSettings)
    capture: CaptureSettings = Field(default_factory=CaptureSettings)
    trainer: TrainerServiceSettings = Field(default_factory=TrainerServiceSettings)
    deploy: DeploySettings = Field(default_factory=DeploySettings)
    robot: RobotSettings = Field(default_factory=RobotSettings)
    ui: UiSettings = Field(default_factory=UiSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = Path(os.environ.get("ROBOTLOOP_CONFIG", "robotloop.toml"))
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=toml_file)


class SettingsError(BadInput, ValueError):
    """The settings cannot be read: a malformed config file, an unknown key, a value of the wrong type."""


def load_settings(overrides: dict[str, Any] | None = None) -> Settings:
    """Build the settings from every source, with `overrides` (e.g. CLI flags) on top.

    `None` values in `overrides` are dropped, so an unset CLI flag never hides a file or env value.

    Example:
        ```python
        >>> load_settings({"storage": {"endpoint": "http://127.0.0.1:8750"}}).storage.endpoint
        'http://127.0.0.1:8750'
        ```

    Raises:
        SettingsError: ROBOTLOOP_CONFIG names a missing file, the config file is not valid TOML, or a value
            (from any source) has the wrong type or an unknown key; the message names each one.
    """
    config = os.environ.get("ROBOTLOOP_CONFIG")
    if config and not Path(config).exists():  # /dev/null: no file settings at all
        raise SettingsError(f"ROBOTLOOP_CONFIG={config}: no such file")
    where = f"{config or 'robotloop.toml'}, ROBOTLOOP_* variables or options"
    try:
        return Settings(**_drop_none(overrides or {}))
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"{config or 'robotloop.toml'}: not valid TOML: {error}") from None
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {'unknown setting' if e['type'] == 'extra_forbidden' else e['msg']}"
            for e in error.errors()
        )
        raise SettingsError(f"bad settings ({where}): {problems}") from None


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    cleaned = {}
    for key, value in values.items():
        if isinstance(value, dict):
            value = _drop_none(value)
            if not value:
                continue
        if value is not None:
            cleaned[key] = value
    return cleaned
