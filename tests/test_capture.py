"""Recording into a bucket: every commit is a complete dataset lerobot reads; kill -9 loses at most one episode."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from robotloop.capture import BadEpisode, DatasetRecorder, DatasetSpec, Episode
from robotloop.capture.recorder import episode_frame
from robotloop.storage import BucketClient, BucketUrl, StorageError

from .conftest import WRITE_TOKEN

SPEC = DatasetSpec({"top": (24, 32, 3)}, state_dim=14, action_dim=14, fps=50, vcodec="h264")


def synthetic_episode(k: int, frames: int = 12) -> Episode:
    images = np.stack([np.full((24, 32, 3), (20 * t) % 255, np.uint8) for t in range(frames)])
    state = np.tile(np.arange(frames, dtype=np.float32)[:, None], (1, 14))
    action = np.full((frames, 14), k, np.float32)
    reward = np.linspace(0, 4, frames, dtype=np.float32)
    return Episode({"top": images}, state, action, "transfer the cube", reward, reward >= 4)


def load_with_lerobot(client: BucketClient, url: BucketUrl, dest):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    client.fetch(url, dest)
    return LeRobotDataset(url.bucket_id, root=dest)


def test_each_commit_is_a_complete_lerobot_dataset(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/synthetic")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    for k in range(2):
        report = recorder.commit(synthetic_episode(k))
        assert report.episode_index == k and report.frames == 12
        dataset = load_with_lerobot(client, url, tmp_path / f"read-{k}")  # readable right after each commit
        assert dataset.meta.total_episodes == k + 1 and len(dataset) == 12 * (k + 1)
    last = dataset[12]  # first frame of episode 1
    assert last["episode_index"].item() == 1
    assert last["action"].tolist() == [1.0] * 14
    assert last["observation.images.top"].shape == (3, 24, 32)
    assert bool(dataset[23]["next.success"]) and not bool(dataset[12]["next.success"])
    assert report.bytes_sent < 3 * report.episode_bytes + 60_000  # metadata rides along; payload is the episode
    local = sorted(
        p.relative_to(tmp_path / "stage" / "dataset").as_posix()
        for p in (tmp_path / "stage" / "dataset").rglob("*")
        if p.is_file()
    )
    # episodes are packed into the growing files as lerobot packs them; locally only those and meta/ stay
    assert [p for p in local if not p.startswith("meta/")] == [
        "data/chunk-000/file-000.parquet",
        "videos/observation.images.top/chunk-000/file-000.mp4",
    ]

    # A recorder starting from nothing (another machine, or after a crash) continues the numbering.
    fresh = DatasetRecorder(client, url, SPEC, staging=tmp_path / "fresh-stage")
    assert fresh.committed_episodes() == 2
    assert fresh.commit(synthetic_episode(2)).episode_index == 2


def test_a_commit_by_another_recorder_meanwhile_is_not_overwritten(bucket_server, tmp_path, monkeypatch):
    # Two recorders that share no lock (two machines): the other commits while this one is about to upload.
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/two-writers")
    ours = DatasetRecorder(client, url, SPEC, staging=tmp_path / "ours")
    other = DatasetRecorder(client, url, SPEC, staging=tmp_path / "other")
    ours.commit(synthetic_episode(0))
    check, interrupted = ours._check_not_committed_meanwhile, []

    def other_commits_first() -> None:
        if not interrupted:
            interrupted.append(other.commit(synthetic_episode(7)))
        check()

    monkeypatch.setattr(ours, "_check_not_committed_meanwhile", other_commits_first)
    report = ours.commit(synthetic_episode(1))  # noticed, synced again, appended after the other's episode
    assert interrupted[0].episode_index == 1 and report.episode_index == 2
    dataset = load_with_lerobot(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 3 and len(dataset) == 36
    assert [dataset[12 * i]["action"][0].item() for i in range(3)] == [0.0, 7.0, 1.0]  # nobody's episode lost


def test_a_failed_append_does_not_leave_a_local_copy_the_next_commit_trusts(bucket_server, tmp_path, monkeypatch):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/failed-upload")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    recorder.commit(synthetic_episode(0))
    real_push = recorder._push
    monkeypatch.setattr(recorder, "_push", lambda changed: (_ for _ in ()).throw(StorageError("connection reset")))
    with pytest.raises(StorageError, match="connection reset"):
        recorder.commit(synthetic_episode(1))  # appended locally, never uploaded
    monkeypatch.setattr(recorder, "_push", real_push)
    assert recorder.commit(synthetic_episode(2)).episode_index == 1
    dataset = load_with_lerobot(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 2 and len(dataset) == 24
    assert dataset[12]["action"][0].item() == 2.0 and dataset[12]["observation.images.top"].shape == (3, 24, 32)


KILLED_COMMIT = (
    "import os, sys\n"
    "from pathlib import Path\n"
    "from robotloop.capture import DatasetRecorder\n"
    "from robotloop.storage import BucketClient, BucketUrl\n"
    "from tests.test_capture import SPEC, synthetic_episode\n"
    "endpoint, token, url, stage = sys.argv[1:]\n"
    "recorder = DatasetRecorder(BucketClient(endpoint, token), BucketUrl.parse(url), SPEC, staging=Path(stage))\n"
    "{kill}\n"
    "recorder.commit(synthetic_episode(1))\n"
)


def _commit_killed_then_next(bucket_server, tmp_path, name: str, kill: str) -> None:
    """Commit episode 0, then episode 1 in a process that `kill` (code run on its `recorder`) ends with exit 9 as
    SIGKILL would (no except, no finally), then episode 2 from the same staging folder: lerobot must read episodes
    0 and 2 as the dataset's two, nothing of episode 1."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse(f"hf://buckets/lab/capture/datasets/{name}")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    recorder.commit(synthetic_episode(0))
    args = [bucket_server.endpoint, WRITE_TOKEN, str(url), str(tmp_path / "stage")]
    code = KILLED_COMMIT.format(kill=kill)
    died = subprocess.run([sys.executable, "-c", code, *args], cwd=Path(__file__).parents[1], capture_output=True)
    assert died.returncode == 9, died.stderr.decode()[-2000:]
    assert recorder.commit(synthetic_episode(2)).episode_index == 1
    dataset = load_with_lerobot(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 2 and len(dataset) == 24
    assert [dataset[i]["action"][0].item() for i in (0, 12)] == [0.0, 2.0]


def test_a_commit_killed_after_its_local_append_is_not_pushed_by_the_next(bucket_server, tmp_path):
    """A recorder killed between appending an episode to its local copy and uploading it (a Ray worker killed
    mid-commit, shares its node's staging with the next): the next commit starts from the bucket's copy, so the
    dead commit's episode never appears, whole or half."""
    _commit_killed_then_next(bucket_server, tmp_path, "killed-commit", "recorder._push = lambda changed: os._exit(9)")


def test_a_commit_killed_between_data_and_metadata_uploads_is_pointed_back_by_the_next(bucket_server, tmp_path):
    """Killed after its grown data and video files went up, before meta/: the next commit from that staging folder
    points them back before it appends, so the rows no metadata named are not kept."""
    kill = (
        "upload, calls = recorder.client.upload, []\n"
        "def data_only(local, dest):  # the first upload of a commit is its data and video files; meta/ is next\n"
        "    if calls:\n"
        "        os._exit(9)\n"
        "    calls.append(dest)\n"
        "    return upload(local, dest)\n"
        "recorder.client.upload = data_only"
    )
    _commit_killed_then_next(bucket_server, tmp_path, "killed-upload", kill)


def test_a_failed_metadata_upload_points_the_grown_files_back(bucket_server, tmp_path, monkeypatch):
    # Data files go up first, then meta/: when meta/ fails, the grown files must not stay (a fresh recorder would
    # append after rows its metadata does not know).
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/meta-fails")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    recorder.commit(synthetic_episode(0))
    before = {e.url.path: e.xet_hash for e in client.ls(url, recursive=True) if "/meta/" not in e.url.path}
    upload = client.upload

    def meta_fails(local, target):
        if target.path.endswith("/meta"):
            raise StorageError("connection reset during meta/")
        return upload(local, target)

    monkeypatch.setattr(client, "upload", meta_fails)
    with pytest.raises(StorageError, match="during meta/"):
        recorder.commit(synthetic_episode(1))
    monkeypatch.setattr(client, "upload", upload)
    after = {e.url.path: e.xet_hash for e in client.ls(url, recursive=True) if "/meta/" not in e.url.path}
    assert after == before  # the data and video files hold episode 0 only, as their metadata says
    fresh = DatasetRecorder(client, url, SPEC, staging=tmp_path / "fresh")  # another machine
    assert fresh.commit(synthetic_episode(2)).episode_index == 1
    dataset = load_with_lerobot(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 2 and len(dataset) == 24 and dataset[12]["action"][0].item() == 2.0


def test_stats_json_describes_the_appended_dataset(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/stats")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    for k in range(3):
        episode = synthetic_episode(k)
        episode.task = "transfer the cube" if k != 1 else "stack the cube"
        recorder.commit(episode)
    dataset = load_with_lerobot(client, url, tmp_path / "read")
    stats = dataset.meta.stats
    for column, values in (
        ("index", range(36)),
        ("episode_index", [0] * 12 + [1] * 12 + [2] * 12),
        ("task_index", [0] * 12 + [1] * 12 + [0] * 12),
    ):
        assert (float(stats[column]["min"][0]), float(stats[column]["max"][0])) == (min(values), max(values)), column
        assert abs(float(stats[column]["mean"][0]) - np.mean(values)) < 1e-6, column
    assert float(stats["action"]["max"][0]) == 2.0 and float(stats["action"]["min"][0]) == 0.0


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda e: setattr(e, "state", e.state[:, :7]), "state has shape"),
        (lambda e: setattr(e, "action", np.where(np.eye(12, 14, dtype=bool), np.nan, e.action)), "NaN"),
        (lambda e: setattr(e, "images", {"top": e.images["top"].astype(np.float32)}), "dtype"),
        (lambda e: setattr(e, "images", {"wrist": e.images["top"]}), "cameras"),
    ],
)
def test_bad_episodes_are_refused_and_nothing_is_uploaded(bucket_server, tmp_path, breakage, message):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse(f"hf://buckets/lab/capture-bad/datasets/{message.split()[0].lower()}")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    episode = synthetic_episode(0)
    breakage(episode)
    with pytest.raises(BadEpisode, match=message):
        recorder.commit(episode)
    assert client.ls(url) == []


def test_a_dataset_with_other_features_is_not_appended_to(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/mismatch")
    DatasetRecorder(client, url, SPEC, staging=tmp_path / "a").commit(synthetic_episode(0))
    other = DatasetSpec({"top": (48, 64, 3)}, 14, 14, vcodec="h264")
    with pytest.raises(BadEpisode, match="another dataset URL"):
        big = Episode(
            {"top": np.zeros((12, 48, 64, 3), np.uint8)},
            np.zeros((12, 14), np.float32),
            np.zeros((12, 14), np.float32),
            "x",
        )
        DatasetRecorder(client, url, other, staging=tmp_path / "b").commit(big)


def test_commits_go_on_into_the_new_files_lerobot_starts_past_its_size_limits(bucket_server, tmp_path):
    """lerobot starts new data and video files once the current ones pass `data_files_size_in_mb` and
    `video_files_size_in_mb` (a robot recording all day gets there): the next commits grow the new files, the
    recorder finds them (`growing_files`, read with pyarrow) where lerobot's own metadata says, and lerobot reads
    every episode across the files."""
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    from robotloop.capture.append import growing_files

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/rotating")
    DatasetRecorder(client, url, SPEC, staging=tmp_path / "a").commit(synthetic_episode(0))
    info_file = client.download(url / "meta" / "info.json", tmp_path / "info.json")
    info = json.loads(info_file.read_text())
    info["data_files_size_in_mb"] = info["video_files_size_in_mb"] = 1e-4  # past it after one episode
    info_file.write_text(json.dumps(info))
    client.upload(info_file, url / "meta" / "info.json")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "b")
    for k in (1, 2):
        recorder.commit(synthetic_episode(k))
        meta = LeRobotDatasetMetadata(url.bucket_id, root=recorder.root)
        video = str(meta.get_video_file_path(k, "observation.images.top"))
        assert growing_files(recorder.root) == [str(meta.get_data_file_path(k)), video]
        assert video.endswith(f"file-{k:03d}.mp4"), video  # a new file for each episode past the limit
    dataset = load_with_lerobot(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 3 and len(dataset) == 36
    assert [dataset[12 * k]["action"].tolist() for k in range(3)] == [[float(k)] * 14 for k in range(3)]
    assert dataset[35]["observation.images.top"].shape == (3, 24, 32)


def _children(pid: int) -> set[int]:
    """Processes whose parent is `pid`, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _total_episodes(client: BucketClient, url: BucketUrl) -> int:
    try:
        return json.loads(client.read_range(url / "meta" / "info.json", 0, 1 << 20))["total_episodes"]
    except FileNotFoundError:
        return 0


@pytest.mark.timeout(400)
def test_sigkill_of_the_recorder_loses_at_most_the_episode_in_flight(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture-kill/datasets/cube")
    env = {
        **os.environ,
        "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint,
        "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "COLUMNS": "300",
    }
    cmd = [
        sys.executable,
        "-m",
        "robotloop.cli",
        "record",
        "--to",
        str(url),
        "--sim",
        "transfer_cube",
        "--image-size",
        "24x32",
        "--max-steps",
        "25",
        "--keep-failed",
        "--codec",
        "h264",
        "--workers",
        "1",
    ]
    log = open(tmp_path / "recorder.log", "w")
    recorder = subprocess.Popen([*cmd, "--episodes", "50"], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while _total_episodes(client, url) < 2 and time.monotonic() < deadline:
        assert recorder.poll() is None, (tmp_path / "recorder.log").read_text()[-3000:]
        time.sleep(0.2)
    time.sleep(0.3)  # somewhere inside the next episode: sim, encode or upload
    workers = _children(recorder.pid)
    assert workers, "the recorder runs its sim in worker processes"
    recorder.send_signal(signal.SIGKILL)
    recorder.wait()
    deadline = time.monotonic() + 20  # its workers die with it (they would idle on their queues for hours)
    while (alive := [pid for pid in workers if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"worker processes {alive} outlived the killed recorder"

    committed = _total_episodes(client, url)
    assert committed >= 2
    dataset = load_with_lerobot(client, url, tmp_path / "after-kill")
    assert dataset.meta.total_episodes == committed and len(dataset) == 25 * committed
    assert dataset[len(dataset) - 1]["observation.images.top"].shape == (3, 24, 32)  # last episode's video is whole

    again = subprocess.run([*cmd, "--episodes", "1"], env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"({committed} were there)" in again.stdout
    noise = ("Cannot enable progress bars", "moov atom", "Validate all meta data", "Svt[info]")  # libraries' own
    assert not [n for n in noise if n in again.stdout + again.stderr], again.stderr[-2000:]
    assert _total_episodes(client, url) == committed + 1

    # Refused before any demo runs: another image size than the dataset's, a codec lerobot does not know.
    def refused(*args: str) -> str:
        run = subprocess.run([*cmd, "--episodes", "1", *args], env=env, capture_output=True, text=True, timeout=240)
        assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
        return " ".join((run.stdout + " stderr: " + run.stderr).split())  # stderr too: a failure then shows why

    assert "holds a dataset with features" in refused("--image-size", "48x64")
    assert "video codec 'nosuch'" in refused("--codec", "nosuch")
    assert "holds h264 video; these episodes would be av1" in refused("--codec", "libsvtav1")  # before, not after
    # Every scripted demo failing (25 steps cannot finish the task) is a failure, not a quiet success.
    short = [a for a in cmd if a != "--keep-failed"]
    run = subprocess.run([*short, "--episodes", "1"], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 1 and "committed 0 of 1 episodes" in " ".join(run.stdout.split()), run.stdout[-2000:]
    assert _total_episodes(client, url) == committed + 1


def test_a_live_episode_is_committed_or_dropped_whole(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/live")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    episode = synthetic_episode(0)
    live = recorder.begin(episode.task)
    live.add_frame(episode_frame(SPEC, episode, 0))
    with pytest.raises(BadEpisode, match="state has shape"):
        live.add_frame({**episode_frame(SPEC, episode, 1), "observation.state": np.zeros(3, np.float32)})
    live.abort()  # dropped: nothing reaches the bucket, and the lock is free again
    assert client.ls(url) == []
    live = recorder.begin(episode.task)
    for t in range(len(episode)):
        live.add_frame(episode_frame(SPEC, episode, t))
    report = live.commit()
    assert (report.episode_index, report.frames) == (0, 12)
    assert recorder.committed_episodes() == 1


def test_lerobot_streams_what_the_recorder_committed(bucket_server, tmp_path):
    import subprocess as sp
    import textwrap

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/streamed")
    # lerobot's default codec: lerobot's torchcodec path misreads the frame rate of very short h264 clips.
    spec = dataclasses.replace(SPEC, vcodec="libsvtav1")
    recorder = DatasetRecorder(client, url, spec, staging=tmp_path / "stage")
    for k in range(2):
        recorder.commit(synthetic_episode(k))
    reader = textwrap.dedent(
        """
        from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset
        ds = StreamingLeRobotDataset("lab/capture/datasets/streamed", repo_type="bucket", shuffle=False)
        items = list(ds)
        actions = sorted({float(i["action"][0]) for i in items})
        print(len(items), actions, tuple(items[0]["observation.images.top"].shape))
        """
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": bucket_server.endpoint,
        "HF_TOKEN": WRITE_TOKEN,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_LEROBOT_HOME": str(tmp_path / "lerobot"),
    }
    out = sp.run([sys.executable, "-c", reader], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "24 [0.0, 1.0] (3, 24, 32)"


def test_an_episode_whose_encoder_dropped_frames_is_refused(bucket_server, tmp_path):
    """lerobot's streaming encoder drops a frame when its queue stays full (a slow CPU: it happened recording
    480x640 on 15 workers). Such an episode's video is shorter than its data; it must never be committed."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/dropped")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    episode = synthetic_episode(0)
    live = recorder.begin(episode.task)
    for t in range(len(episode)):
        live.add_frame(episode_frame(SPEC, episode, t))
    # Simulated: the count lerobot keeps when `feed_frame` finds the queue full (a slow encoder is not
    # reproducible on demand).
    live.dataset.writer._streaming_encoder._dropped_frames["observation.images.top"] = 1
    with pytest.raises(BadEpisode, match="dropped 1 frame"):
        live.commit()
    assert client.ls(url) == [] and recorder.committed_episodes() == 0
    assert recorder.commit(episode).frames == 12  # whole episodes queue every frame: nothing to drop


def test_an_episode_encoded_elsewhere_is_committed_only_from_the_recorders_own_staging(bucket_server, tmp_path):
    from robotloop.capture.recorder import write_episode

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/written")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    foreign = write_episode(SPEC, url.bucket_id, tmp_path, synthetic_episode(0))  # not the recorder's staging
    with pytest.raises(BadEpisode, match="staging"):
        recorder.commit_written(foreign)
    assert client.ls(url) == []
    written = write_episode(SPEC, url.bucket_id, recorder.staging, synthetic_episode(1))  # what a sim worker does
    report = recorder.commit_written(written)
    assert report.episode_index == 0 and report.encode_s == written.encode_s > 0
    assert not Path(written.root).exists()  # staged files go once committed
    assert load_with_lerobot(client, url, tmp_path / "read").meta.total_episodes == 1


def test_sim_demos_stream_into_the_encoder_and_failed_ones_leave_nothing(bucket_server, tmp_path):
    """A sim worker's frames go to the encoder as the replay renders them: a commit is left with the encoder's
    tail only; a demo that fails (cut short at 30 steps, it never finishes) is dropped, files and all, unless
    asked to keep it."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from robotloop.capture.sim_record import record_sim

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/demos/datasets/streamed")
    recorder = DatasetRecorder(client, url, SPEC, staging=tmp_path / "stage")
    cut = record_sim(recorder, "transfer_cube", 1, image_size=(24, 32), max_steps=30, max_attempts=2)
    assert cut.committed == [] and len(cut.failed_seeds) == 2
    assert not list((tmp_path / "stage").glob("episode-*"))  # the failed demos' streamed files are gone
    kept = record_sim(recorder, "transfer_cube", 1, image_size=(24, 32), max_steps=30, keep_failed=True)
    (commit,) = kept.committed
    assert commit.frames == 30 and commit.encode_s < 5.0
    client.fetch(url, tmp_path / "ds")
    dataset = LeRobotDataset(url.bucket_id, root=tmp_path / "ds")
    assert dataset.meta.total_frames == 30 and not bool(dataset[29]["next.success"])
    assert dataset[0]["observation.images.top"].shape == (3, 24, 32)


def test_a_relative_staging_folder_commits_what_workers_wrote(bucket_server, tmp_path, monkeypatch):
    """`robotloop loop`'s default `--report-dir loop-report` is relative: its workers' episodes (written under
    absolute temp folders) must still count as the recorder's own staging, also after a chdir."""
    from robotloop.capture.recorder import write_episode

    monkeypatch.chdir(tmp_path)
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/relative")
    recorder = DatasetRecorder(client, url, SPEC, staging=Path("loop-report") / "staging")
    assert recorder.staging == tmp_path / "loop-report" / "staging"
    monkeypatch.chdir(tmp_path.parent)  # a command that changes folder later still names the same staging
    written = write_episode(SPEC, url.bucket_id, recorder.staging, synthetic_episode(0))
    assert recorder.commit_written(written).episode_index == 0
