"""FP8 training for ACT's linear layers with TorchAO (`torchao.float8`), checked against the device.

Modes (`ACTSettings.fp8`, `robotloop train --fp8`):
- "off": nothing changes.
- "tensorwise", "rowwise", "rowwise_with_gw_hp": TorchAO's recipes (`Float8LinearConfig.from_recipe_name`),
  applied at build time to every linear layer that passes `fp8_candidates`. On a device without FP8 this
  raises `Fp8Unavailable` before training.
- "auto": on the first batch, time each distinct (in, out, tokens) linear shape forward+backward, compiled,
  in bf16 and in FP8 ("tensorwise"), and pick the layers whose shape is at least `MIN_SPEEDUP` faster in FP8
  (timings cached per GPU model and shape in `<cache_home()>/fp8/linear_timings.json`). Then the whole training
  step decides: one forward+backward of the model as it is against a copy with those layers in FP8; unless the
  copy is `MIN_SPEEDUP` faster too, nothing is converted. Layers faster alone do not make a faster step: on one
  H200 the large ACT's compiled step ran at 0.71x of bf16 with the 8 layers the shapes picked (BENCHMARKS.md).
  Training measures in a child process, so that what the measurements compile, capture and allocate never
  shares a process with the run: measured in-process, "auto" that converted nothing still ran the default
  ACT's batch-8 step at 0.76x and 0.81x of "off" on one H200, even after resetting dynamo and CUDA graph trees.
  On a device without FP8, "auto" logs that it trains in bf16 and converts nothing.

Which layers (the rule): a plain `nn.Linear` that is *called as a module*, with `in_features` and
`out_features` both multiples of 16 (what `torch._scaled_mm` needs). `nn.MultiheadAttention`'s `out_proj`
is excluded: attention reads its `.weight` inside `F.multi_head_attention_forward` and never calls it, so a
Float8Linear there would never run in FP8 (and `in_proj_weight` is a bare parameter, not a Linear). The
token count (the GEMMs' third dimension, batch x sequence) need not be a multiple of 16: our configs set
TorchAO's `pad_inner_dim`, which zero-pads it for the grad_weight GEMM (ACT's latent projections see only
`batch` tokens).

Float8 formats follow the device: e4m3fn/e5m2 (OCP) on NVIDIA SM 8.9+ and AMD gfx950 (MI350-class),
e4m3fnuz/e5m2fnuz on AMD gfx94x (MI300-class). TorchAO picks its formats once, at import, from GPU 0
(`torchao.float8.config.e4m3_dtype`); the formats written into the config we use are compared against the
device here, and a mismatch raises `Fp8FormatMismatch` instead of scaling against the wrong maximum
(e4m3fn saturates at 448, e4m3fnuz at 240) and degrading the model silently.

Example:
    ```python
    >>> acc = Accelerator.detect("cuda")            # or Accelerator("amd", "AMD Instinct MI300X", arch="gfx942")
    >>> convert_linears(policy.model, "rowwise", acc)  # -> the converted layers' names
    ```
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from ..errors import BadInput, BadValue

log = logging.getLogger(__name__)

FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")  # TorchAO's Float8LinearRecipeName values
FP8_MODES = ("off", "auto", *FP8_RECIPES)
AUTO_RECIPE = "tensorwise"  # TorchAO's fastest recipe; "auto" measures it
MIN_SPEEDUP = 1.05  # "auto" converts a shape only if FP8 beats bf16 by 5%: per-shape timings vary by a few %
WHOLE_STEP_ROUNDS = 3  # "auto"'s whole-step check times bf16 and FP8 alternately, this many times each
FP8_ALIGN = 16  # torch._scaled_mm: in_features and out_features must be multiples of 16


class Fp8Error(BadInput, ValueError):
    """FP8 was asked for and cannot run correctly here."""


class Fp8Unavailable(Fp8Error):
    """The device has no FP8 matrix units (CPU, NVIDIA before SM 8.9, AMD before MI300)."""


class Fp8FormatMismatch(Fp8Error):
    """TorchAO would cast to a float8 format the device does not compute in (it would mis-scale)."""


@dataclass(frozen=True)
class Float8Formats:
    """The float8 pair a device computes in: e4m3 for activations and weights, e5m2 for gradients."""

    e4m3: torch.dtype
    e5m2: torch.dtype


OCP_FORMATS = Float8Formats(torch.float8_e4m3fn, torch.float8_e5m2)  # NVIDIA SM 8.9+, AMD MI350
FNUZ_FORMATS = Float8Formats(torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)  # AMD MI300 (gfx94x)


@dataclass(frozen=True)
class Accelerator:
    """What the FP8 checks need to know about a device. Tests build one by hand to simulate a GPU.

    Example:
        ```python
        >>> Accelerator("nvidia", "NVIDIA H100 80GB HBM3", capability=(9, 0))
        >>> Accelerator("amd", "AMD Instinct MI300X", arch="gfx942:sramecc+:xnack-")
        >>> Accelerator.detect("cuda:0")
        ```
    """

    vendor: Literal["nvidia", "amd", "cpu"]
    name: str = ""
    capability: tuple[int, int] | None = None  # NVIDIA compute capability (SM major, minor)
    arch: str | None = None  # AMD gcnArchName, e.g. "gfx942:sramecc+:xnack-"

    @classmethod
    def detect(cls, device: str | torch.device) -> Accelerator:
        """Describe `device`. ROCm builds of torch also call their GPUs "cuda"."""
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return cls("cpu", device.type)
        props = torch.cuda.get_device_properties(device)
        if torch.version.hip:
            return cls("amd", props.name, arch=props.gcnArchName)
        return cls("nvidia", props.name, capability=(props.major, props.minor))

    @property
    def label(self) -> str:
        """A short name for messages and cache keys: "NVIDIA H200 (SM 9.0)", "AMD Instinct MI300X (gfx942)"."""
        if self.vendor == "nvidia" and self.capability:
            return f"{self.name} (SM {self.capability[0]}.{self.capability[1]})"
        if self.vendor == "amd" and self.arch:
            return f"{self.name} ({self.arch.split(':')[0]})"
        return self.name or self.vendor

    def float8_formats(self) -> Float8Formats:
        """The float8 formats this device's matrix units compute in.

        Raises:
            Fp8Unavailable: no FP8 on this device.
        """
        if self.vendor == "nvidia" and self.capability is not None and self.capability >= (8, 9):
            return OCP_FORMATS
        if self.vendor == "amd" and self.arch:
            gfx = self.arch.split(":")[0]
            if gfx.startswith("gfx94"):
                return FNUZ_FORMATS
            if gfx == "gfx950":
                return OCP_FORMATS
        raise Fp8Unavailable(
            f"FP8 training needs an NVIDIA GPU of SM 8.9 or newer (Ada, Hopper, Blackwell) or an AMD MI300/MI350 "
            f"(gfx94x, gfx950); this device is {self.label}. Use --fp8 off, or --fp8 auto to fall back to bf16."
        )


def float8_config(recipe: str):
    """TorchAO's Float8LinearConfig for `recipe`, with `pad_inner_dim` on (token counts that are not multiples
    of 16 are zero-padded in the GEMM instead of failing in torch._scaled_mm).

    Raises:
        ValueError: not one of FP8_RECIPES.
    """
    from torchao.float8 import Float8LinearConfig

    if recipe not in FP8_RECIPES:
        raise BadValue(f"FP8 recipe must be one of {FP8_RECIPES}, got {recipe!r}")
    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True)


def _cast_dtypes(config) -> dict[str, torch.dtype]:
    """The float8 dtype TorchAO will actually cast each operand to (disabled casts stay high precision)."""
    from torchao.float8 import ScalingType

    out = {}
    for field in dataclasses.fields(config):
        cast = getattr(config, field.name)
        if field.name.startswith("cast_config_") and cast.scaling_type is not ScalingType.DISABLED:
            out[field.name.removeprefix("cast_config_")] = cast.target_dtype
    return out


def check_formats(config, accelerator: Accelerator) -> Float8Formats:
    """Check that every float8 cast in TorchAO's `config` uses a format `accelerator` computes in.

    TorchAO scales each tensor by `torch.finfo(target_dtype).max`, so a format that does not match the
    hardware's means scaling against the wrong maximum. Returns the device's formats.

    Raises:
        Fp8Unavailable: no FP8 on this device.
        Fp8FormatMismatch: a cast's format is not one the device computes in.
    """
    formats = accelerator.float8_formats()
    wanted = {formats.e4m3, formats.e5m2}
    for operand, dtype in _cast_dtypes(config).items():
        if dtype not in wanted:
            good = formats.e4m3 if "e4m3" in str(dtype) else formats.e5m2
            raise Fp8FormatMismatch(
                f"TorchAO would cast {operand} to {dtype} (max {torch.finfo(dtype).max:g}), but "
                f"{accelerator.label} computes in {good} (max {torch.finfo(good).max:g}): the scales would be "
                f"wrong and the model would degrade silently. TorchAO picks its formats at import from GPU 0 "
                f"(torchao.float8.config.e4m3_dtype); check that GPU 0 is the GPU you train on."
            )
    return formats


def fp8_candidates(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers FP8 may convert, by name (the rule is in the module docstring)."""
    functional = {id(m.out_proj) for m in model.modules() if isinstance(m, nn.MultiheadAttention)}
    return {
        name: m
        for name, m in model.named_modules()
        # Exact type: a subclass may override forward (and Float8Linear is one: already converted).
        if type(m) is nn.Linear
        and id(m) not in functional
        and m.in_features % FP8_ALIGN == 0
        and m.out_features % FP8_ALIGN == 0
    }


def convert_linears(
    model: nn.Module, recipe: str, accelerator: Accelerator, only: Collection[str] | None = None
) -> list[str]:
    """Swap `model`'s FP8 candidates (or those of them named in `only`) for TorchAO Float8Linear, in place.

    Float8Linear keeps the same weight and bias Parameters, so state_dict keys, optimizer param groups and
    checkpoints are unchanged. Returns the converted layers' names.

    Raises:
        ValueError: unknown recipe. Fp8Unavailable / Fp8FormatMismatch: see `check_formats`.
    """
    from torchao.float8 import convert_to_float8_training

    config = float8_config(recipe)
    check_formats(config, accelerator)
    chosen = [name for name in fp8_candidates(model) if only is None or name in only]
    if chosen:
        wanted = set(chosen)
        convert_to_float8_training(model, config=config, module_filter_fn=lambda m, name: name in wanted)
    log.info("FP8 (%s) on %d linear layers: %s", recipe, len(chosen), ", ".join(chosen) or "none")
    return chosen


# ----- auto: measure, cache, select ----------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class LinearShape:
    """One linear GEMM as training runs it: [tokens, in_features] @ [in_features, out_features]."""

    in_features: int
    out_features: int
    tokens: int

    @property
    def key(self) -> str:
        return f"{self.in_features}x{self.out_features}x{self.tokens}"


@dataclass(frozen=True)
class ShapeTiming:
    """Forward + backward milliseconds of one shape, in bf16 and in FP8."""

    bf16_ms: float
    fp8_ms: float

    @property
    def speedup(self) -> float:
        return self.bf16_ms / self.fp8_ms


Measure = Callable[[LinearShape], ShapeTiming]
StepTimer = Callable[[nn.Module], float]  # milliseconds of one training forward + backward of this model


def record_linear_shapes(
    model: nn.Module, layers: dict[str, nn.Linear], run_forward: Callable[[], object]
) -> dict[str, LinearShape]:
    """Run `run_forward()` once and record the shape each of `layers` is called with.

    Layers that are never called (or called with several shapes) are left out, so "auto" only converts
    layers it has seen run as modules.
    """
    seen: dict[str, set[LinearShape]] = {}

    def hook(name: str):
        def record(module: nn.Linear, args: tuple) -> None:
            tokens = args[0].numel() // module.in_features
            seen.setdefault(name, set()).add(LinearShape(module.in_features, module.out_features, tokens))

        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in layers.items()]
    try:
        run_forward()
    finally:
        for h in handles:
            h.remove()
    return {name: next(iter(shapes)) for name, shapes in seen.items() if len(shapes) == 1}


def default_cache_path() -> Path:
    from ..config import cache_home

    return cache_home() / "fp8" / "linear_timings.json"


@dataclass
class TimingCache:
    """Measured shape timings in one JSON file: {device key: {shape key: {"bf16_ms", "fp8_ms"}}}.

    The device key holds the GPU model and the torch/torchao versions and recipe (kernels change with them).
    A missing or unreadable file is an empty cache; writes replace the file atomically.
    """

    path: Path

    def load(self) -> dict[str, dict[str, dict[str, float]]]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning("FP8 timing cache %s unreadable (%s): measuring again", self.path, error)
            return {}

    def save(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".linear_timings.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)  # concurrent ranks: the last writer wins, nobody reads a half file
        finally:
            Path(tmp).unlink(missing_ok=True)


def device_key(accelerator: Accelerator, recipe: str) -> str:
    import torchao

    return f"{accelerator.label} | torch {torch.__version__} | torchao {torchao.__version__} | {recipe}"


def shape_timings(
    shapes: Collection[LinearShape], measure: Measure, cache: TimingCache, key: str
) -> dict[LinearShape, ShapeTiming]:
    """Timings for `shapes`: from the cache under `key`, measuring (and caching) only the missing ones."""
    data = cache.load()
    known = dict(data.get(key, {}))
    measured = False
    out: dict[LinearShape, ShapeTiming] = {}
    for shape in sorted(set(shapes)):
        if isinstance(cached := known.get(shape.key), dict) and {"bf16_ms", "fp8_ms"} <= cached.keys():
            out[shape] = ShapeTiming(float(cached["bf16_ms"]), float(cached["fp8_ms"]))
            continue
        out[shape] = timing = measure(shape)
        known[shape.key], measured = dataclasses.asdict(timing), True
    if measured:
        cache.save({**data, key: known})
    return out


def select_layers(
    shapes: dict[str, LinearShape], timings: dict[LinearShape, ShapeTiming], min_speedup: float = MIN_SPEEDUP
) -> list[str]:
    """The layers whose shape runs at least `min_speedup` times faster in FP8 than in bf16."""
    return [name for name, shape in shapes.items() if timings[shape].speedup >= min_speedup]


@dataclass
class AutoFp8:
    """The "auto" mode's plan, run on the first batch (when token counts are known), before compile.

    `measure` times one shape on the training GPU (`gpu_measure`); tests pass a fake timing table instead.
    Picklable (the measure and step timer given must be too): training runs it in a child process.
    """

    accelerator: Accelerator
    measure: Measure
    cache_path: Path = dataclasses.field(default_factory=default_cache_path)
    recipe: str = AUTO_RECIPE
    min_speedup: float = MIN_SPEEDUP
    time_step: StepTimer | None = None  # tests pass one; else `apply`'s, which times the real loss
    step_timing: ShapeTiming | None = None  # the whole step's bf16 and FP8 milliseconds, once measured

    def decide(self, model: nn.Module, run_forward: Callable[[], object], time_step: StepTimer) -> list[str]:
        """Record the candidates' shapes with one forward, time them (cache first), pick the faster ones, and keep
        them only if the whole step with them in FP8 is faster too (`time_step` times one, eager). Converts
        nothing: the caller converts the names returned (training decides in a child process, see
        `robotloop.train.policy.decide_fp8_auto_in_child`).

        Raises:
            Fp8FormatMismatch: see `check_formats`.
        """
        shapes = record_linear_shapes(model, fp8_candidates(model), run_forward)
        t0 = time.perf_counter()
        timings = shape_timings(
            shapes.values(), self.measure, TimingCache(self.cache_path), device_key(self.accelerator, self.recipe)
        )
        log.info(
            "FP8 auto: %d linear shapes timed in %.1f s (cache: %s)",
            len(timings),
            time.perf_counter() - t0,
            self.cache_path,
        )
        for shape, t in timings.items():
            log.info("FP8 auto: %s bf16 %.4f ms fp8 %.4f ms (%.2fx)", shape.key, t.bf16_ms, t.fp8_ms, t.speedup)
        chosen = select_layers(shapes, timings, self.min_speedup)
        if chosen and not self._whole_step_faster(model, chosen, self.time_step or time_step):
            chosen = []
        return chosen

    def _whole_step_faster(self, model: nn.Module, chosen: list[str], time_step: StepTimer) -> bool:
        trial = copy.deepcopy(model)
        convert_linears(trial, self.recipe, self.accelerator, only=chosen)
        # Alternated, median of each: on a GPU shared with other processes (or a CPU busy compiling) one timing
        # after the other would charge a passing load to whichever ran during it.
        bf16, fp8 = [], []
        for _ in range(WHOLE_STEP_ROUNDS):
            bf16.append(time_step(model))
            fp8.append(time_step(trial))
        self.step_timing = t = ShapeTiming(bf16_ms=statistics.median(bf16), fp8_ms=statistics.median(fp8))
        del trial
        faster = t.speedup >= self.min_speedup
        log.log(
            logging.INFO if faster else logging.WARNING,
            "FP8 auto: the step with %d layers in FP8 runs %.2fx of bf16's (%.1f ms against %.1f): %s",
            len(chosen),
            t.speedup,
            t.fp8_ms,
            t.bf16_ms,
            "converting them" if faster else "training in bf16",
        )
        return faster


def check_mode(mode: str) -> None:
    """The one check of an fp8 option's value (settings, CLI and `setup_fp8` call it).

    Raises:
        ValueError: `mode` is not one of FP8_MODES.
    """
    if mode not in FP8_MODES:
        raise BadValue(f"fp8 must be one of {', '.join(FP8_MODES)}, got {mode!r}")


def preflight(mode: str, device: str) -> None:
    """Fail before any data streams in: an unknown mode, or a recipe whose float8 formats do not fit `device`
    ("auto" never fails here: it falls back to bf16 on a device without FP8).

    Example:
        ```python
        >>> preflight("rowwise", "cpu")
        Fp8Unavailable: ...
        ```

    Raises:
        ValueError: unknown mode. Fp8Unavailable / Fp8FormatMismatch (both Fp8Error): see `check_formats`.
    """
    check_mode(mode)
    if mode in FP8_RECIPES:
        check_formats(float8_config(mode), Accelerator.detect(device))


def setup_fp8(
    model: nn.Module,
    mode: str,
    accelerator: Accelerator,
    measure: Callable[[], Measure],
    time_step: StepTimer | None = None,
) -> tuple[list[str], AutoFp8 | None]:
    """Apply `mode` to `model` at build time. Returns the layers converted now, and the AutoFp8 plan still to
    run on the first batch ("auto" on an FP8 device) or None. `measure` builds the shape timer, `time_step`
    replaces the whole-step timer ("auto" only; tests pass both).

    Raises:
        ValueError: unknown mode. Fp8Unavailable: a recipe on a device without FP8.
        Fp8FormatMismatch: TorchAO's formats do not fit the device (a recipe, or "auto" on an FP8 device).
    """
    check_mode(mode)
    if mode == "off":
        return [], None
    if mode in FP8_RECIPES:
        return convert_linears(model, mode, accelerator), None
    try:
        check_formats(float8_config(AUTO_RECIPE), accelerator)
    except Fp8Unavailable:
        log.warning("fp8=auto: %s has no FP8; training in bf16 (no layer converted)", accelerator.label)
        return [], None
    return [], AutoFp8(accelerator, measure(), time_step=time_step)


# ----- GPU timing (not runnable on CPU) ------------------------------------------------------------------


def gpu_measure(device: str | torch.device, compile_mode: str = "default", recipe: str = AUTO_RECIPE) -> Measure:
    """A Measure timing one shape on `device` as training runs it: fp32 weights under bf16 autocast, compiled
    with `compile_mode`, forward + backward (grad_input and grad_weight)."""
    device = torch.device(device)

    def measure(shape: LinearShape) -> ShapeTiming:
        bf16 = time_linear(shape, None, device, compile_mode)
        fp8 = time_linear(shape, float8_config(recipe), device, compile_mode)
        return ShapeTiming(bf16_ms=bf16, fp8_ms=fp8)

    return measure


def time_linear(
    shape: LinearShape, config, device: torch.device, compile_mode: str = "default", iters: int = 50, repeats: int = 5
) -> float:
    """Median milliseconds of one compiled forward + backward of `shape` (FP8 when `config` is given)."""
    from torchao.float8.float8_linear import Float8Linear

    # A fresh dynamo state per layer: every measurement compiles the same code objects (Linear.forward), and
    # past dynamo's recompile limit it would silently time eager code. Runs before the policy compiles.
    torch._dynamo.reset()
    linear = nn.Linear(shape.in_features, shape.out_features, device=device)
    if config is not None:
        linear = Float8Linear.from_float(linear, config=config)
    fwd = torch.compile(linear, mode=compile_mode, dynamic=False)
    x = torch.randn(shape.tokens, shape.in_features, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(shape.tokens, shape.out_features, device=device, dtype=torch.bfloat16)

    def step() -> None:
        torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = fwd(x)
        y.backward(grad)
        x.grad = linear.weight.grad = linear.bias.grad = None  # training zeroes grads with set_to_none too

    for _ in range(3):  # compile and warm up
        step()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


__all__ = [
    "FP8_MODES",
    "check_mode",
    "preflight",
    "FP8_RECIPES",
    "Accelerator",
    "AutoFp8",
    "Float8Formats",
    "Fp8Error",
    "Fp8FormatMismatch",
    "Fp8Unavailable",
    "LinearShape",
    "ShapeTiming",
    "StepTimer",
    "TimingCache",
    "check_formats",
    "convert_linears",
    "float8_config",
    "fp8_candidates",
    "gpu_measure",
    "record_linear_shapes",
    "select_layers",
    "setup_fp8",
    "shape_timings",
]
