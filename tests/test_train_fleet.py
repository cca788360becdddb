"""Training on demos and fleet data together (issue 29): each frame is drawn by its weight, from its dataset's role
(demos; fleet data, which records `intervention`), its episode's success and who drove it.

The frames are known, as in test_train_data: in episode k at frame t the state is 100k + t and the action
1000k + t (the policy's proposal, -(1000k + t)). The demos are test_train_data's (k = 0, 1, 2); the fleet dataset's
episodes are
  k = 5: autonomous, succeeded (10 frames)
  k = 6: autonomous, failed (10 frames)
  k = 7: a takeover that failed: the expert drove frames 4-7 of 12, the policy the rest
so with the default weights episode 5's frames weigh 1, episode 6's and 7's autonomous frames 0 (dropped) and 7's
expert frames 2.
"""

import json
import logging

import numpy as np
import pytest
import torch

from robotloop.capture import DatasetRecorder, DatasetSpec, Episode
from robotloop.errors import BadInput, BadValue
from robotloop.features import INTERVENTION_KEY as INTERVENTION
from robotloop.features import SUCCESS_KEY as SUCCESS
from robotloop.storage import BucketClient, BucketUrl, NotFound
from robotloop.train.data import NothingToTrain, StreamingSampler, Weighting
from robotloop.train.data.weighting import dataset_frames, with_share
from robotloop.train.weights import FrameWeights, autonomous_outcome

from .conftest import WRITE_TOKEN
from .test_train_data import CHUNK, LENGTHS, known_episode, record, settings, where

FLEET_SPEC = DatasetSpec({"top": (24, 32, 3)}, state_dim=4, action_dim=3, fps=50, vcodec="h264", fleet=True)
FLEET = {5: (10, True, range(0)), 6: (10, False, range(0)), 7: (12, False, range(4, 8))}  # k: frames, success, expert
DRAWS = 40  # batches of 256


def fleet_episode(k: int, frames: int, success: bool, expert: range) -> Episode:
    episode = known_episode(k, frames)
    episode.reward = np.zeros(frames, np.float32)
    episode.success = np.arange(frames) == (frames - 1 if success else -1)  # solved at the last frame
    episode.intervention = np.isin(np.arange(frames), list(expert))
    episode.policy_action = -episode.action
    return episode


def record_fleet(client: BucketClient, url: BucketUrl, episodes: dict, staging) -> None:
    recorder = DatasetRecorder(client, url, FLEET_SPEC, staging=staging)
    for k, (frames, success, expert) in episodes.items():
        recorder.commit(fleet_episode(k, frames, success, expert))


def weight_of(k: int, t: int, w: FrameWeights, demos: str = "", fleet: str = "") -> float:
    """What frame t of episode k weighs: the module docstring's table, by hand."""
    if k < 5:
        return w.demo * w.datasets.get(demos, 1.0)
    _, success, expert = FLEET[k]
    kind = w.expert if t in expert else (w.autonomous_success if success else w.autonomous_failed)
    return kind * w.datasets.get(fleet, 1.0)


def counts(sampler: StreamingSampler, batches: int = DRAWS) -> dict[tuple[int, int], int]:
    """How often each (episode, frame) was drawn in `batches` batches of 256."""
    seen: dict[tuple[int, int], int] = {}
    for _ in range(batches):
        for key in zip(*where(sampler.next_batch(256)), strict=True):
            seen[tuple(map(int, key))] = seen.get(tuple(map(int, key)), 0) + 1
    return seen


def assert_drawn_by_weight(seen: dict, frames: dict[int, int], weight) -> None:
    """Every frame of weight 0 never drawn; every other one within 5 sigma of its share of the draws."""
    weights = {(k, t): weight(k, t) for k, n in frames.items() for t in range(n)}
    total, draws = sum(weights.values()), sum(seen.values())
    assert set(seen) <= {key for key, w in weights.items() if w > 0}, "a frame of weight 0 was drawn"
    for key, w in weights.items():
        expected = draws * w / total
        assert abs(seen.get(key, 0) - expected) < 5 * np.sqrt(expected) + 1, (key, seen.get(key, 0), expected)


@pytest.fixture(scope="module")
def fleet(bucket_server, tmp_path_factory) -> BucketUrl:
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/train-fleet/datasets/fleet")
    record_fleet(client, url, FLEET, tmp_path_factory.mktemp("stage"))
    return url


@pytest.fixture(scope="module")
def demos(bucket_server, tmp_path_factory) -> BucketUrl:
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/train-fleet/datasets/demos")
    record(client, url, LENGTHS, tmp_path_factory.mktemp("stage"))
    return url


@pytest.fixture(scope="module")
def failures(bucket_server, tmp_path_factory) -> BucketUrl:
    """Fleet data with no success and no expert frame."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/train-fleet/datasets/failures")
    record_fleet(client, url, {6: FLEET[6], 8: (10, False, range(0))}, tmp_path_factory.mktemp("stage"))
    return url


def test_fleet_frames_are_drawn_by_their_weight_and_chunks_read_on(bucket_server, fleet):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    with StreamingSampler(client, [fleet], settings()) as sampler:
        sampler.wait_ready(timeout_s=120)
        seen = counts(sampler)
        w = FrameWeights()
        assert_drawn_by_weight(seen, {k: n for k, (n, _, _) in FLEET.items()}, lambda k, t: weight_of(k, t, w))
        assert not any(k == 6 for k, _ in seen) and {t for k, t in seen if k == 7} == {4, 5, 6, 7}
        expert = np.mean([seen[(7, t)] for t in range(4, 8)]) / np.mean([seen[(5, t)] for t in range(10)])
        assert 1.8 < expert < 2.2  # expert frames twice as often as successful autonomous ones

        # A drawn frame's chunk reads the actions that followed, frames of weight 0 too, padded as before.
        batch = sampler.next_batch(512)
        k, t = where(batch)
        length = np.array([FLEET[e][0] for e in k])
        ahead = t[:, None] + np.arange(CHUNK)
        assert (batch["action"][:, :, 0].numpy() == 1000 * k[:, None] + np.minimum(ahead, length[:, None] - 1)).all()
        assert (batch["action_is_pad"].numpy() == (ahead >= length[:, None])).all()
        last_expert = int(np.flatnonzero((k == 7) & (t == 7))[0])
        assert batch["action"][last_expert, 1:5, 0].tolist() == [7008, 7009, 7010, 7011]  # the policy's frames after
        assert set(batch) == {"observation.images.top", "observation.state", "action", "action_is_pad"}

        # Episode 6 (the dataset's episode 1) weighs 0 whole: never decoded, never buffered, not in the lineage.
        assert sorted(i for _, i in sampler.buffered_episodes) == [0, 2]
        assert [e["episode_index"] for e in sampler.episodes()] == [0, 2]
        kinds = {s["dataset"]: s for s in sampler.frame_kinds()}[str(fleet)]
        assert (kinds["role"], kinds["frames"], kinds["expert"], kinds["dropped"]) == ("fleet", 32, 4, 18)
        assert (kinds["autonomous_success"], kinds["autonomous_failed"]) == (10, 18)


def test_weighted_draws_are_seeded_and_resume_exactly(bucket_server, fleet, demos):
    import io

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    data = settings(weights=FrameWeights(expert=3.0))
    with StreamingSampler(client, [demos, fleet], data) as a:
        a.wait_ready(timeout_s=120)
        first = [a.next_batch(16) for _ in range(3)]
        state = io.BytesIO()
        torch.save(a.state_dict(), state)
        after = [a.next_batch(16) for _ in range(3)]
    with StreamingSampler(client, [demos, fleet], data) as b:
        b.wait_ready(timeout_s=120)
        again = [b.next_batch(16) for _ in range(3)]
        state.seek(0)
        b.load_state_dict(torch.load(state, weights_only=True))
        resumed = [b.next_batch(16) for _ in range(3)]
    for x, y in [*zip(first, again, strict=True), *zip(after, resumed, strict=True)]:
        assert all(torch.equal(x[key], y[key]) for key in x)
    # Resumed with weights that drop episodes the saved state names: they are left out, not missing.
    with StreamingSampler(client, [fleet], settings(weights=FrameWeights(autonomous_failed=1.0))) as a:
        a.wait_ready(timeout_s=120)
        saved = a.state_dict()
        assert len(saved["known"]) == 3
    with StreamingSampler(client, [fleet], settings()) as b:
        b.load_state_dict(saved)
        assert {k for k, _ in counts(b, batches=4)} == {5, 7}


def test_demos_and_fleet_data_mix_by_role_and_dataset_weight(bucket_server, fleet, demos, caplog):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    w = FrameWeights(expert=3.0, autonomous_success=0.5, datasets={str(demos): 0.25})
    with caplog.at_level(logging.WARNING), StreamingSampler(client, [demos, fleet], settings(weights=w)) as sampler:
        sampler.wait_ready(timeout_s=120)
        seen = counts(sampler)
    frames = dict(enumerate(LENGTHS)) | {k: n for k, (n, _, _) in FLEET.items()}
    assert_drawn_by_weight(seen, frames, lambda k, t: weight_of(k, t, w, str(demos), str(fleet)))
    # The fleet's failures are said to be left out (demos drop nothing: no line for them).
    notes = [r.getMessage() for r in caplog.records if "not trained on" in r.getMessage()]
    assert notes == [
        f"{fleet} (4 expert, 10 autonomous in successful episodes, 18 in failed or taken-over episodes): "
        "18 of 32 frames weigh 0, not trained on"
    ]


def test_a_share_of_the_draws_goes_to_the_experts_gathered_frames_whatever_their_number(bucket_server, fleet, demos):
    # The fleet's 4 expert frames weigh 8 (at 2) against the rest: the demos' 62 frames at 0.5 (31) and the fleet's
    # 10 autonomous successes (10). In proportion they would get 8 of 49 draws; given a share of 0.6, they get 60%,
    # by one factor on the expert weight; the policy's own frames keep theirs.
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    base = FrameWeights(datasets={str(demos): 0.5})
    w = with_share(base, dataset_frames(client, [demos, fleet], base), set(), 0.6)
    assert w.expert == pytest.approx(2.0 * 0.6 / 0.4 * 41 / 8) and w.datasets == base.datasets
    assert (w.demo, w.autonomous_success, w.autonomous_failed) == (1.0, 1.0, 0.0)
    with StreamingSampler(client, [demos, fleet], settings(weights=w)) as sampler:
        sampler.wait_ready(timeout_s=120)
        seen = counts(sampler)
    frames = dict(enumerate(LENGTHS)) | {k: n for k, (n, _, _) in FLEET.items()}
    assert_drawn_by_weight(seen, frames, lambda k, t: weight_of(k, t, w, str(demos), str(fleet)))
    expert = sum(n for (k, t), n in seen.items() if k in FLEET and t in FLEET[k][2]) / sum(seen.values())
    assert expert == pytest.approx(0.6, abs=0.02)  # 10,240 draws: 4 standard deviations
    # Extra demo datasets (re-demonstrations) count as the expert's: here the demos themselves, at 0.6 with the fleet's.
    both = with_share(base, dataset_frames(client, [demos, fleet], base), {str(demos)}, 0.6)
    assert both.expert / 2.0 == pytest.approx(both.datasets[str(demos)] / 0.5) == pytest.approx(1.5 * 10 / 39)
    # No expert frame gathered (a round whose robots all succeeded alone): the weights as they were.
    assert with_share(base, dataset_frames(client, [demos], base), set(), 0.5) == base
    with pytest.raises(BadValue, match="between 0 and 1"):
        with_share(base, [], set(), 1.0)


def test_fleet_data_with_no_success_and_no_expert_frame_is_refused(bucket_server, failures, fleet, demos, caplog):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    with pytest.raises(NothingToTrain, match="nothing to train on") as refused:
        StreamingSampler(client, [failures], settings())  # before any frame is decoded
    assert isinstance(refused.value, BadInput)
    assert (
        f"{failures} (0 expert, 0 autonomous in successful episodes, 20 in failed or taken-over episodes): 20 of 20"
        in str(refused.value)
    )
    # Given the demos too, it trains on them, and says what it left out.
    with caplog.at_level(logging.WARNING), StreamingSampler(client, [demos, failures], settings()) as sampler:
        sampler.wait_ready(timeout_s=120)
        assert {k for k, _ in counts(sampler, batches=4)} == {0, 1, 2}
    assert any(f"{failures} " in r.getMessage() and "20 of 20 frames weigh 0" in r.getMessage() for r in caplog.records)
    # Several fleet datasets (a round's ten robots) are summed in one line, said before any frame is decoded.
    caplog.clear()
    with caplog.at_level(logging.WARNING), StreamingSampler(client, [demos, fleet, failures], settings()):
        pass
    assert [r.getMessage() for r in caplog.records if "not trained on" in r.getMessage()] == [
        "2 fleet datasets (4 expert, 10 autonomous in successful episodes, 38 in failed or taken-over episodes): "
        "38 of 52 frames weigh 0, not trained on"
    ]
    # Weighing the failures is the caller's choice.
    with StreamingSampler(client, [failures], settings(weights=FrameWeights(autonomous_failed=1.0))) as sampler:
        assert {k for k, _ in counts(sampler, batches=2)} <= {6, 8}


def test_without_metadata_stats_the_decoded_frames_say_there_is_nothing_to_train_on(
    bucket_server, failures, monkeypatch
):
    """A dataset whose episodes metadata has no stats (another writer's) is weighed as it decodes: the first batch
    is refused once every episode turned out to weigh 0, instead of waiting for ever."""
    monkeypatch.setattr(Weighting, "planned", lambda self, ref: None)
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    with StreamingSampler(client, [failures], settings()) as sampler, pytest.raises(NothingToTrain, match="nothing"):
        sampler.next_batch(8)


def test_train_command_says_there_is_nothing_to_train_on(bucket_server, failures):
    from typer.testing import CliRunner

    from robotloop.cli import app

    args = ["--endpoint", bucket_server.endpoint, "--token", WRITE_TOKEN, "train", "--dataset", str(failures)]
    args += ["--output", "hf://buckets/lab/train-fleet/models/none", "--tiny", "--device", "cpu", "--steps", "1"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: nothing to train on, every frame weighs 0:"), result.output
    assert "Traceback" not in result.output


def test_a_fleet_dataset_loads_in_lerobot(bucket_server, fleet, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    BucketClient(bucket_server.endpoint, WRITE_TOKEN).fetch(fleet, tmp_path / "copy")
    dataset = LeRobotDataset(fleet.bucket_id, root=tmp_path / "copy")
    assert dataset.meta.features["intervention"]["dtype"] == "bool"
    assert dataset.meta.features["policy_action"]["shape"] == (3,)
    starts = np.cumsum([0, *(n for n, _, _ in FLEET.values())])
    for (k, (_, success, expert)), start in zip(FLEET.items(), starts, strict=False):
        for t in (0, 5):
            item = dataset[int(start) + t]
            assert float(item["action"][0]) == 1000 * k + t
            assert bool(item["intervention"]) == (t in expert)
            assert torch.equal(item["policy_action"], -item["action"])
        assert bool(dataset[int(start) + FLEET[k][0] - 1]["next.success"]) == success
    meta = json.loads((tmp_path / "copy" / "meta" / "info.json").read_text())
    assert meta["total_episodes"] == 3


TINY = dict(dim_model=32, dim_feedforward=64, n_heads=2, n_encoder_layers=1, n_vae_encoder_layers=1, chunk_size=5)


def _train(client, datasets, out, steps, act=None, **kw):
    from robotloop.train.data import DataSettings
    from robotloop.train.policy import ACTSettings
    from robotloop.train.trainer import TrainSettings, train

    # No export of the last checkpoint: seconds of 2 cores, five times, that these tests are not about
    settings = TrainSettings(
        **{"steps": steps, "batch_size": 4, "checkpoint_every": steps, "seed": 7, "onnx": "off", **kw}
    )
    settings.deterministic = True
    act = act or ACTSettings(**TINY, n_action_steps=5)
    return train(client, datasets, out, settings, act, DataSettings(decode_workers=1))


def _checkpoint(client, url: str, dest) -> tuple[dict, dict]:
    """A checkpoint's weights and lineage."""
    from safetensors.torch import load_file

    client.fetch(BucketUrl.parse(url), dest)
    return load_file(dest / "pretrained_model" / "model.safetensors"), json.loads((dest / "lineage.json").read_text())


def _normalizer(checkpoint) -> dict[str, list]:
    """The normalization stats a fetched checkpoint's preprocessor saved: "action.mean" -> values."""
    from safetensors.numpy import load_file

    (path,) = (checkpoint / "pretrained_model").glob("policy_preprocessor_step_*_normalizer_processor.safetensors")
    return {k: v.ravel().tolist() for k, v in load_file(path).items()}


def assert_same_actions(parent, child) -> None:
    """The two saved policies give the same actions for the same random observations (3 at once)."""
    from robotloop.deploy.runner import PolicyRunner

    runners = PolicyRunner.load(parent), PolicyRunner.load(child)
    rng = np.random.default_rng(0)
    images = {
        key.removeprefix("observation.images."): rng.integers(0, 256, (3, h, w, c), dtype=np.uint8)
        for key, (c, h, w) in runners[0].image_shapes.items()
    }
    states = (rng.normal(size=(3, runners[0].state_dim)) * 100).astype(np.float32)
    actions = [r.act_batch(images, states) for r in runners]
    assert np.allclose(actions[0], actions[1], rtol=1e-4, atol=1e-3), np.abs(actions[0] - actions[1]).max()


def test_a_round_fine_tunes_from_the_last_rounds_weights(bucket_server, demos, fleet, tmp_path):
    from robotloop.train.policy import ACTSettings

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    first = BucketUrl.parse("hf://buckets/lab/train-fleet/models/round1")
    _train(client, [demos], first, steps=3)
    # The next round: demos and fleet data, from round 1's weights (its run URL: the last checkpoint). Another seed
    # (fresh weights would differ) and a learning rate too small to move them: the weights are round 1's.
    second = BucketUrl.parse("hf://buckets/lab/train-fleet/models/round2")
    still = ACTSettings(**TINY, n_action_steps=5, lr=1e-12, lr_backbone=1e-12)
    report = _train(client, [demos, fleet], second, steps=2, act=still, init_from=str(first), seed=8)
    assert [s for s, _ in report.losses] == [0, 1]  # a new run: its own steps, not round 1's
    before, _ = _checkpoint(client, f"{first}/checkpoints/000003", tmp_path / "r1")
    after, lineage = _checkpoint(client, report.checkpoints[-1], tmp_path / "r2")
    assert all(torch.allclose(before[k], after[k], atol=1e-6) for k in before)
    assert lineage["init_from"] == f"{first}/checkpoints/000003"
    assert lineage["data"]["weights"] == {
        "demo": 1.0,
        "expert": 2.0,
        "autonomous_success": 1.0,
        "autonomous_failed": 0.0,
        "datasets": {},
    }
    fleet_frames = {s["dataset"]: s for s in lineage["sources"]}[str(fleet)]
    assert (fleet_frames["frames"], fleet_frames["dropped"], fleet_frames["expert"]) == (32, 18, 4)
    # It normalizes as round 1 did, though the fleet's actions (1000k + t) move the data's stats far: new stats
    # would move every input and output the weights map. Asked for the data's, it takes those.
    assert _normalizer(tmp_path / "r2") == _normalizer(tmp_path / "r1")
    # And it acts as round 1 does, through the runner robots and evaluation load: a fault anywhere in the saved
    # policy (config, processors, saved inputs) would show here, not only in a GPU run's success rate.
    assert_same_actions(tmp_path / "r1" / "pretrained_model", tmp_path / "r2" / "pretrained_model")
    data_stats = _train(client, [demos, fleet], second / "data", 1, act=still, init_from=str(first), init_stats="data")
    _checkpoint(client, data_stats.checkpoints[-1], tmp_path / "r2-data")
    own, theirs = _normalizer(tmp_path / "r2-data"), _normalizer(tmp_path / "r1")
    assert own["action.mean"] != theirs["action.mean"] and max(own["action.max"]) > 1000
    # Resumed, the run still says where it came from, and normalizes as its first session did.
    resumed = _train(client, [demos, fleet], second, steps=3, act=still, seed=8, resume=True)
    assert _checkpoint(client, resumed.checkpoints[-1], tmp_path / "r2b")[1]["init_from"] == lineage["init_from"]
    assert _normalizer(tmp_path / "r2b") == _normalizer(tmp_path / "r1")

    with pytest.raises(ValueError, match=r"another model: chunk_size 5 \(asked: 4\).*without --init-from"):
        _train(
            client,
            [demos],
            BucketUrl.parse("hf://buckets/lab/train-fleet/models/r3"),
            2,
            act=ACTSettings(**{**TINY, "chunk_size": 4}, n_action_steps=4),
            init_from=str(first),
        )
    with pytest.raises(NotFound, match="no checkpoints/last.json"):
        _train(
            client,
            [demos],
            BucketUrl.parse("hf://buckets/lab/train-fleet/models/r4"),
            2,
            init_from="hf://buckets/lab/train-fleet/models/never",
        )


def test_lerobots_train_config_is_kept_only_where_lerobot_would_draw_the_same_frames(bucket_server, demos, fleet):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    for dataset, kept in ((demos, True), (fleet, False)):  # lerobot would train on the fleet's failures
        out = BucketUrl.parse(f"hf://buckets/lab/train-fleet/models/config-{dataset.name}")
        report = _train(client, [dataset], out, steps=1)
        model = client.ls(BucketUrl.parse(report.checkpoints[-1]) / "pretrained_model")
        assert ("train_config.json" in {e.url.name for e in model}) == kept, dataset


def test_policy_frames_that_led_to_a_takeover_weigh_as_failed_even_when_the_expert_then_succeeded():
    """A takeover episode the expert saved: the policy's frames before it are its failure (weight 0 by default),
    its frames after a hand-back that reached success on their own are successful ones; from the totals alone (before
    decoding) the episode's policy frames count as failed."""
    from types import SimpleNamespace

    # policy 0-2, expert 3-5 (stalled, taken over), handed back 6-9, success at 9
    intervention = np.isin(np.arange(10), [3, 4, 5])
    success = np.arange(10) == 9
    assert autonomous_outcome(intervention, success).tolist() == [False] * 6 + [True] * 4
    # the run-out-of-ticks takeover of the rounds' fleet: policy 0-5, then the expert to success at 9
    at_end = np.arange(10) >= 6
    assert not autonomous_outcome(at_end, success).any()
    # an untouched success: every frame; a failure: none
    assert autonomous_outcome(np.zeros(10, bool), success).all()
    assert not autonomous_outcome(np.zeros(10, bool), np.zeros(10, bool)).any()

    w = Weighting(FrameWeights())
    ref = SimpleNamespace(role="fleet", dataset="hf://buckets/lab/fleet/datasets/saved")
    weights = w.frames(ref, {INTERVENTION: torch.from_numpy(intervention), SUCCESS: torch.from_numpy(success)})
    assert weights.tolist() == [0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    assert FrameWeights().episode_weight("fleet", True, expert_frames=3, length=10) == 6.0  # a lower bound
    assert FrameWeights().episode_weight("fleet", True, expert_frames=0, length=10) == 10.0
