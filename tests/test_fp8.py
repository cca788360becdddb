"""robotloop.train.fp8: FP8 formats follow the device, the layer rule, "auto" selection + cache, checkpoints.

CPU only. Two stand-ins, and no other mocks:
- Simulated devices: `Accelerator` descriptions of an H100, an L4, an A100, an MI300X, an MI350X. The format
  check takes one, so it runs here as it would on those GPUs.
- Injected timings: "auto" normally times each linear shape on the GPU; here a fake timing table stands in
  for those GPU timings, so the selection and cache logic run without one.
With a simulated H100, TorchAO's tensorwise recipe really runs on CPU (torch._scaled_mm has a CPU kernel for
per-tensor scales), so a tiny ACT trains a few FP8 steps here; rowwise needs a GPU and is only swapped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import get_args

import pytest
import torch
import torchao.float8.config as torchao_config
from lerobot.policies.act.modeling_act import ACTPolicy
from torch import nn
from torchao.float8 import CastConfig
from torchao.float8.float8_linear import Float8Linear
from typer.testing import CliRunner

from robotloop.cli import app
from robotloop.train.fp8 import (
    FNUZ_FORMATS,
    FP8_MODES,
    OCP_FORMATS,
    Accelerator,
    Fp8FormatMismatch,
    Fp8Unavailable,
    LinearShape,
    ShapeTiming,
    check_formats,
    float8_config,
    fp8_candidates,
    record_linear_shapes,
    select_layers,
)
from robotloop.train.jobs import JobSpec
from robotloop.train.policy import ACTSettings, build_policy

from .test_train_policy import FEATURES, _batch, _settings, _stats

H100 = Accelerator("nvidia", "NVIDIA H100 80GB HBM3", capability=(9, 0))
L4 = Accelerator("nvidia", "NVIDIA L4", capability=(8, 9))
A100 = Accelerator("nvidia", "NVIDIA A100-SXM4-80GB", capability=(8, 0))
MI300X = Accelerator("amd", "AMD Instinct MI300X", arch="gfx942:sramecc+:xnack-")
MI350X = Accelerator("amd", "AMD Instinct MI350X", arch="gfx950")
MI250X = Accelerator("amd", "AMD Instinct MI250X", arch="gfx90a")

# The tiny ACT's FP8-eligible shapes: 64->128 / 128->64 feed-forward, and 64->64, 32->64 latent projections.
FFN = {(64, 128), (128, 64)}


def _fp8_settings(fp8: str, **kw) -> ACTSettings:
    return _settings(precision="bf16", fused_attention=True, fp8=fp8, **kw)


def test_float8_formats_follow_the_device() -> None:
    assert H100.float8_formats() == L4.float8_formats() == MI350X.float8_formats() == OCP_FORMATS
    assert MI300X.float8_formats() == FNUZ_FORMATS
    assert torch.finfo(FNUZ_FORMATS.e4m3).max == 240 and torch.finfo(OCP_FORMATS.e4m3).max == 448
    for device in (A100, MI250X, Accelerator("cpu")):
        with pytest.raises(Fp8Unavailable, match="SM 8.9"):
            device.float8_formats()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_torchao_config_formats_are_checked_against_the_device(recipe: str) -> None:
    config = float8_config(recipe)
    # What TorchAO itself chose at import (no ROCm MI300 here: the OCP formats), read from its config fields.
    assert torchao_config.e4m3_dtype == torch.float8_e4m3fn
    assert config.cast_config_input.target_dtype == torchao_config.e4m3_dtype
    assert config.pad_inner_dim
    assert check_formats(config, H100) == OCP_FORMATS
    # TorchAO's default on an MI300 would scale against 448 where the hardware saturates at 240: refused.
    with pytest.raises(Fp8FormatMismatch, match=r"float8_e4m3fn \(max 448\).*float8_e4m3fnuz \(max 240\)"):
        check_formats(config, MI300X)
    # The reverse: a config holding the fnuz formats (what TorchAO picks on an MI300 host) fits only there.
    fnuz = {torch.float8_e4m3fn: torch.float8_e4m3fnuz, torch.float8_e5m2: torch.float8_e5m2fnuz}
    casts = {
        f.name: dataclasses.replace(c, target_dtype=fnuz[c.target_dtype])
        for f in dataclasses.fields(config)
        if isinstance(c := getattr(config, f.name), CastConfig)
    }
    on_mi300 = dataclasses.replace(config, **casts)
    assert check_formats(on_mi300, MI300X) == FNUZ_FORMATS
    with pytest.raises(Fp8FormatMismatch, match="e4m3fnuz"):
        check_formats(on_mi300, H100)


def test_fp8_layers_are_linears_called_as_modules_with_dims_of_16() -> None:
    torch.manual_seed(0)
    tp = build_policy(FEATURES, _stats(), _settings(fused_attention=True))
    candidates = fp8_candidates(tp.policy)
    assert candidates and not any(".out_proj" in name for name in candidates)
    # The rest of ACT's linears: the 6-dim state and 5-dim action projections and the action head (5 outputs).
    left_out = {n for n, m in tp.policy.named_modules() if isinstance(m, nn.Linear) and ".out_proj" not in n}
    left_out -= candidates.keys()
    assert left_out == {
        "model.vae_encoder_robot_state_input_proj",
        "model.vae_encoder_action_input_proj",
        "model.encoder_robot_state_input_proj",
        "model.action_head",
    }
    # The rule holds for lerobot's ACT: every candidate runs as a module in a training forward.
    shapes = record_linear_shapes(tp.policy, candidates, lambda: tp.loss(_batch()))
    assert shapes.keys() == candidates.keys()
    assert {(s.in_features, s.out_features) for s in shapes.values()} == FFN | {(64, 64), (32, 64)}


def test_a_recipe_refuses_devices_without_fp8_and_mismatched_formats() -> None:
    for device in (None, A100):  # None: this machine's CPU, detected
        with pytest.raises(Fp8Unavailable):
            build_policy(FEATURES, _stats(), _fp8_settings("tensorwise"), accelerator=device)
    with pytest.raises(Fp8FormatMismatch):
        build_policy(FEATURES, _stats(), _fp8_settings("rowwise"), accelerator=MI300X)
    with pytest.raises(ValueError, match="fp8 must be one of"):
        ACTSettings(fp8="fp4")
    with pytest.raises(ValueError, match="needs precision='bf16'"):
        ACTSettings(fp8="auto")


def test_cli_stops_before_training_without_fp8(tmp_path: Path) -> None:
    url = "hf://buckets/lab/demos/datasets/cube"
    result = CliRunner().invoke(app, ["train", "--dataset", url, "--output", url, "--fp8", "rowwise"])
    assert result.exit_code == 1 and "FP8 training needs an NVIDIA GPU of SM 8.9" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["train", "--dataset", url, "--output", url, "--fp8", "fp4"])
    assert result.exit_code == 2 and "fp8 must be one of off, auto, tensorwise" in " ".join(result.output.split())
    # The training service passes a job's fp8 to the same command; FP8_MODES and its Literal agree.
    argv = JobSpec(datasets=[url], output=url, fp8="auto").command(tmp_path / "progress")
    assert argv[argv.index("--fp8") + 1] == "auto"
    assert get_args(JobSpec.model_fields["fp8"].annotation) == FP8_MODES


def test_auto_falls_back_to_bf16_without_fp8(caplog: pytest.LogCaptureFixture) -> None:
    def no_gpu_timing(shape: LinearShape) -> ShapeTiming:
        raise AssertionError("nothing to measure on a device without FP8")

    with caplog.at_level(logging.WARNING, logger="robotloop.train.fp8"):
        tp = build_policy(FEATURES, _stats(), _fp8_settings("auto"), fp8_measure=no_gpu_timing)
    assert "fp8=auto: cpu has no FP8; training in bf16" in caplog.text
    assert torch.isfinite(tp.train_step(_batch())) and tp.fp8_layers == []
    assert not any(isinstance(m, Float8Linear) for m in tp.policy.modules())


def test_select_layers_needs_the_margin() -> None:
    a, b = LinearShape(64, 128, 400), LinearShape(128, 64, 400)
    timings = {a: ShapeTiming(bf16_ms=1.05, fp8_ms=1.0), b: ShapeTiming(bf16_ms=1.04, fp8_ms=1.0)}
    assert select_layers({"x": a, "y": b}, timings) == ["x"]


def test_auto_converts_only_faster_shapes_and_caches_timings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("robotloop.config.cache_home", lambda: tmp_path)  # the cache file lands under the test's dir
    measured: list[LinearShape] = []

    def fake_gpu_timings(shape: LinearShape) -> ShapeTiming:
        """Stands in for GPU timings: FP8 wins 1.3x on the feed-forward shapes, loses on the small ones."""
        measured.append(shape)
        fp8_ms = 1.0 if (shape.in_features, shape.out_features) in FFN else 1.5
        return ShapeTiming(bf16_ms=1.3, fp8_ms=fp8_ms)

    def build(measure):
        torch.manual_seed(0)
        return build_policy(
            FEATURES, _stats(), _fp8_settings("auto"), accelerator=H100, fp8_measure=measure, fp8_time_step=fp8_step
        )

    def fp8_step(model: nn.Module) -> float:
        """Stands in for the whole step's GPU timing: 1.2x faster with the chosen layers in FP8."""
        return 1.0 if any(isinstance(m, Float8Linear) for m in model.modules()) else 1.2

    tp = build(fake_gpu_timings)
    assert tp.fp8_layers == [] and not measured  # decided on the first batch, when token counts are known
    assert torch.isfinite(tp.train_step(_batch()))
    converted = {n for n, m in tp.policy.named_modules() if isinstance(m, Float8Linear)}
    assert converted == set(tp.fp8_layers) and converted
    assert all(n.endswith(("linear1", "linear2")) for n in converted)
    assert len(measured) == len(set(measured)) == 8  # 2 FFN shapes x 3 token counts, plus the 2 latent ones

    cache = json.loads((tmp_path / "fp8" / "linear_timings.json").read_text())
    ((key, table),) = cache.items()
    assert "NVIDIA H100 80GB HBM3 (SM 9.0)" in key and "tensorwise" in key and len(table) == 8

    def no_timing(shape: LinearShape) -> ShapeTiming:
        raise AssertionError(f"{shape} should come from the cache")

    again = build(no_timing)
    again.loss(_batch())  # the first forward is where "auto" decides
    assert again.fp8_layers == tp.fp8_layers

    (tmp_path / "fp8" / "linear_timings.json").write_text("{not json")
    measured.clear()
    build(fake_gpu_timings).loss(_batch())
    assert len(measured) == 8 and json.loads((tmp_path / "fp8" / "linear_timings.json").read_text())


def test_auto_keeps_bf16_when_the_whole_step_is_not_faster(tmp_path, monkeypatch, caplog) -> None:
    """Layers faster alone, a step no faster with them (what one H200 showed on the large ACT): bf16."""
    monkeypatch.setattr("robotloop.config.cache_home", lambda: tmp_path)
    stepped: list[bool] = []

    def fp8_faster_alone(shape: LinearShape) -> ShapeTiming:  # stands in for GPU timings of single layers
        return ShapeTiming(bf16_ms=2.0, fp8_ms=1.0)

    def fp8_step_slower(model: nn.Module) -> float:  # stands in for the whole step's GPU timing
        stepped.append(fp8 := any(isinstance(m, Float8Linear) for m in model.modules()))
        return 1.4 if fp8 else 1.0

    torch.manual_seed(0)
    auto = build_policy(
        FEATURES,
        _stats(),
        _fp8_settings("auto"),
        accelerator=H100,
        fp8_measure=fp8_faster_alone,
        fp8_time_step=fp8_step_slower,
    )
    with caplog.at_level(logging.INFO, logger="robotloop.train.fp8"):
        assert torch.isfinite(auto.train_step(_batch()))
    assert stepped == [False, True] * 3  # the model as it is, then a copy with the chosen layers in FP8, alternated
    assert auto.fp8_layers == [] and auto.fp8_step_timing == ShapeTiming(bf16_ms=1.0, fp8_ms=1.4)
    assert not any(isinstance(m, Float8Linear) for m in auto.policy.modules())
    assert "runs 0.71x of bf16's (1.4 ms against 1.0): training in bf16" in caplog.text


def test_timing_the_whole_step_leaves_no_trace() -> None:
    """The whole-step timer runs real forward + backward passes (BatchNorm learning its statistics, dropout and
    VAE noise drawing numbers): afterwards the run goes on exactly as without them."""
    settings = _settings(backbone_norm="batch")
    torch.manual_seed(0)
    timed = build_policy(FEATURES, _stats(), settings)
    twin = build_policy(FEATURES, _stats(), settings)
    twin.policy.load_state_dict(timed.policy.state_dict())
    batch = _batch()
    torch.manual_seed(7)
    assert timed.step_ms(batch, warmup=1, steps=2) > 0
    assert all(p.grad is None for p in timed.policy.parameters())
    l_timed = timed.train_step(batch)
    torch.manual_seed(7)
    l_twin = twin.train_step(batch)
    torch.testing.assert_close(l_timed, l_twin, rtol=0, atol=0)
    for (name, a), (_, b) in zip(timed.policy.named_buffers(), twin.policy.named_buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_auto_measuring_forward_leaves_the_run_random_stream_alone(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("robotloop.config.cache_home", lambda: tmp_path)

    def fp8_never_faster(shape: LinearShape) -> ShapeTiming:  # stands in for GPU timings
        return ShapeTiming(bf16_ms=1.0, fp8_ms=2.0)

    torch.manual_seed(0)
    auto = build_policy(FEATURES, _stats(), _fp8_settings("auto"), accelerator=H100, fp8_measure=fp8_never_faster)
    off = build_policy(FEATURES, _stats(), _settings(precision="bf16", fused_attention=True))
    off.policy.load_state_dict(auto.policy.state_dict())
    batch = _batch()
    torch.manual_seed(7)
    l_auto = auto.loss(batch)  # dropout 0.1 and VAE noise: equal only if the shape forward drew no numbers
    torch.manual_seed(7)
    l_off = off.loss(batch)
    assert auto.fp8_layers == []
    torch.testing.assert_close(l_auto, l_off, rtol=0, atol=0)


def ffn_faster_in_fp8(shape: LinearShape) -> ShapeTiming:
    """Stands in for GPU timings in a child process (module level: it is pickled there), and says which process
    timed: the pid goes to the file $FP8_CHILD_PID_FILE names."""
    Path(os.environ["FP8_CHILD_PID_FILE"]).write_text(str(os.getpid()))
    return ShapeTiming(bf16_ms=1.3, fp8_ms=1.0 if (shape.in_features, shape.out_features) in FFN else 1.5)


def whole_step_faster_in_fp8(model: nn.Module) -> float:  # stands in for the whole step's GPU timing
    return 1.0 if any(isinstance(m, Float8Linear) for m in model.modules()) else 1.2


def no_gpu_here(shape: LinearShape) -> ShapeTiming:  # a child whose GPU measurement fails
    raise RuntimeError("CUDA error: out of memory")


def test_auto_decides_in_a_child_process_and_the_run_converts_its_choice(tmp_path, monkeypatch, caplog) -> None:
    """What training does on a GPU: the measurements run in a spawned process, the run only converts the names."""
    monkeypatch.setattr("robotloop.config.cache_home", lambda: tmp_path)  # the child gets the parent's path
    monkeypatch.setenv("FP8_CHILD_PID_FILE", str(tmp_path / "pid"))
    settings = _fp8_settings("auto")
    torch.manual_seed(0)
    tp = build_policy(
        FEATURES,
        _stats(),
        settings,
        accelerator=H100,
        fp8_measure=ffn_faster_in_fp8,
        fp8_time_step=whole_step_faster_in_fp8,
        fp8_in_child=True,
    )
    assert torch.isfinite(tp.train_step(_batch()))
    assert int((tmp_path / "pid").read_text()) != os.getpid()  # timed in another process
    converted = {n for n, m in tp.policy.named_modules() if isinstance(m, Float8Linear)}
    assert converted == set(tp.fp8_layers) and converted
    assert all(n.endswith(("linear1", "linear2")) for n in converted)
    assert tp.fp8_step_timing == ShapeTiming(bf16_ms=1.2, fp8_ms=1.0)
    assert (tmp_path / "fp8" / "linear_timings.json").exists()

    monkeypatch.setattr("robotloop.config.cache_home", lambda: tmp_path / "empty")  # or the cache would answer
    broken = build_policy(FEATURES, _stats(), settings, accelerator=H100, fp8_measure=no_gpu_here, fp8_in_child=True)
    with caplog.at_level(logging.WARNING, logger="robotloop.train.fp8_auto"):
        assert torch.isfinite(broken.train_step(_batch()))
    assert broken.fp8_layers == [] and not any(isinstance(m, Float8Linear) for m in broken.policy.modules())
    assert "deciding in a child process failed (RuntimeError: CUDA error: out of memory" in caplog.text
    assert "training in bf16" in caplog.text


def test_fp8_checkpoint_is_a_plain_lerobot_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tp = build_policy(FEATURES, _stats(), _fp8_settings("tensorwise"), accelerator=H100)
    assert len(tp.fp8_layers) == 20
    assert torch.isfinite(tp.train_step(_batch()))  # real float8 GEMMs (CPU tensorwise kernel)

    sd = tp.state_dict_fp32()
    plain_keys = ACTPolicy(tp.policy.config).state_dict().keys()
    assert sd.keys() == plain_keys
    assert all(type(v) is torch.Tensor and v.dtype in (torch.float32, torch.int64) for v in sd.values())

    out = tp.save_pretrained(tmp_path / "ckpt")
    loaded = ACTPolicy.from_pretrained(out)
    assert not any(isinstance(m, Float8Linear) for m in loaded.modules())
    for k, v in loaded.state_dict().items():
        torch.testing.assert_close(v, sd[k], rtol=0, atol=0)

    # And back into an FP8 policy (how --resume loads weights): same keys, same values.
    back = build_policy(FEATURES, _stats(), _fp8_settings("rowwise"), accelerator=H100)
    back.policy.load_state_dict(loaded.state_dict())
    for k, v in back.state_dict_fp32().items():
        torch.testing.assert_close(v, sd[k], rtol=0, atol=0)
