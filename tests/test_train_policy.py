"""robotloop.train.policy: the ACT model step matches lerobot's own ACT and saves lerobot checkpoints.

CPU only, tiny ACT (dim_model 64, chunk 10, one 48x64 camera, random-init ResNet18 backbone).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
from lerobot.utils.constants import IMAGENET_STATS

from robotloop.train.policy import (
    ACTSettings,
    FusedMultiheadAttention,
    TrainablePolicy,
    build_policy,
    make_act_config,
)

CAM = "observation.images.top"
B, CHUNK, S, A, H, W = 4, 10, 6, 5, 48, 64

FEATURES = {
    CAM: {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]},
    "observation.state": {"dtype": "float32", "shape": [S], "names": None},
    "action": {"dtype": "float32", "shape": [A], "names": None},
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
}


def _stats() -> dict:
    g = torch.Generator().manual_seed(1)
    vec = lambda n, lo=0.0: (torch.rand(n, generator=g) + lo).tolist()  # noqa: E731
    return {
        "observation.state": {"mean": vec(S), "std": vec(S, 0.5), "min": vec(S, -1), "max": vec(S, 1)},
        "action": {"mean": vec(A), "std": vec(A, 0.5), "min": vec(A, -1), "max": vec(A, 1)},
        CAM: {"mean": [[[0.4]], [[0.5]], [[0.6]]], "std": [[[0.2]], [[0.25]], [[0.3]]]},
        "timestamp": {"mean": [0.0], "std": [1.0]},
    }


def _settings(**kw) -> ACTSettings:
    base = dict(dim_model=64, dim_feedforward=128, chunk_size=CHUNK, n_action_steps=CHUNK)
    return ACTSettings(**{**base, **kw})


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pad = torch.zeros(B, CHUNK, dtype=torch.bool)
    pad[0, 6:] = True  # one episode end inside the chunk
    return {
        CAM: torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, generator=g),
        "observation.state": torch.randn(B, S, generator=g),
        "action": torch.randn(B, CHUNK, A, generator=g),
        "action_is_pad": pad,
    }


def _lerobot_reference(tp: TrainablePolicy) -> tuple[ACTPolicy, object]:
    """Plain lerobot: ACTPolicy with tp's weights, processors from dataset stats with ImageNet camera stats
    (as lerobot.datasets.factory sets them for lerobot-train)."""
    cfg = make_act_config(FEATURES, tp.settings, torch.device("cpu"))
    ref = ACTPolicy(cfg)
    ref.load_state_dict(tp.policy.state_dict())
    stats = _stats()
    stats[CAM] = {k: torch.tensor(v, dtype=torch.float32) for k, v in IMAGENET_STATS.items()}
    pre, _ = make_pre_post_processors(cfg, dataset_stats=stats)
    return ref, pre


def _lerobot_loss(ref: ACTPolicy, pre, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    b = dict(batch)
    b[CAM] = b[CAM].to(torch.float32) / 255.0  # lerobot_train.py does this before its preprocessor
    ref.train()
    loss, _ = ref.forward(pre(b))
    return loss


@pytest.mark.parametrize(
    "kw",
    [
        # Fused attention changes dropout's RNG use, so parity with it on is checked with dropout off.
        dict(use_vae=True, dropout=0.0, fused_attention=True, channels_last=True),
        dict(use_vae=False, dropout=0.0, fused_attention=True, channels_last=True),
        # Same module path as lerobot, so dropout and VAE noise draw identical random numbers.
        dict(use_vae=True, dropout=0.1, fused_attention=False, channels_last=True),
    ],
)
def test_loss_matches_lerobot(kw: dict) -> None:
    torch.manual_seed(0)
    tp = build_policy(FEATURES, _stats(), _settings(**kw))
    assert (
        all(
            type(m) is FusedMultiheadAttention
            for m in tp.policy.modules()
            if isinstance(m, torch.nn.MultiheadAttention)
        )
        == kw["fused_attention"]
    )
    ref, pre = _lerobot_reference(tp)
    batch = _batch()
    torch.manual_seed(123)
    ours = tp.loss(batch)
    torch.manual_seed(123)
    theirs = _lerobot_loss(ref, pre, batch)
    assert ours.ndim == 0 and ours.requires_grad
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-5, atol=0)


def test_steps_reduce_loss_and_bf16_runs() -> None:
    torch.manual_seed(0)
    tp = build_policy(
        FEATURES, _stats(), _settings(use_vae=False, dropout=0.0, lr=1e-3, lr_backbone=1e-3, channels_last=True)
    )
    opt = tp.optimizer()
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-3] and len(opt.param_groups[1]["params"]) > 0
    batch = _batch()
    first = tp.loss(batch).item()
    losses = [tp.train_step(batch) for _ in range(6)]
    assert all(not t.requires_grad for t in losses)
    assert tp.loss(batch).item() < 0.8 * first

    torch.manual_seed(0)
    bf = build_policy(FEATURES, _stats(), _settings(precision="bf16", fused_attention=True, channels_last=True))
    fp = build_policy(FEATURES, _stats(), _settings())
    fp.policy.load_state_dict(bf.policy.state_dict())
    torch.manual_seed(5)
    l_bf = bf.loss(batch)
    torch.manual_seed(5)
    l_fp = fp.loss(batch)
    assert l_bf.dtype == torch.float32 and torch.isfinite(l_bf)
    torch.testing.assert_close(l_bf.detach(), l_fp.detach(), rtol=0.1, atol=0)
    loss = bf.train_step(batch)
    assert torch.isfinite(loss)
    assert all(p.dtype == torch.float32 for p in bf.policy.parameters())


def test_save_pretrained_loads_in_lerobot(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tp = build_policy(FEATURES, _stats(), _settings(precision="bf16", fused_attention=True, channels_last=True))
    tp.train_step(_batch())  # trained weights, channels_last conv weights
    out = tp.save_pretrained(tmp_path / "ckpt")
    cfg_json = json.loads((out / "config.json").read_text())
    assert cfg_json["type"] == "act" and cfg_json["pretrained_backbone_weights"] is None

    loaded = ACTPolicy.from_pretrained(out)
    mine = tp.policy.state_dict()
    theirs = loaded.state_dict()
    assert mine.keys() == theirs.keys()
    for k, v in theirs.items():
        assert v.dtype == mine[k].dtype == (torch.float32 if v.is_floating_point() else v.dtype), k
        torch.testing.assert_close(v, mine[k], rtol=0, atol=0)

    pre, post = make_pre_post_processors(loaded.config, pretrained_path=str(out))
    obs = {k: v for k, v in _batch().items() if k not in ("action", "action_is_pad")}
    obs[CAM] = obs[CAM].to(torch.float32) / 255.0
    ours_in, theirs_in = tp.preprocessor(dict(obs)), pre(dict(obs))
    for k in (CAM, "observation.state"):
        torch.testing.assert_close(ours_in[k], theirs_in[k], rtol=0, atol=0)

    tp.policy.eval()
    with torch.no_grad():
        a_ours = tp.policy.predict_action_chunk(ours_in)
        a_theirs = loaded.predict_action_chunk(theirs_in)
    torch.testing.assert_close(a_ours, a_theirs, rtol=1e-4, atol=1e-5)
    assert post(a_theirs).shape == (B, CHUNK, A)


def test_no_download_and_local_backbone_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("tried to download weights")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", no_network, raising=False)
    build_policy(FEATURES, _stats(), ACTSettings())  # lerobot's full default ACT, random backbone

    torch.manual_seed(3)
    sd = {
        k: torch.randn_like(v.float()) if v.is_floating_point() else v
        for k, v in torchvision.models.resnet18(weights=None).state_dict().items()
    }
    path = tmp_path / "resnet18.pt"
    torch.save(sd, path)
    tp = build_policy(FEATURES, _stats(), _settings(backbone_weights=path, channels_last=True))
    got = tp.policy.model.backbone.state_dict()
    expect = {k: v for k, v in sd.items() if not k.startswith("fc.") and not k.endswith("num_batches_tracked")}
    assert got.keys() == expect.keys()
    for k, v in expect.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0)

    with pytest.raises(FileNotFoundError):
        build_policy(FEATURES, _stats(), _settings(backbone_weights=tmp_path / "missing.pt"))


def test_compile_cache_persists_under_robotloop_cache_unless_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """inductor's default cache is in /tmp (wiped by containers and reboots; a cold ACT compile took 191 s)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from robotloop.config import cache_home
    from robotloop.train.policy import use_persistent_compile_cache

    for unset_or_default in (None, default_cache_dir()):
        if unset_or_default is None:
            monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", unset_or_default)
        assert use_persistent_compile_cache() == cache_home() / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/srv/compile-cache")  # the user's choice stands
    assert str(use_persistent_compile_cache()) == "/srv/compile-cache"
