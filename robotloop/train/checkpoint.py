"""Checkpoints in a bucket, in LeRobot's layout, plus lineage.

    <output>/checkpoints/<step:06d>/pretrained_model/   policy + processors (`save_pretrained`): what
                                                        `ACTPolicy.from_pretrained` and lerobot's tools load;
                                                        train_config.json: the run as lerobot-train's
                                                        TrainPipelineConfig (`robotloop.train.train_config`);
                                                        in the run's last checkpoint, its ONNX export
                                                        (policy.onnx, .onnx.data, .onnx.json: see
                                                        `export_onnx_beside`), which publish reuses
    <output>/checkpoints/<step:06d>/training_state/     optimizer, RNG and sampler state, step (safetensors/json)
    <output>/checkpoints/<step:06d>/lineage.json        episodes trained on (with Xet hashes), config, code version
    <output>/checkpoints/<step:06d>/loss.png            the loss curve so far
    <output>/checkpoints/last.json                      {"step": N}: written last, so it never names a partial one

No pickle anywhere: tensors go through safetensors (lerobot's own optimizer/RNG savers), the rest is JSON.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .. import __version__
from ..errors import Conflict
from ..storage import BucketClient, BucketUrl, NotFound
from .layout import checkpoint_url

log = logging.getLogger(__name__)


def save_checkpoint(
    client: BucketClient,
    output: BucketUrl,
    step: int,
    policy,
    optimizer: torch.optim.Optimizer,
    sampler_state: dict,
    lineage: dict,
    losses: list[tuple[int, float]],
    rank: int = 0,
    world: int = 1,
    train_config=None,
    export: Callable[[Path], dict] | None = None,
) -> BucketUrl:
    """Write checkpoint `step` to the bucket (model first, pointer last). Returns its URL. `train_config`: the
    run as lerobot's TrainPipelineConfig, saved beside the model's config.json as lerobot-train saves it.
    `export` (e.g. `export_onnx_beside`): called with the saved `pretrained_model` folder before anything is
    uploaded, so that what it writes there is in the checkpoint when the pointer names it; what it answers is
    lineage.json's ``onnx``.

    With several ranks, each writes its own sampler state; rank 0 writes the rest once every rank is done,
    and the pointer last.
    """
    from lerobot.optim.optimizers import save_optimizer_state
    from lerobot.utils.random_utils import save_rng_state

    url = checkpoint_url(output, step)
    if world > 1:
        with tempfile.TemporaryDirectory() as tmp:
            _save_sampler_state(sampler_state, Path(tmp), rank)
            client.upload(Path(tmp), url / "training_state")
        torch.distributed.barrier()
        if rank != 0:
            torch.distributed.barrier()  # wait for rank 0's pointer: the checkpoint is whole when this returns
            return url
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        policy.save_pretrained(root / "pretrained_model")
        if train_config is not None:
            train_config.save_pretrained(root / "pretrained_model")  # lerobot's own writer: train_config.json
        if export is not None:
            lineage = {**lineage, "onnx": export(root / "pretrained_model")}
        state = root / "training_state"
        state.mkdir()
        save_optimizer_state(optimizer, state, optim_state_dict=_without_kernel(_contiguous(optimizer.state_dict())))
        save_rng_state(state)
        if world == 1:
            _save_sampler_state(sampler_state, state, 0)
        # The loss history rides along, so a resumed run's plot and report cover the whole run.
        (state / "training_step.json").write_text(json.dumps({"step": step, "losses": losses}, default=_jsonable))
        (root / "lineage.json").write_text(json.dumps(lineage, indent=1, default=_jsonable))
        plot_losses(losses, root / "loss.png")
        client.upload(root, url)
    with tempfile.TemporaryDirectory() as tmp:
        pointer = Path(tmp) / "last.json"
        pointer.write_text(json.dumps({"step": step, "url": str(url)}))
        client.upload(pointer, output / "checkpoints" / "last.json")
    if world > 1:
        torch.distributed.barrier()
    return url


# What torch.onnx's exporter and the export's check need besides torch (the `onnx` extra's packages).
ONNX_EXPORT_MODULES = ("onnx", "onnxscript", "onnxruntime")


def onnx_exporter_installed() -> bool:
    """Whether this machine can export a policy to ONNX (`ONNX_EXPORT_MODULES` importable; none is imported)."""
    return all(importlib.util.find_spec(name) is not None for name in ONNX_EXPORT_MODULES)


def export_onnx_beside(model: Path) -> dict:
    """Export the policy saved in `model` (a ``pretrained_model`` folder) to ONNX, its three files beside the
    checkpoint's (`robotloop.deploy.onnx_export.export_onnx`, on the CPU, checked against torch), so that publish
    reuses the export instead of making it. Answers what lineage.json records of it: ``{"files", "seconds",
    "max_abs_diff"}``; or, for a policy that cannot be exported, ``{"error", "seconds"}``: the checkpoint is whole
    without an export (robots on torch run it; publish tries again and says why, naming the layer).

    Example:
        ```python
        >>> export_onnx_beside(Path("/tmp/ckpt/pretrained_model"))
        {'files': ['policy.onnx', 'policy.onnx.data', 'policy.onnx.json'], 'seconds': 9.8, 'max_abs_diff': 1.2e-07}
        ```

    Raises:
        Nothing for a policy that cannot be exported (see above): training's work is not lost to its export.
    """
    from ..deploy.errors import OnnxExportError, PolicyLoadError
    from ..deploy.onnx_export import export_onnx

    start = time.perf_counter()
    try:
        export = export_onnx(model)
    except (OnnxExportError, PolicyLoadError, ImportError) as error:
        why = f"{type(error).__name__}: {error}" if isinstance(error, ImportError) else str(error)
        log.warning("checkpoint saved without its ONNX export (publish will try again): %s", why)
        return {"error": why, "seconds": round(time.perf_counter() - start, 2)}
    return {"files": list(export.files), "seconds": round(export.seconds, 2), "max_abs_diff": export.max_abs_diff}


def load_checkpoint(
    client: BucketClient, output: BucketUrl, step: int, policy, optimizer: torch.optim.Optimizer, rank: int = 0
) -> tuple[dict, list[tuple[int, float]]]:
    """Load weights, optimizer and RNG state of checkpoint `step` into `policy`/`optimizer`; returns this
    rank's sampler state and the run's loss history so far. Weights load through safetensors only.

    Raises:
        ValueError: the checkpoint's model is not `policy`'s (another size, chunk or inputs): say which.
    """
    from lerobot.utils.random_utils import load_rng_state

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        client.fetch(checkpoint_url(output, step), root)
        _load_weights(root / "pretrained_model", policy, f"{output} step {step}", RESUME_HINT)
        _load_optimizer_state(optimizer, root / "training_state")
        _match_param_layouts(optimizer)
        load_rng_state(root / "training_state")
        saved = json.loads((root / "training_state" / "training_step.json").read_text())
        losses = [(int(s), float(v)) for s, v in saved.get("losses", [])]  # none in checkpoints of older versions
        return _load_sampler_state(root / "training_state", rank), losses


def init_weights(client: BucketClient, checkpoint: BucketUrl, policy) -> None:
    """Load the weights of `checkpoint` (a step folder) into `policy`: a new run starting from another's, with its
    own optimizer and step count. The normalization stays the new run's (its processors, from its data's stats).

    Raises:
        ModelMismatch (a ValueError): the checkpoint's model is not `policy`'s: say which options differ.
        robotloop.storage.NotFound: the checkpoint has no model.
    """
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp)
        for name in ("config.json", "model.safetensors"):
            client.download(checkpoint / "pretrained_model" / name, model / name)
        _load_weights(model, policy, str(checkpoint), INIT_HINT)


def trained_stats(client: BucketClient, checkpoint: BucketUrl) -> dict[str, dict[str, list]]:
    """The normalization stats `checkpoint`'s policy was trained with (its preprocessor's normalizer), in dataset
    stats form (feature -> {"mean", "std", "min", "max", ...} as lists); `{}`, said in the log, for a checkpoint
    that saved none (one of another tool, with its weights only)."""
    from safetensors.numpy import load_file

    model = checkpoint / "pretrained_model"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            pipeline = client.download(model / "policy_preprocessor.json", Path(tmp) / "pipeline.json")
        except NotFound:
            pipeline = None
        steps = json.loads(pipeline.read_text())["steps"] if pipeline else []
        files = [s.get("state_file") for s in steps if s.get("registry_name") == "normalizer_processor"]
        if not files or not files[0]:
            log.warning("%s saved no normalization stats: the run normalizes with its data's", checkpoint)
            return {}
        flat = load_file(client.download(model / files[0], Path(tmp) / "normalizer.safetensors"))
    stats: dict[str, dict[str, list]] = {}
    for name, value in flat.items():  # "observation.images.top.mean": the feature, then the statistic
        feature, statistic = name.rsplit(".", 1)
        stats.setdefault(feature, {})[statistic] = value.tolist()
    return stats


def read_lineage(client: BucketClient, checkpoint: BucketUrl) -> dict:
    """A checkpoint's lineage.json (`{}` when it has none: a checkpoint of another tool)."""
    try:
        entry = client.stat(checkpoint / "lineage.json")
    except NotFound:
        return {}
    return json.loads(client.read_range(entry.url, 0, entry.size))


def _load_weights(model: Path, policy, where: str, hint: str) -> None:
    """The weights of the `pretrained_model` folder `model` into `policy`, through safetensors only.

    Raises:
        ModelMismatch: `model` was trained with another model than `policy` (`where` and `hint` say so).
    """
    _check_same_model(json.loads((model / "config.json").read_text()), policy, where, hint)
    weights = load_file(model / "model.safetensors", device=str(policy.device))
    # Saved without BatchNorm2d's num_batches_tracked (lerobot's frozen ACT has none): the counter stays ours.
    own = policy.policy.state_dict()
    weights |= {k: v for k, v in own.items() if k.endswith("num_batches_tracked") and k not in weights}
    policy.policy.load_state_dict(weights)


RESUME_HINT = (
    "Resume with the run's own model options (e.g. --tiny if it was trained with it), or train into a new output"
)
INIT_HINT = "Give the model options it was trained with (e.g. --tiny, --chunk-size), or start without --init-from"

# What makes two ACT models different models: a checkpoint of one cannot be resumed as the other.
ARCHITECTURE = (
    "dim_model",
    "n_heads",
    "dim_feedforward",
    "n_encoder_layers",
    "n_decoder_layers",
    "n_vae_encoder_layers",
    "latent_dim",
    "use_vae",
    "chunk_size",
    "vision_backbone",
)


class ModelMismatch(Conflict, ValueError):
    """The checkpoint a run resumes (or starts) from was trained with another model; the message names what
    differs."""


def _check_same_model(saved: dict, policy, where: str, hint: str) -> None:
    ours = policy.policy.config
    wanted = {name: getattr(ours, name) for name in ARCHITECTURE} | {
        "inputs": {k: list(v.shape) for k, v in ours.input_features.items()}
    }
    have = {name: saved.get(name) for name in ARCHITECTURE} | {
        "inputs": {k: list(v["shape"]) for k, v in saved.get("input_features", {}).items()}
    }
    differ = [f"{k} {have[k]} (asked: {wanted[k]})" for k in wanted if have[k] != wanted[k]]
    if differ:
        raise ModelMismatch(f"{where} was trained with another model: {', '.join(differ)}. {hint}")


def _contiguous(state_dict: dict) -> dict:
    """The optimizer state with contiguous tensors: safetensors refuses strided ones, and a channels_last
    convolution's Adam moments are channels_last like its weight."""
    state = {
        i: {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for i, s in state_dict["state"].items()
    }
    return {**state_dict, "state": state}


def _without_kernel(state_dict: dict) -> dict:
    """The optimizer state with each param group's kernel choice (`fused`) left unsaid, as lerobot-train's AdamW
    has it: lerobot's loader wants the saved groups' values of the very types its optimizer's have, so a
    `fused: true` (our CUDA kernel) stops `lerobot-train --resume` on our checkpoint."""
    return {**state_dict, "param_groups": [{**g, "fused": None} for g in state_dict["param_groups"]]}


def _load_optimizer_state(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """lerobot's `load_optimizer_state`, keeping our optimizer's kernel choice whatever the file says (None since
    `_without_kernel`; older checkpoints saved ours)."""
    from lerobot.optim.optimizers import load_optimizer_state
    from lerobot.utils.constants import OPTIMIZER_PARAM_GROUPS

    saved = json.loads((directory / OPTIMIZER_PARAM_GROUPS).read_text())
    ours = [g.get("fused") for g in optimizer.param_groups]
    for group, from_file in zip(optimizer.param_groups, saved, strict=False):  # lerobot checks the count
        group["fused"] = from_file.get("fused")
    load_optimizer_state(optimizer, directory)
    for group, fused in zip(optimizer.param_groups, ours, strict=False):
        group["fused"] = fused


def _match_param_layouts(optimizer: torch.optim.Optimizer) -> None:
    """Give each loaded moment its parameter's memory layout again (fused AdamW steps them together)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.shape == p.shape and v.stride() != p.stride():
                    optimizer.state[p][k] = torch.empty_like(p, dtype=v.dtype).copy_(v)


def _save_sampler_state(state: dict, directory: Path, rank: int) -> None:
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    save_file({k: v.cpu() for k, v in tensors.items()}, directory / f"sampler_state_rank{rank}.safetensors")
    rest = {k: v for k, v in state.items() if k not in tensors}
    (directory / f"sampler_state_rank{rank}.json").write_text(json.dumps(rest))


def _load_sampler_state(directory: Path, rank: int) -> dict:
    state: dict[str, Any] = json.loads((directory / f"sampler_state_rank{rank}.json").read_text())
    state.update(load_file(directory / f"sampler_state_rank{rank}.safetensors"))
    return state


def code_version() -> dict:
    """robotloop's version and, when run from a git checkout, its commit (and whether it had local changes)."""
    here = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {"robotloop": __version__, "git_commit": commit or None, "git_dirty": dirty, "torch": torch.__version__}


def plot_losses(losses: list[tuple[int, float]], path: Path) -> None:
    # A bare Figure, not pyplot: no global backend switch (a notebook's inline plots keep working), no display.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.subplots()
    if losses:
        steps, values = zip(*losses, strict=True)
        ax.plot(steps, values)
    ax.set(
        xlabel="step", ylabel="training loss", yscale="log" if losses and min(v for _, v in losses) > 0 else "linear"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    return str(value)
