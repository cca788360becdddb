"""The ACT model step: lerobot 0.6.1's `ACTPolicy`, made fast for one GPU.

`build_policy(features, stats, settings, device)` returns a `TrainablePolicy` that wraps an unmodified
lerobot `ACTPolicy` (same module tree, same state_dict keys, so `ACTPolicy.from_pretrained` loads what we
save) plus lerobot's own pre/post processors (saved next to the weights, as `lerobot-train` does).

Speed options compose (torchtitan style), each a flag in `ACTSettings`:
- precision="bf16": autocast the forward to bfloat16; parameters, gradients and AdamW state stay fp32.
- fused_attention: nn.MultiheadAttention with need_weights=False, which takes PyTorch's SDPA path.
- channels_last: the ResNet backbone and its input images in NHWC, which cuDNN's fast convs want.
- compile: torch.compile of normalization + forward + loss (backward is compiled by AOTAutograd).
- cuda_graphs: mode "reduce-overhead": forward and backward replay as CUDA graphs (needs compile).
- fp8: TorchAO float8 training of the linear layers ("tensorwise", "rowwise", "rowwise_with_gw_hp", or "auto":
  only the shapes measured faster than bf16); see robotloop.train.fp8. Needs precision="bf16".
The optimizer is AdamW(fused=True) on CUDA with lerobot's param groups and grad clip 10 (its preset).
It runs eagerly after the graphed backward: fused AdamW plus foreach clipping is a handful of kernels,
while the forward/backward is hundreds, so graphing fwd+bwd removes nearly all launch overhead.

No host syncs inside `train_step`: normalization uses device tensors computed once at build time,
the loss is computed here (lerobot's `ACTPolicy.forward` calls `.item()` twice for its logging dict),
and clip_grad_norm_ / fused AdamW never read values back to the host.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F  # noqa: N812
from lerobot.configs import FeatureType, NormalizationMode, PolicyFeature
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
from lerobot.processor import ImageCropResizeProcessorStep, NormalizerProcessorStep, PolicyProcessorPipeline
from lerobot.utils.constants import ACTION, IMAGENET_STATS, OBS_IMAGES, OBS_STATE
from lerobot.utils.feature_utils import dataset_to_policy_features
from torch import Tensor, nn

from ..capture.recorder import camera_shadow_map
from ..compat import normalizer_tensor_stats
from ..errors import BadValue
from .fp8 import Accelerator, AutoFp8, Measure, ShapeTiming, StepTimer, convert_linears, gpu_measure, setup_fp8
from .fp8 import check_mode as check_fp8_mode
from .fp8_auto import Fp8AutoJob, decide_fp8_auto_in_child

log = logging.getLogger(__name__)

ACTION_IS_PAD = "action_is_pad"
INPUTS_FILE = "robotloop_inputs.json"  # beside config.json: the camera sizes the policy's inputs are resized from
GRAD_CLIP_NORM = 10.0  # lerobot's AdamWConfig.grad_clip_norm, which ACT's optimizer preset uses


# The one small ACT (dim 64, one encoder layer; the ResNet18 backbone stays): `robotloop train --tiny`, the loop's
# cpu preset, deploy's make_tiny_checkpoint, the benchmarks' quick modes and the tests. Chunks of 10 actions fit
# the 30-frame episodes the tests record. A caller that needs another horizon overrides chunk_size/n_action_steps.
TINY_ACT: dict[str, Any] = dict(
    dim_model=64,
    dim_feedforward=128,
    n_heads=4,
    n_encoder_layers=1,
    n_vae_encoder_layers=1,
    chunk_size=10,
    n_action_steps=10,
)


@dataclass
class ACTSettings:
    """ACT architecture and training knobs. Defaults are lerobot 0.6.1's ACTConfig defaults (51.6M params)
    and plain fp32 eager execution; each speed option can be switched on independently."""

    # Architecture (lerobot's ACTConfig names and defaults).
    chunk_size: int = 100
    n_action_steps: int = 100
    dim_model: int = 512
    n_heads: int = 8
    dim_feedforward: int = 3200
    n_encoder_layers: int = 4
    n_decoder_layers: int = 1  # lerobot's default (the original ACT's 7 only ever used its first layer)
    n_vae_encoder_layers: int = 4
    latent_dim: int = 32
    use_vae: bool = True
    kl_weight: float = 10.0
    dropout: float = 0.1
    vision_backbone: str = "resnet18"
    # The policy's own camera input (height, width): camera frames are resized to it (lerobot's
    # ImageCropResizeProcessorStep, saved in the preprocessor, so lerobot's own tools resize too). None: the
    # camera's size. A 480x640 camera seen at 240x320 trains ~4x faster and loses little for ALOHA's tasks.
    image_size: tuple[int, int] | None = None
    # Inference: ACT's temporal ensembling (the paper's 0.01; needs n_action_steps=1): the model runs every step
    # and averages every chunk's prediction for it. Saved in config.json, so lerobot-eval uses it too.
    temporal_ensemble_coeff: float | None = None
    # Optimizer (lerobot's ACT preset: AdamW, backbone in its own param group).
    lr: float = 1e-5
    lr_backbone: float = 1e-5
    weight_decay: float = 1e-4
    grad_clip_norm: float = GRAD_CLIP_NORM
    # Learning-rate schedule over the run: linear warm-up, then constant or cosine decay to `lr_min_ratio` x lr.
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    lr_min_ratio: float = 0.0
    # "frozen": lerobot's FrozenBatchNorm2d (right for ImageNet weights; with random init it is the identity, so
    # the backbone trains with no normalization at all). "batch": BatchNorm2d that learns its statistics; saved
    # under the same keys, so lerobot's frozen ACT loads it as exactly the trained network in eval mode.
    backbone_norm: Literal["frozen", "batch"] = "frozen"
    # Augmentation (training only): shift each image by up to this many pixels (edge padded), DrQ's random shift.
    random_shift: int = 0
    # A local torchvision resnet18 state_dict file. None = random init: nothing is ever downloaded.
    backbone_weights: Path | None = None
    # lerobot-train replaces camera stats with ImageNet mean/std (DatasetConfig.use_imagenet_stats=True).
    use_imagenet_stats: bool = True
    # Speed options.
    precision: Literal["bf16", "fp32"] = "fp32"
    fused_attention: bool = False
    channels_last: bool = False
    compile: bool = False
    cuda_graphs: bool = False
    autotune: bool = False  # compile with max-autotune (long compile; GEMM/conv template search)
    fp8: str = "off"  # "off", "auto", or a TorchAO recipe: "tensorwise", "rowwise", "rowwise_with_gw_hp"

    def __post_init__(self) -> None:
        if self.precision not in ("bf16", "fp32"):
            raise BadValue(f"precision must be 'bf16' or 'fp32', got {self.precision!r}")
        if (self.cuda_graphs or self.autotune) and not self.compile:
            raise BadValue("cuda_graphs and autotune are torch.compile modes: set compile=True too")
        check_fp8_mode(self.fp8)
        if self.fp8 != "off" and self.precision != "bf16":
            # FP8 recipes are measured and tuned against bf16 autocast for everything they do not convert.
            raise BadValue(f"fp8={self.fp8!r} needs precision='bf16'")
        if self.backbone_weights is not None:
            self.backbone_weights = Path(self.backbone_weights)
        if self.image_size is not None:
            self.image_size = _positive_size(self.image_size)
        if self.lr_schedule not in ("constant", "cosine") or self.backbone_norm not in ("frozen", "batch"):
            raise BadValue(
                f"lr_schedule must be constant or cosine and backbone_norm frozen or batch, got "
                f"{self.lr_schedule!r}, {self.backbone_norm!r}"
            )
        if self.warmup_steps < 0 or not 0 <= self.lr_min_ratio <= 1 or self.random_shift < 0:
            raise BadValue("warmup_steps and random_shift must be >= 0 and lr_min_ratio in [0, 1]")
        if self.temporal_ensemble_coeff is not None and self.n_action_steps != 1:
            raise BadValue("temporal ensembling runs the model every step: set n_action_steps=1 with it")
        if not 1 <= self.n_action_steps <= self.chunk_size:  # lerobot refuses it too, but only once data streamed
            raise BadValue(f"n_action_steps {self.n_action_steps} must be within the chunk, 1..{self.chunk_size}")

    def lr_factor(self, step: int, total: int) -> float:
        """The schedule's multiplier of `lr` and `lr_backbone` for optimizer step `step` (0-based) of `total`.

        Example:
            ```python
            >>> ACTSettings(lr_schedule="cosine", warmup_steps=10).lr_factor(5, 100)
            0.6
            ```
        """
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.lr_schedule == "constant":
            return 1.0
        span = max(1, total - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.lr_min_ratio + (1 - self.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    @classmethod
    def fast(cls, **overrides: Any) -> ACTSettings:
        """All speed options on (what the trainer uses on a GPU)."""
        opts: dict[str, Any] = dict(
            precision="bf16", fused_attention=True, channels_last=True, compile=True, cuda_graphs=True
        )
        return cls(**{**opts, **overrides})

    @property
    def compile_mode(self) -> str:
        """torch.compile mode for these options."""
        return {
            (False, False): "default",
            (True, False): "reduce-overhead",
            (False, True): "max-autotune-no-cudagraphs",
            (True, True): "max-autotune",
        }[(self.cuda_graphs, self.autotune)]


def _positive_size(size: tuple[int, int]) -> tuple[int, int]:
    h, w = (int(v) for v in size)
    if h < 1 or w < 1:
        raise BadValue(f"image_size must be two positive sizes (height, width), got {size}")
    return h, w


class FusedMultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention that never returns attention weights.

    Why: lerobot's ACT layers call `self_attn(q, k, value=x)` and take `[0]`, but the default
    need_weights=True makes F.multi_head_attention_forward materialise softmax(QK^T) per head and
    average it (bmm + softmax + dropout + bmm + mean, several extra kernels and an O(L^2) tensor
    saved for backward). With need_weights=False it calls scaled_dot_product_attention, i.e. the
    flash / memory-efficient fused kernels. Same parameters, same state_dict keys: only `__class__`
    changes, so checkpoints stay loadable by plain lerobot.
    """

    def forward(self, query: Tensor, key: Tensor, value: Tensor, **kwargs: Any) -> tuple[Tensor, None]:
        kwargs["need_weights"] = False
        return super().forward(query, key, value, **kwargs)


def use_fused_attention(module: nn.Module) -> int:
    """Switch every nn.MultiheadAttention under `module` to `FusedMultiheadAttention` in place.

    Returns how many were switched."""
    n = 0
    for m in module.modules():
        if type(m) is nn.MultiheadAttention:
            m.__class__ = FusedMultiheadAttention
            n += 1
    return n


def use_batch_norm(module: nn.Module) -> int:
    """Replace every FrozenBatchNorm2d under `module` by a BatchNorm2d holding the same statistics, in place.

    Why: with a random-init backbone FrozenBatchNorm2d is the identity, and nothing normalizes the ResNet's
    activations while it learns. BatchNorm2d keeps the same state_dict keys (plus `num_batches_tracked`, which
    `TrainablePolicy.state_dict_fp32` drops), so lerobot's frozen ACT loads the result as the trained network in
    eval mode. Returns how many were replaced."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    n = 0
    for name, child in module.named_children():
        if isinstance(child, FrozenBatchNorm2d):
            bn = nn.BatchNorm2d(child.weight.shape[0], eps=child.eps).to(child.weight.device)
            with torch.no_grad():
                for key in ("weight", "bias", "running_mean", "running_var"):
                    getattr(bn, key).copy_(getattr(child, key))
            setattr(module, name, bn)
            n += 1
        else:
            n += use_batch_norm(child)
    return n


def random_shift(images: Tensor, pad: int) -> Tensor:
    """Shift each image of a [B, C, H, W] batch by its own random offset of up to `pad` pixels in each direction,
    edges replicated (DrQ-v2's augmentation). Pure tensor ops on the images' device: no host sync.

    Example:
        ```python
        >>> random_shift(torch.rand(8, 3, 240, 320), 8).shape
        torch.Size([8, 3, 240, 320])
        ```
    """
    b, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    shift = torch.randint(0, 2 * pad + 1, (b, 2), device=images.device, dtype=images.dtype)
    # Pixel centres of the padded image in grid_sample's [-1, 1] coordinates (align_corners=False).
    xs = 2 * (torch.arange(w, device=images.device, dtype=images.dtype)[None, None, :] + shift[:, 0, None, None]) + 1
    ys = 2 * (torch.arange(h, device=images.device, dtype=images.dtype)[None, :, None] + shift[:, 1, None, None]) + 1
    grid = torch.stack([(xs / (w + 2 * pad) - 1).expand(b, h, w), (ys / (h + 2 * pad) - 1).expand(b, h, w)], dim=-1)
    return F.grid_sample(padded, grid, mode="nearest", padding_mode="border", align_corners=False)


def to_policy_features(features: dict[str, Any]) -> dict[str, PolicyFeature]:
    """lerobot dataset features (meta/info.json style) or PolicyFeatures -> PolicyFeatures.

    Raises:
        ValueError: a feature is neither a PolicyFeature nor a dataset feature dict.
    """
    out: dict[str, PolicyFeature] = {}
    raw: dict[str, dict] = {}
    for key, ft in features.items():
        if isinstance(ft, PolicyFeature):
            out[key] = ft
        elif isinstance(ft, dict) and "dtype" in ft and "shape" in ft:
            raw[key] = ft
        else:
            raise BadValue(f"feature {key!r}: expected a PolicyFeature or a dataset feature dict, got {ft!r}")
    out.update(dataset_to_policy_features(raw))
    return out


def _one_image_size(cfg: ACTConfig) -> tuple[int, int] | None:
    """The (H, W) every camera input of `cfg` has, or None (no camera, or cameras of different sizes)."""
    sizes = {tuple(ft.shape[1:]) for ft in cfg.image_features.values()}
    return sizes.pop() if len(sizes) == 1 else None


def make_act_config(features: dict[str, Any], settings: ACTSettings, device: torch.device) -> ACTConfig:
    """lerobot ACTConfig for these features and settings. Never asks torchvision for pretrained weights.

    Raises:
        ValueError: no "action" feature, or lerobot rejects the features (no image and no env state).
    """
    pf = to_policy_features(features)
    if ACTION not in pf:
        raise BadValue("features must include 'action'")
    if settings.image_size is not None:  # the policy sees resized frames (its preprocessor resizes them)
        resized = {k: PolicyFeature(v.type, (v.shape[0], *settings.image_size)) for k, v in pf.items()}
        pf = {k: resized[k] if v.type is FeatureType.VISUAL else v for k, v in pf.items()}
    cfg = ACTConfig(
        input_features={k: v for k, v in pf.items() if v.type is not FeatureType.ACTION},
        output_features={k: v for k, v in pf.items() if v.type is FeatureType.ACTION},
        device=device.type,
        chunk_size=settings.chunk_size,
        n_action_steps=settings.n_action_steps,
        temporal_ensemble_coeff=settings.temporal_ensemble_coeff,
        dim_model=settings.dim_model,
        n_heads=settings.n_heads,
        dim_feedforward=settings.dim_feedforward,
        n_encoder_layers=settings.n_encoder_layers,
        n_decoder_layers=settings.n_decoder_layers,
        n_vae_encoder_layers=settings.n_vae_encoder_layers,
        latent_dim=settings.latent_dim,
        use_vae=settings.use_vae,
        kl_weight=settings.kl_weight,
        dropout=settings.dropout,
        vision_backbone=settings.vision_backbone,
        # lerobot's default "ResNet18_Weights.IMAGENET1K_V1" makes torchvision download at construction
        # (and again in ACTPolicy.from_pretrained, since it is saved in config.json). We load a local file.
        pretrained_backbone_weights=None,
        optimizer_lr=settings.lr,
        optimizer_lr_backbone=settings.lr_backbone,
        optimizer_weight_decay=settings.weight_decay,
        # Saved in config.json: with lerobot's default (True) and no repo_id, `lerobot-train --policy.path=<ours>`
        # refuses the checkpoint. robotloop's models go to buckets, never to the Hub through lerobot.
        push_to_hub=False,
    )
    cfg.validate_features()
    return cfg


def load_backbone_weights(policy: ACTPolicy, path: Path | None) -> None:
    """Load a torchvision resnet state_dict file into ACT's backbone, or warn that it stays random.

    The backbone is resnet up to layer4 (no avgpool/fc) with FrozenBatchNorm2d, so "fc.*" and
    "*.num_batches_tracked" keys are dropped; everything else must match.

    Raises:
        FileNotFoundError: `path` does not exist.
        RuntimeError: the file's keys or shapes do not match the backbone.
    """
    if path is None:
        log.warning(
            "ACT backbone: no local ResNet weights given (--backbone-weights, ACTSettings.backbone_weights); the "
            "backbone is randomly initialised. lerobot's default ImageNet weights are NOT downloaded: pass a "
            "torchvision resnet18 state_dict file to start from them."
        )
        return
    if not path.is_file():
        raise FileNotFoundError(f"backbone weights file not found: {path}")
    sd = torch.load(path, map_location="cpu", weights_only=True)
    sd = {k: v for k, v in sd.items() if not k.startswith("fc.") and not k.endswith("num_batches_tracked")}
    policy.model.backbone.load_state_dict(sd, strict=True)
    log.info("ACT backbone: loaded %d tensors from %s", len(sd), path)


def camera_stats_for(
    stats: dict[str, dict[str, Any]], cfg: ACTConfig, use_imagenet_stats: bool
) -> dict[str, dict[str, Any]]:
    """The stats lerobot-train hands its processors: dataset stats for the policy's features, with camera
    mean/std replaced by ImageNet's when `use_imagenet_stats` (lerobot.datasets.factory does the same)."""
    keys = {**cfg.input_features, **cfg.output_features}
    out = {k: dict(v) for k, v in stats.items() if k in keys}
    if use_imagenet_stats:
        for key in cfg.image_features:
            out.setdefault(key, {}).update({k: torch.tensor(v) for k, v in IMAGENET_STATS.items()})
    return out


@dataclass
class _Affine:
    """(x - shift) / scale, then * mul + add: the forward transform of one normalized feature."""

    shift: Tensor
    scale: Tensor
    mul: float = 1.0
    add: float = 0.0


def _affine_from_normalizer(norm: NormalizerProcessorStep, key: str, ft: FeatureType) -> _Affine | None:
    """Read lerobot's normalizer stats once into device tensors, with lerobot's exact formulas.

    Raises:
        NotImplementedError: a normalization mode other than IDENTITY, MEAN_STD or MIN_MAX.
    """
    mode = norm.norm_map.get(ft, NormalizationMode.IDENTITY)
    stats = normalizer_tensor_stats(norm).get(key)  # lerobot's own tensors: same dtype, shape and eps handling
    if mode is NormalizationMode.IDENTITY or stats is None:
        return None
    if mode is NormalizationMode.MEAN_STD:
        return _Affine(shift=stats["mean"], scale=stats["std"] + norm.eps)
    if mode is NormalizationMode.MIN_MAX:
        denom = stats["max"] - stats["min"]
        denom = torch.where(denom == 0, torch.full_like(denom, norm.eps), denom)
        return _Affine(shift=stats["min"], scale=denom, mul=2.0, add=-1.0)
    raise NotImplementedError(f"normalization mode {mode} for {key!r}")


class TrainablePolicy:
    """A lerobot ACTPolicy with its processors, a fused optimizer and a (compiled) training step.

    Attributes:
        policy: the lerobot ACTPolicy (train it, save it, or hand it to lerobot code directly).
        preprocessor / postprocessor: lerobot's pipelines built from the same stats (saved with the policy).
        settings, device.
        fp8_layers: names of the linear layers that train in FP8 (for "auto": known after the first batch).
    """

    def __init__(
        self,
        policy: ACTPolicy,
        preprocessor: PolicyProcessorPipeline,
        postprocessor: PolicyProcessorPipeline,
        settings: ACTSettings,
        device: torch.device,
        fp8_layers: list[str] | None = None,
        fp8_auto: AutoFp8 | None = None,
        camera_sizes: dict[str, tuple[int, int]] | None = None,
        fp8_job: Fp8AutoJob | None = None,
        shadow_map: int | None = None,
    ) -> None:
        self.policy = policy
        self.preprocessor = preprocessor
        self.postprocessor = postprocessor
        self.settings = settings
        self.device = device
        cfg = policy.config
        self.image_keys: list[str] = list(cfg.image_features)
        # The frame size each camera records at (what the policy's preprocessor resizes from).
        self.camera_sizes = camera_sizes or {k: tuple(cfg.image_features[k].shape[1:]) for k in self.image_keys}
        # The sim cameras' shadow-map side where the data was not rendered as gym-aloha renders (None: it was).
        self.shadow_map = shadow_map
        self._resize = next((s for s in preprocessor.steps if isinstance(s, ImageCropResizeProcessorStep)), None)
        self._base_lrs: list[float] = []
        norm = next(s for s in preprocessor.steps if isinstance(s, NormalizerProcessorStep))
        norm.to(device=device)  # its stats tensors are the ones we read below
        feats = {**cfg.input_features, **cfg.output_features}
        self._norm: dict[str, _Affine | None] = {
            k: _affine_from_normalizer(norm, k, ft.type) for k, ft in feats.items()
        }
        self._optimizer: torch.optim.Optimizer | None = None
        self.grad_sync: Callable[[list[Tensor]], None] | None = None  # set by the trainer under torchrun
        self._params: list[nn.Parameter] = []  # the optimizer's, for grad clipping
        self.fp8_layers: list[str] = list(fp8_layers or [])
        self._fp8_auto = fp8_auto
        self._fp8_job = fp8_job  # "auto" decides in a child process built from it
        self.fp8_step_timing: ShapeTiming | None = None  # "auto": the whole step's bf16 / FP8 ms, if it timed it
        self._loss_fn = self._loss_eager
        if settings.compile:
            # dynamic=False: fixed batch shapes are what CUDA graphs need, and it avoids recompiles guessing
            # at symbolic sizes on the second call.
            use_persistent_compile_cache()
            self._loss_fn = torch.compile(self._loss_eager, mode=settings.compile_mode, dynamic=False)

    # ----- data ---------------------------------------------------------------------------------------

    def _normalize(self, key: str, x: Tensor) -> Tensor:
        a = self._norm.get(key)
        if a is None:
            return x
        y = (x - a.shift) / a.scale
        return y if a.mul == 1.0 and a.add == 0.0 else y * a.mul + a.add

    def prepare(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """uint8 images -> float [0,1] (as lerobot-train does), then lerobot's normalization. Pure tensor ops.

        Raises:
            KeyError: a camera, "observation.state", "action" or "action_is_pad" is missing.
        """
        out: dict[str, Tensor] = {}
        for key in self.image_keys:
            img = batch[key]
            if self.settings.channels_last:
                img = img.contiguous(memory_format=torch.channels_last)  # NHWC before the float copy: cheaper
            if img.dtype == torch.uint8:
                img = img.to(dtype=torch.float32) / 255.0
            # The saved preprocessor's own step, so inference resizes the same way; frames already at the policy's
            # size (the camera gives it) are not interpolated again.
            if self._resize is not None and tuple(img.shape[-2:]) != tuple(self._resize.resize_size):
                img = self._resize.observation({key: img})[key]
                if self.settings.channels_last:
                    img = img.contiguous(memory_format=torch.channels_last)
            if self.settings.random_shift and self.policy.training:
                img = random_shift(img, self.settings.random_shift)
            out[key] = self._normalize(key, img)
        for key in (OBS_STATE, ACTION):
            if key in self._norm:
                out[key] = self._normalize(key, batch[key])
        out[ACTION_IS_PAD] = batch[ACTION_IS_PAD]
        return out

    # ----- loss ---------------------------------------------------------------------------------------

    def _autocast(self) -> torch.autocast:
        enabled = self.settings.precision == "bf16"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _loss_eager(self, batch: dict[str, Tensor], policy: ACTPolicy | None = None) -> Tensor:
        """lerobot's ACTPolicy.forward loss, without its `.item()` calls (of `policy`, default this one's)."""
        policy = policy or self.policy
        b = self.prepare(batch)
        b[OBS_IMAGES] = [b[k] for k in self.image_keys]
        with self._autocast():
            actions_hat, (mu, log_sigma_x2) = policy.model(b)
        actions_hat = actions_hat.float()
        abs_err = F.l1_loss(b[ACTION], actions_hat, reduction="none")
        valid_mask = ~b[ACTION_IS_PAD].unsqueeze(-1)
        num_valid = valid_mask.sum() * abs_err.shape[-1]
        l1_loss = (abs_err * valid_mask).sum() / num_valid.clamp_min(1)
        if policy.config.use_vae and log_sigma_x2 is not None:
            mu, log_sigma_x2 = mu.float(), log_sigma_x2.float()
            mean_kld = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1).mean()
            return l1_loss + mean_kld * policy.config.kl_weight
        return l1_loss

    def loss(self, batch: dict[str, Tensor]) -> Tensor:
        """Training loss (a 0-d device tensor) for a batch already on the device:
        {"observation.images.<cam>": uint8 [B,3,H,W], "observation.state": [B,S], "action": [B,chunk,A],
        "action_is_pad": bool [B,chunk]}. Puts the policy in train mode (dropout, VAE)."""
        if not self.policy.training:  # .train() walks every module: skip it on the hot path
            self.policy.train()
        if self._fp8_auto is not None:
            self._apply_fp8_auto(batch)
        if self.settings.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return self._loss_fn(batch)

    def _apply_fp8_auto(self, batch: dict[str, Tensor]) -> None:
        """fp8="auto", first batch: decide which linear layers train in FP8 (in a child process when this policy
        has an `Fp8AutoJob`, else here), then convert them, before the first compiled call, so compile sees the
        final modules. Deciding here leaves the run as it would be without it too (the RNG is forked and the
        buffers restored), but not the process's compiled and CUDA state: see `decide_fp8_auto_in_child`."""
        auto, self._fp8_auto = self._fp8_auto, None
        if self._fp8_job is not None:
            chosen, self.fp8_step_timing = decide_fp8_auto_in_child(self._fp8_job, batch)
        else:
            chosen = self.decide_fp8_auto(auto, batch)
        self.fp8_layers = convert_linears(self.policy, auto.recipe, auto.accelerator, only=chosen) if chosen else []

    def decide_fp8_auto(self, auto: AutoFp8, batch: dict[str, Tensor]) -> list[str]:
        """`auto`'s choice of layers for this policy on `batch`: one eager forward records each linear layer's
        token count, `step_ms` times the whole step. Converts nothing."""
        cuda = [self.device] if self.device.type == "cuda" else []

        def forward() -> None:
            with torch.no_grad(), torch.random.fork_rng(devices=cuda, device_type=self.device.type):
                self._loss_eager(batch)

        chosen = auto.decide(self.policy, forward, lambda policy: self.step_ms(batch, policy))
        self.fp8_step_timing = auto.step_timing
        return chosen

    def step_ms(
        self, batch: dict[str, Tensor], policy: ACTPolicy | None = None, warmup: int = 2, steps: int = 5
    ) -> float:
        """Median milliseconds of one eager training forward + backward of `policy` (default this one's) on
        `batch`, leaving no trace: the random stream is forked, the gradients dropped and the buffers
        (BatchNorm's running statistics) put back as they were."""
        policy = policy or self.policy
        cuda = [self.device] if self.device.type == "cuda" else []
        buffers = {name: b.clone() for name, b in policy.named_buffers()}
        times = []
        with torch.random.fork_rng(devices=cuda, device_type=self.device.type):
            for i in range(warmup + steps):
                t0 = time.perf_counter()
                self._loss_eager(batch, policy).backward()
                if cuda:
                    torch.cuda.synchronize(self.device)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
        policy.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in policy.named_buffers():
                b.copy_(buffers[name])
        return statistics.median(times) * 1e3

    # ----- optimization -------------------------------------------------------------------------------

    def optimizer(self) -> torch.optim.Optimizer:
        """AdamW over lerobot's ACT param groups (backbone at lr_backbone); fused kernel on CUDA. Cached."""
        if self._optimizer is None:
            s = self.settings
            self._optimizer = torch.optim.AdamW(
                self.policy.get_optim_params(),
                lr=s.lr,
                weight_decay=s.weight_decay,
                fused=self.device.type == "cuda",
            )
            self._params = [p for g in self._optimizer.param_groups for p in g["params"]]
            self._base_lrs = [g["lr"] for g in self._optimizer.param_groups]
        return self._optimizer

    def set_lr_factor(self, factor: float) -> None:
        """Scale every param group's learning rate to `factor` x its configured value (the schedule's step)."""
        for group, base in zip(self.optimizer().param_groups, self._base_lrs, strict=True):
            group["lr"] = base * factor

    def train_step(self, batch: dict[str, Tensor]) -> Tensor:
        """Forward, backward, clip (norm 10), AdamW step. Returns the loss as a device tensor (no sync).

        With cuda_graphs the returned tensor is a copy: the graph's own output is overwritten next step.
        """
        opt = self.optimizer()
        loss = self.loss(batch)
        loss.backward()
        if self.grad_sync is not None:  # data parallel: average gradients across ranks before clipping
            self.grad_sync(self._params)
        torch.nn.utils.clip_grad_norm_(self._params, self.settings.grad_clip_norm, foreach=True)
        opt.step()
        # set_to_none: the graphed backward writes fresh grads; dropping ours lets its pool be reused.
        opt.zero_grad(set_to_none=True)
        return loss.detach().clone() if self.settings.cuda_graphs else loss.detach()

    # ----- checkpoints --------------------------------------------------------------------------------

    def state_dict_fp32(self) -> dict[str, Tensor]:
        """Policy weights as contiguous fp32 CPU tensors, under lerobot's state_dict keys.

        FP8 layers (TorchAO Float8Linear) keep high-precision weights under the same keys; a float8 weight
        wrapper (TorchAO's FSDP float8 all-gather, which we do not enable) is unwrapped to its plain tensor.

        Raises:
            TypeError: a weight is a tensor subclass that cannot be unwrapped (it would not load in lerobot).
        """
        out = {}
        for k, v in self.policy.state_dict().items():
            if k.endswith("num_batches_tracked"):  # BatchNorm2d's counter: lerobot's FrozenBatchNorm2d has none
                continue
            v = getattr(v, "_tensor", v) if type(v) is not Tensor else v
            if type(v) is not Tensor:
                raise TypeError(f"{k}: {type(v).__name__} is not a plain tensor; lerobot could not load it")
            out[k] = v.detach().to(device="cpu", dtype=torch.float32 if v.is_floating_point() else v.dtype).contiguous()
        return out

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write a lerobot checkpoint: config.json + model.safetensors (fp32) + the processors' json and
        safetensors. `ACTPolicy.from_pretrained(dir)` and `make_pre_post_processors(cfg, pretrained_path=dir)`
        load it, with no network access (the saved config has pretrained_backbone_weights=None)."""
        directory = Path(directory)
        self.policy.save_pretrained(directory, state_dict=self.state_dict_fp32())
        self.preprocessor.save_pretrained(directory)
        self.postprocessor.save_pretrained(directory)
        inputs: dict[str, Any] = {"cameras": {k: list(v) for k, v in self.camera_sizes.items()}}
        if self.shadow_map is not None:  # evaluation and sim robots render as the data was rendered
            inputs["shadow_map"] = self.shadow_map
        (directory / INPUTS_FILE).write_text(json.dumps(inputs, indent=1))
        return directory


def use_persistent_compile_cache() -> Path:
    """Keep torch.compile's kernel and graph caches under robotloop's cache dir unless TORCHINDUCTOR_CACHE_DIR
    is set: inductor's default is /tmp, which containers and reboots wipe, and a cold compile of ACT's step took
    191 s on the H200 (BENCHMARKS.md) against seconds for a run of the same shapes with the cache warm."""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from ..config import cache_home

    # inductor writes its /tmp default into the variable the first time anything asks: that is not a choice.
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_home() / "inductor")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def build_policy(
    features: dict[str, Any],
    stats: dict[str, dict[str, Any]],
    settings: ACTSettings | None = None,
    device: str | torch.device = "cpu",
    *,
    accelerator: Accelerator | None = None,
    fp8_measure: Measure | None = None,
    fp8_time_step: StepTimer | None = None,
    fp8_in_child: bool | None = None,
) -> TrainablePolicy:
    """Build lerobot's ACTPolicy and its processors for these features and dataset stats.

    Args:
        features: lerobot features: dataset style ({"dtype": "video", "shape": ..., "names": ...}, as in
            meta/info.json) or PolicyFeature values. Needs "action" and a camera or environment state.
        stats: dataset stats (meta/stats.json style: key -> {"mean","std","min","max",...} as lists/arrays).
        settings: ACTSettings (default: lerobot's ACT defaults, fp32 eager).
        device: where the policy, stats and batches live.
        accelerator: the device description the FP8 checks use (default: `Accelerator.detect(device)`;
            tests pass a simulated GPU).
        fp8_measure: fp8="auto"'s shape timer (default: timing on `device`; tests pass a fake timing table).
        fp8_time_step: fp8="auto"'s whole-step timer (default: the real loss, eager, on `device`).
        fp8_in_child: fp8="auto" decides in a child process (`robotloop.train.fp8_auto`; default: when both timers
            are the real ones; tests that ask for it pass picklable timers).

    Raises:
        ValueError: bad features or settings. FileNotFoundError / RuntimeError: bad backbone weights file.
        robotloop.train.fp8.Fp8Unavailable: an FP8 recipe on a device without FP8.
        robotloop.train.fp8.Fp8FormatMismatch: TorchAO's float8 formats do not match the device.
    """
    settings = settings or ACTSettings()
    device = torch.device(device)
    cfg = make_act_config(features, settings, device)
    cameras = {k: tuple(v.shape[1:]) for k, v in to_policy_features(features).items() if v.type is FeatureType.VISUAL}
    policy = ACTPolicy(cfg)
    load_backbone_weights(policy, settings.backbone_weights)
    if settings.backbone_norm == "batch":
        use_batch_norm(policy.model.backbone)
    if settings.fused_attention:
        use_fused_attention(policy)
    policy.to(device)
    accelerator = accelerator or Accelerator.detect(device)
    fp8_layers, fp8_auto = setup_fp8(  # compile_mode is "default" without compile: cuda_graphs and autotune need it
        policy,
        settings.fp8,
        accelerator,
        lambda: fp8_measure or gpu_measure(device, settings.compile_mode),
        fp8_time_step,
    )
    if settings.channels_last:
        policy.model.backbone.to(memory_format=torch.channels_last)
    preprocessor, postprocessor = make_pre_post_processors(
        cfg, dataset_stats=camera_stats_for(stats, cfg, settings.use_imagenet_stats)
    )
    # The size the model sees is saved as a resize step, also when the camera already gives it: lerobot-eval renders
    # gym-aloha at 480x640 and would feed that to a policy trained at 48x64 without a word. Before normalization,
    # as lerobot's HIL pipelines place it. Cameras of several sizes and no image_size: no one size to resize to.
    seen = settings.image_size or _one_image_size(cfg)
    if seen is not None:
        steps = list(preprocessor.steps)
        at = next(i for i, s in enumerate(steps) if isinstance(s, NormalizerProcessorStep))
        preprocessor.steps = [*steps[:at], ImageCropResizeProcessorStep(resize_size=seen), *steps[at:]]
    real_timers = not (fp8_measure or fp8_time_step)
    job = None
    if fp8_auto is not None and (real_timers if fp8_in_child is None else fp8_in_child):
        job = Fp8AutoJob(
            features, stats, settings, str(device), accelerator, fp8_auto.cache_path, fp8_measure, fp8_time_step
        )
    shadow_map = _data_shadow_map(features)
    return TrainablePolicy(
        policy, preprocessor, postprocessor, settings, device, fp8_layers, fp8_auto, cameras, job, shadow_map
    )


def _data_shadow_map(features: dict[str, Any]) -> int | None:
    """The shadow-map side the dataset's sim cameras were rendered with (`DatasetSpec.shadow_map`), or None.

    Raises:
        BadValue: cameras rendered with different ones (no sim renders them so).
    """
    sides = {camera_shadow_map(v) for v in features.values() if isinstance(v, dict) and v.get("dtype") == "video"}
    if len(sides) > 1:
        raise BadValue(f"the dataset's cameras were rendered with different shadow maps: {sorted(map(str, sides))}")
    return next(iter(sides), None)


__all__ = [
    "ACTSettings",
    "FusedMultiheadAttention",
    "TrainablePolicy",
    "build_policy",
    "make_act_config",
    "random_shift",
    "use_batch_norm",
    "use_fused_attention",
]
