"""Fleet recording (issue 29): what a robot does goes into a fleet dataset lerobot reads, as `RecordChoice` says, and
the control thread never waits on it. A real bucket server, lerobot's own writer and reader; frames are synthetic
(tiny images) so that what each frame holds is known."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from robotloop.fleet import EpisodeFacts, FleetRecorder, RecordChoice
from robotloop.storage import BucketClient, BucketUrl

from .conftest import WRITE_TOKEN

TASK = "Pick up the cube with the right arm and transfer it to the left arm."


def _obs(t: int) -> dict:
    return {"pixels": {"top": np.full((24, 32, 3), (10 * t) % 255, np.uint8)}, "agent_pos": np.full(14, t, np.float64)}


def _episode(fleet: FleetRecorder, seed: int, frames: int, success: bool, expert: range = range(0)) -> None:
    """One episode as a robot's control loop reports it: policy frames, expert frames where `expert` says."""
    fleet.begin(EpisodeFacts("r1", "v7", TASK, seed))
    for t in range(frames):
        action = np.full(14, seed + t / 100, np.float32)
        policy = action if t not in expert else np.zeros(14, np.float32)
        done = success and t == frames - 1
        fleet.frame(_obs(t), action, policy, t in expert, 4.0 if done else 1.0, done)
    fleet.end()


def _read(client: BucketClient, url: BucketUrl, dest):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    client.fetch(url, dest)
    return LeRobotDataset(url.bucket_id, root=dest)


def test_a_robot_records_its_failures_with_their_facts_and_intervention_flags(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/failures")
    fleet = FleetRecorder(client, url, RecordChoice("failures"), queue_frames=100)
    _episode(fleet, seed=1, frames=6, success=True)  # a success: not kept
    _episode(fleet, seed=2, frames=8, success=False, expert=range(3, 6))  # a takeover that still failed
    _episode(fleet, seed=3, frames=5, success=False)
    fleet.close()
    assert (fleet.stats.recorded, fleet.stats.not_kept, fleet.stats.dropped) == (2, 1, 0)

    dataset = _read(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 2 and len(dataset) == 13
    assert dataset.features["intervention"]["dtype"] == "bool" and tuple(
        dataset.features["policy_action"]["shape"]
    ) == (14,)
    flags = [bool(dataset[i]["intervention"]) for i in range(8)]
    assert flags == [False, False, False, True, True, True, False, False]
    assert dataset[3]["policy_action"].abs().sum() == 0 and dataset[0]["policy_action"].tolist() == pytest.approx(
        dataset[0]["action"].tolist()
    )
    assert not any(bool(dataset[i]["next.success"]) for i in range(len(dataset)))
    facts = [
        json.loads(line) for line in (tmp_path / "read" / "meta" / "fleet_episodes.jsonl").read_text().splitlines()
    ]
    assert [(f["episode_index"], f["seed"], f["kind"], f["expert_frames"]) for f in facts] == [
        (0, 2, "takeover", 3),
        (1, 3, "autonomous", 0),
    ]
    assert {(f["robot_id"], f["release"], f["success"], f["max_reward"]) for f in facts} == {("r1", "v7", False, 1.0)}


def test_all_keeps_successes_and_a_sample_share_skips_episodes_before_they_stream(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/all")
    fleet = FleetRecorder(client, url, RecordChoice("all", sample=0.5), seed=3)
    for seed in range(8):
        _episode(fleet, seed, frames=3, success=seed % 2 == 0)
    fleet.close()
    stats = fleet.stats
    assert stats.recorded + stats.not_sampled == 8 and 0 < stats.not_sampled < 8 and stats.not_kept == 0
    dataset = _read(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == stats.recorded
    assert any(bool(dataset[i]["next.success"]) for i in range(len(dataset)))  # successes kept with "all"
    with pytest.raises(ValueError, match="off, failures or all"):
        RecordChoice("some")


def test_a_full_queue_drops_the_episode_never_a_tick_and_an_unreachable_bucket_drops_and_goes_on(
    bucket_server, tmp_path
):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/full")
    fleet = FleetRecorder(client, url, RecordChoice("all"), queue_frames=4)
    t0 = time.perf_counter()
    _episode(fleet, seed=1, frames=200, success=False)  # far more frames than the queue holds, at once
    assert time.perf_counter() - t0 < 1.0  # the control thread never waited for the writer
    fleet.close()
    assert fleet.stats.dropped == 1 and fleet.stats.recorded == 0 and "queue was full" in fleet.stats.last_error

    # A bucket that cannot be reached: the episode is dropped and counted, the control loop does not see it.
    unreachable = BucketClient("http://127.0.0.1:9", WRITE_TOKEN)
    fleet = FleetRecorder(unreachable, url, RecordChoice("all"))
    _episode(fleet, seed=2, frames=3, success=False)
    _episode(fleet, seed=3, frames=3, success=False)
    fleet.close()
    assert fleet.stats.dropped == 2 and fleet.stats.recorded == 0


def test_an_episode_whose_end_never_came_is_dropped_and_nothing_half_is_committed(bucket_server, tmp_path):
    """A robot stopped mid-episode (or one that began the next without ending this one) commits nothing of it."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/unended")
    fleet = FleetRecorder(client, url, RecordChoice("all"))
    fleet.begin(EpisodeFacts("r1", "v7", TASK, 1))
    for t in range(3):
        fleet.frame(_obs(t), np.zeros(14, np.float32), None, False, 0.0, False)
    _episode(fleet, seed=2, frames=3, success=False)  # the next episode began: the first one is dropped
    fleet.begin(EpisodeFacts("r1", "v7", TASK, 3))
    fleet.frame(_obs(0), np.zeros(14, np.float32), None, False, 0.0, False)
    fleet.close()  # stopped mid-episode
    assert (fleet.stats.recorded, fleet.stats.unfinished, fleet.stats.dropped) == (1, 2, 0)
    dataset = _read(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 1 and len(dataset) == 3
