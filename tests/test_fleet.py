"""Fleet recording (issue 29): what a robot does goes into a fleet dataset lerobot reads, as `RecordChoice` says, and
the control thread never waits on it. A real bucket server, lerobot's own writer and reader; frames are synthetic
(tiny images) so that what each frame holds is known."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from robotloop.fleet import EpisodeFacts, FleetRecorder, RecordChoice, RecordingStats
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


@dataclass
class Recorded:
    client: BucketClient
    url: BucketUrl
    stats: RecordingStats


@pytest.fixture(scope="module")
def failures(bucket_server, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """A fleet dataset FleetRecorder wrote once, in `failures` mode, for the tests that read it: a success (not
    kept), a takeover that still failed (8 frames, the expert on 3 to 5), an autonomous failure (5 frames)."""
    base = tmp_path_factory.mktemp("fleet-failures")
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/failures")
    with pytest.MonkeyPatch.context() as patch:  # the writer process's caches: this module's, not the user's
        patch.setenv("HF_HOME", str(base / "hf-home"))
        patch.setenv("XDG_CACHE_HOME", str(base / "cache"))
        fleet = FleetRecorder(client, url, RecordChoice("failures"), queue_frames=100, staging=base / "staging")
        _episode(fleet, seed=1, frames=6, success=True)  # a success: not kept
        _episode(fleet, seed=2, frames=8, success=False, expert=range(3, 6))  # a takeover that still failed
        _episode(fleet, seed=3, frames=5, success=False)
        fleet.close()
    return Recorded(client, url, fleet.stats)


def test_a_robot_records_its_failures_with_their_facts_and_intervention_flags(failures, tmp_path):
    client, url = failures.client, failures.url
    assert (failures.stats.recorded, failures.stats.not_kept, failures.stats.dropped) == (2, 1, 0)

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
    assert fleet.wait_ready(60)  # its writer started and imported lerobot's writer before any episode came
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
    for bad in ({"queue_frames": 0}, {"frame_batch": 0}):  # refused before a writer process starts
        with pytest.raises(ValueError, match="at least 1 frame, in groups of at least 1"):
            FleetRecorder(client, url, RecordChoice("all"), **bad)
    with pytest.raises(ValueError, match="room for 101 frames cannot be waited for in a queue of 100"):
        FleetRecorder(client, url, RecordChoice("all"), queue_frames=100, reserve_frames=101)


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

    # The same through a capture service that cannot be reached (a slim robot's way of recording).
    fleet = FleetRecorder(client, url, RecordChoice("all"), via=("http://127.0.0.1:9", "rl_robot"))
    _episode(fleet, seed=4, frames=3, success=False)
    fleet.close()
    assert fleet.stats.dropped == 1 and "cannot reach the capture service" in fleet.stats.last_error


def test_a_give_up_costs_that_episode_only_not_the_whole_ones_queued_before_it(bucket_server, tmp_path):
    """The writer is still importing (seconds) when a whole short episode and the start of a long one fill the
    queue: the long one is given up, the short one before it is still committed, and every episode is counted once.
    (The writer used to skip every episode up to the last given up: 9 of a round's 60 fleet episodes, uncounted.)"""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/given-up")
    fleet = FleetRecorder(client, url, RecordChoice("all"), queue_frames=40)  # 4 items of up to 10 ticks
    _episode(fleet, seed=1, frames=5, success=False)  # 3 items: begin, its 5 ticks, end
    _episode(fleet, seed=2, frames=200, success=False)  # its begin fits, its first 10 ticks do not
    fleet.close()
    stats = fleet.stats
    assert (stats.recorded, stats.dropped, stats.unfinished) == (1, 1, 0), stats.as_dict()
    assert stats.settled == 2 and "queue was full" in stats.last_error
    dataset = _read(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 1 and len(dataset) == 5


def test_a_robot_with_time_between_episodes_waits_there_for_room_and_drops_none(bucket_server, tmp_path):
    """The loop's sim robots (`reserve_frames`): the first episode fills the queue while the writer is still importing;
    without the wait the second's begin would find no room and be dropped."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/reserve")
    fleet = FleetRecorder(client, url, RecordChoice("all"), queue_frames=40, reserve_frames=15)
    _episode(fleet, seed=1, frames=15, success=False)  # begin, 2 groups of ticks, end: the queue's 4 items
    _episode(fleet, seed=2, frames=15, success=True)
    fleet.close()
    assert (fleet.stats.recorded, fleet.stats.dropped) == (2, 0), fleet.stats.as_dict()


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


STREAM = textwrap.dedent(
    """
    import json, sys
    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset
    ds = StreamingLeRobotDataset(sys.argv[1], repo_type="bucket", shuffle=False)
    for item in ds:
        print(json.dumps({
            "episode": int(item["episode_index"]), "t": int(item["frame_index"]),
            "intervention": bool(item["intervention"]), "policy": float(item["policy_action"][0]),
            "action": float(item["action"][0]), "pixel": float(item["observation.images.top"].mean()),
        }))
    """
)


def test_lerobot_streams_a_fleet_dataset_with_its_intervention_and_policy_action_columns(
    bucket_server, failures, tmp_path
):
    """lerobot's own StreamingLeRobotDataset(repo_type="bucket") reads the dataset FleetRecorder committed (h264, as
    robots record), in its own process as a user's would: each frame's intervention flag and policy action as the
    control loop gave them, and its image at the frame's time."""
    env = {
        **os.environ,
        "HF_ENDPOINT": bucket_server.endpoint,
        "HF_TOKEN": WRITE_TOKEN,
        "HF_LEROBOT_HOME": str(tmp_path / "lerobot"),
    }
    repo = failures.url.bucket_id + "/" + failures.url.path
    read = subprocess.run([sys.executable, "-c", STREAM, repo], env=env, capture_output=True, text=True, timeout=240)
    assert read.returncode == 0, read.stderr[-4000:]
    frames = {(f["episode"], f["t"]): f for f in map(json.loads, read.stdout.splitlines())}
    assert sorted(frames) == [(0, t) for t in range(8)] + [(1, t) for t in range(5)]
    for (episode, t), frame in frames.items():
        expert = episode == 0 and 3 <= t < 6
        seed = 2 if episode == 0 else 3
        assert frame["intervention"] == expert
        assert frame["action"] == pytest.approx(seed + t / 100)
        assert frame["policy"] == pytest.approx(0.0 if expert else seed + t / 100)  # the expert drove: no policy
        assert frame["pixel"] == pytest.approx(10 * t / 255, abs=0.03)  # the frame of its own time, decoded


ROBOT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import numpy as np
    from robotloop.fleet import EpisodeFacts, FleetRecorder, RecordChoice
    from robotloop.storage import BucketClient, BucketUrl

    endpoint, token, url, staging, whole = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
    fleet = FleetRecorder(BucketClient(endpoint, token), BucketUrl.parse(url), RecordChoice("all"), staging=staging)
    print("writer", fleet._process.pid, flush=True)

    def tick(t):
        obs = {"pixels": {"top": np.full((24, 32, 3), 10 * t % 255, np.uint8)}, "agent_pos": np.full(14, t, float)}
        fleet.frame(obs, np.full(14, t, np.float32), np.full(14, t, np.float32), False, 0.0, False)

    for seed in range(whole):
        fleet.begin(EpisodeFacts("r1", "v7", "transfer the cube", seed))
        for t in range(6):
            tick(t)
        fleet.end()
    fleet.begin(EpisodeFacts("r1", "v7", "transfer the cube", whole))  # the one it is killed in
    t, said = 0, False
    while True:  # a control loop at 50 Hz, until it is killed
        tick(t)
        t += 1
        time.sleep(0.02)
        # Once every whole episode is committed and the writer streams this one (its files are in staging):
        if not said and fleet.stats.recorded == whole and any(staging.glob("episode-*/dataset")):
            print("mid-episode", flush=True)
            said = True
    """
)


def _children(pid: int) -> list[int]:
    """The processes `pid` started and that still run (its writer, multiprocessing's resource tracker)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has died (a container's init may never reap it)


def _line(proc: subprocess.Popen, want: str, timeout_s: float) -> str:
    """The first line of `proc`'s stdout that starts with `want`, read within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            if line.startswith(want):
                return line
            assert line, f"the robot exited ({proc.poll()}) before saying {want!r}"
    raise AssertionError(f"the robot did not say {want!r} within {timeout_s} s")


def test_a_robot_killed_mid_episode_loses_that_episode_only_and_its_writer_dies_with_it(bucket_server, tmp_path):
    """A real process records with FleetRecorder (a stand-in for `robotloop robot run --record all`, whose sim and
    policy would cost a minute here: the recorder is the same) and is SIGKILLed while it streams its third
    episode. The two committed episodes are all lerobot's LeRobotDataset reads, nothing of the third is visible,
    and the writer process does not outlive the robot."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/killed")
    staging = tmp_path / "staging"
    args = [bucket_server.endpoint, WRITE_TOKEN, str(url), str(staging), "2"]
    robot = subprocess.Popen([sys.executable, "-c", ROBOT, *args], stdout=subprocess.PIPE, text=True)
    try:
        writer = int(_line(robot, "writer", 60).split()[1])
        _line(robot, "mid-episode", 120)
        started = _children(robot.pid)
        assert writer in started
        robot.send_signal(signal.SIGKILL)
        assert robot.wait(10) == -signal.SIGKILL
    finally:
        robot.kill()
        robot.wait()
    deadline = time.monotonic() + 10
    while any(map(_running, started)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in started if _running(pid)], "a process the robot started outlived it"

    dataset = _read(client, url, tmp_path / "read")
    facts = (tmp_path / "read" / "meta" / "fleet_episodes.jsonl").read_text().splitlines()
    assert dataset.meta.total_episodes == len(facts) == 2
    assert [json.loads(line)["seed"] for line in facts] == [0, 1]
    assert len(dataset) == dataset.hf_dataset.num_rows == 12  # no rows of the killed episode in the data files
    assert [int(dataset[i]["episode_index"]) for i in (0, 6, 11)] == [0, 1, 1]


WRITER_DIES = textwrap.dedent(
    """
    import json, multiprocessing, sys, time
    import numpy as np
    from robotloop.fleet import EpisodeFacts, FleetRecorder, RecordChoice
    from robotloop.storage import BucketClient, BucketUrl

    endpoint, token, url = sys.argv[1], sys.argv[2], sys.argv[3]
    fleet = FleetRecorder(BucketClient(endpoint, token), BucketUrl.parse(url), RecordChoice("all"))

    def ticks(frames):
        for t in range(frames):
            obs = {"pixels": {"top": np.full((24, 32, 3), t % 255, np.uint8)}, "agent_pos": np.full(14, t, float)}
            fleet.frame(obs, np.full(14, t, np.float32), None, False, 0.0, False)

    def episode(seed, frames):
        fleet.begin(EpisodeFacts("r1", "v7", "transfer the cube", seed))
        ticks(frames)
        fleet.end()

    episode(0, 6)
    while fleet.stats.recorded < 1:
        time.sleep(0.05)
    fleet.begin(EpisodeFacts("r1", "v7", "transfer the cube", 1))
    ticks(6)
    (writer,) = [p for p in multiprocessing.active_children() if p.name == "robotloop-fleet-writer"]
    writer.kill()  # mid-episode, as a crash in its encoder would end it
    writer.join()
    ticks(200)  # into the dead writer's queue: more than its pipe holds, so its feeder thread is stuck
    fleet.end()
    episode(2, 6)  # begins with a new writer
    fleet.close()
    print(json.dumps(fleet.stats.as_dict()), flush=True)
    """
)


def test_a_writer_that_dies_costs_its_episodes_counted_with_why_and_the_next_episode_gets_a_new_one(
    bucket_server, tmp_path
):
    """The GPU run of 2026-12-06 16:06 lost 3 of a robot's 6 episodes without a count, and that robot's exit hung
    until the fleet's driver killed it: what a dead writer process does. Now the episodes a dead writer held are
    dropped and counted with its exit code, the next episode starts a new writer, and the robot exits at once."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/writer-dies")
    args = [bucket_server.endpoint, WRITE_TOKEN, str(url)]
    robot = subprocess.run([sys.executable, "-c", WRITER_DIES, *args], capture_output=True, text=True, timeout=90)
    assert robot.returncode == 0, robot.stderr[-2000:]
    stats = json.loads(robot.stdout.splitlines()[-1])
    assert (stats["recorded"], stats["dropped"], stats["unfinished"]) == (2, 1, 0)
    assert "writer process died (exit code -9): 1 episode it held never committed" in stats["last_error"]
    facts = (_read(client, url, tmp_path / "read").root / "meta" / "fleet_episodes.jsonl").read_text().splitlines()
    assert [json.loads(line)["seed"] for line in facts] == [0, 2]


@pytest.fixture
def tiny_disk(tmp_path) -> Iterator[Path]:
    """A 1 MB tmpfs (mounting one needs root; skipped where it cannot be mounted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def _fill(disk: Path, leave: int = 0) -> Path:
    """Fill `disk` with a ballast file until the kernel says ENOSPC, then free `leave` bytes of it."""
    ballast = disk / "ballast"
    with ballast.open("wb", buffering=0) as f, pytest.raises(OSError, match="No space left"):
        while True:
            f.write(bytes(4096))
    os.truncate(ballast, ballast.stat().st_size - leave)
    return ballast


def test_a_full_disk_drops_the_episode_with_its_reason_and_recording_resumes_once_space_returns(
    bucket_server, tiny_disk, tmp_path
):
    """The writer's staging folder is on a real tmpfs filled by a ballast file (the kernel's own ENOSPC, not a
    stand-in), with one page left: lerobot's writer starts the episode, then its video encoder thread cannot write
    the mp4. The control loop keeps ticking and never waits nor sees an error; the episode is dropped and counted
    with the disk's reason and nothing of it stays in staging; once the ballast is deleted the next episode is
    recorded by the same writer."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/full-disk")
    staging = tiny_disk / "staging"
    fleet = FleetRecorder(client, url, RecordChoice("all"), queue_frames=2000, staging=staging)  # 40 s at 50 Hz
    ballast = _fill(tiny_disk, leave=4096)
    fleet.begin(EpisodeFacts("r1", "v7", TASK, 1))
    slowest, t, deadline = 0.0, 0, time.monotonic() + 60
    while fleet.stats.dropped == 0 and time.monotonic() < deadline:  # a robot's loop goes on while the disk is full
        t0 = time.perf_counter()
        fleet.frame(_obs(t), np.zeros(14, np.float32), None, False, 0.0, False)
        slowest, t = max(slowest, time.perf_counter() - t0), t + 1
        time.sleep(0.02)
    fleet.end()
    assert slowest < 0.05  # the control loop never waited for the writer
    assert fleet.stats.dropped == 1, fleet.stats.as_dict()
    assert "No space left on device" in fleet.stats.last_error

    ballast.unlink()  # space is back
    _episode(fleet, seed=2, frames=4, success=False)
    fleet.close()
    assert (fleet.stats.recorded, fleet.stats.dropped) == (1, 1), fleet.stats.as_dict()
    assert not list(staging.glob("episode-*"))  # nothing of the dropped episode stays on the full disk
    dataset = _read(client, url, tmp_path / "read")  # the dataset holds the later episode only
    facts = (tmp_path / "read" / "meta" / "fleet_episodes.jsonl").read_text().splitlines()
    assert dataset.meta.total_episodes == 1 and [json.loads(line)["seed"] for line in facts] == [2]


def test_a_sim_cameras_rendering_goes_into_the_fleet_datasets_features(bucket_server, tmp_path, monkeypatch):
    """A sim robot filming with other shadow maps than gym-aloha's says so in its fleet dataset (as demos do), so
    training refuses to mix it with data rendered otherwise; it is the camera's, not an episode fact."""
    from robotloop.capture.recorder import EPISODE_FACTS_FILE, camera_shadow_map

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/fleet/datasets/rendered")
    fleet = FleetRecorder(client, url, RecordChoice("all"), queue_frames=100, staging=tmp_path / "staging")
    fleet.begin(EpisodeFacts("r1", "v7", TASK, 1), shadow_map=2048)
    for t in range(4):
        fleet.frame(_obs(t), np.zeros(14, np.float32), np.zeros(14, np.float32), False, 1.0, False)
    fleet.end()
    fleet.close()
    assert fleet.stats.recorded == 1, fleet.stats.as_dict()
    info = json.loads(client.download(url / "meta" / "info.json", tmp_path / "info.json").read_text())
    assert camera_shadow_map(info["features"]["observation.images.top"]) == 2048
    (line,) = client.download(url / EPISODE_FACTS_FILE, tmp_path / "facts.jsonl").read_text().splitlines()
    assert "shadow_map" not in json.loads(line)
