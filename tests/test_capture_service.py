"""The capture service, end to end: a real bucket server and a real capture service on 127.0.0.1, real lerobot.

Robots stream frames with `CaptureClient`; committed episodes are read back with lerobot's own `LeRobotDataset`.
Every refused request must be a 4xx with a clear message and leave nothing in the bucket.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from robotloop.capture.client import CaptureClient, CaptureError
from robotloop.capture.episode import BadEpisode
from robotloop.capture.recorder import EPISODE_FACTS_FILE, DatasetSpec
from robotloop.capture.sessions import (
    EpisodeExpired,
    EpisodeSessions,
    Frames,
    Limits,
    SpecConflict,
    TooManyEpisodes,
    UnknownEpisode,
    decode_frames,
    encode_frames,
)
from robotloop.errors import Conflict
from robotloop.storage import BucketClient, BucketUrl, Entry, NotFound, StorageError

from .conftest import WRITE_TOKEN, free_port

ROBOT_A, ROBOT_B, ROBOT_READ_ONLY, ROBOT_ELSEWHERE = "rl_robot_a", "rl_robot_b", "rl_robot_ro", "rl_robot_elsewhere"
H, W, STATE, ACTION = 24, 32, 6, 4
CAMERAS = {"top": (H, W, 3)}
MAX_BODY, MAX_FRAMES = 200_000, 60  # small limits so the 413 paths are cheap to reach


@dataclass
class Capture:
    endpoint: str
    bucket: BucketClient  # reads the bucket with the bucket server's own write token
    log: Path  # the service's own output
    staging: Path  # where its recorders keep the episodes being written


@pytest.fixture(scope="module")
def capture(bucket_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    """`python -m services.capture` writing to the test bucket server with its own storage token."""
    yield from start_capture(bucket_server, tmp_path_factory.mktemp("capture"))


def start_capture(bucket_server, base: Path, *options: str) -> Iterator[Capture]:
    """Run `python -m services.capture` with `options` (flags) over `base` (its tokens, caches and log) until the
    generator is closed."""
    tokens = base / "robots"
    lines = [
        f"{ROBOT_A} write lab",
        f"{ROBOT_B} write lab",
        f"{ROBOT_READ_ONLY} read lab",
        f"{ROBOT_ELSEWHERE} write elsewhere",
    ]
    tokens.write_text("\n".join(lines) + "\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROBOTLOOP_", "HF_"))}
    env.update(
        {
            "ROBOTLOOP_CONFIG": os.devnull,
            "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint,
            "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN,
            "ROBOTLOOP_CAPTURE__MAX_BODY_BYTES": str(MAX_BODY),
            "ROBOTLOOP_CAPTURE__MAX_EPISODE_FRAMES": str(MAX_FRAMES),
            "ROBOTLOOP_CAPTURE__VCODEC": "h264",
            "XDG_CACHE_HOME": str(base / "cache"),
            "HF_HOME": str(base / "hf"),
        }
    )
    log = open(base / "capture.log", "ab")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "services.capture", "--host", "127.0.0.1", "--port", str(port)),
            *("--tokens", str(tokens), *options),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, (base / "capture.log").read_text()[-3000:]
        try:
            if httpx.get(f"{endpoint}/v1/health").status_code == 200:
                break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "capture service did not start"
            time.sleep(0.1)
    staging = base / "cache" / "robotloop" / "recordings"
    try:  # closing the generator (a test's `.close()`) raises GeneratorExit here: the service stops either way
        yield Capture(endpoint, BucketClient(bucket_server.endpoint, WRITE_TOKEN), base / "capture.log", staging)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def frames(n: int, start: int = 0, tag: float = 0.0) -> dict:
    """`n` frames numbered from `start`: image value 20 * i (one flat colour), state i, action tag."""
    i = np.arange(start, start + n)
    return {
        "timestamp": i / 50,
        "state": np.repeat(i[:, None], STATE, 1).astype(np.float32),
        "action": np.full((n, ACTION), tag, np.float32),
        "images": {"top": np.broadcast_to((20 * (i % 12)).astype(np.uint8)[:, None, None, None], (n, H, W, 3))},
    }


def bucket_files(capture: Capture, dataset: str) -> list[str]:
    try:
        return [e.url.path for e in capture.bucket.ls(BucketUrl.parse(dataset), recursive=True) if isinstance(e, Entry)]
    except NotFound:
        return []


def read_dataset(capture: Capture, dataset: str, dest: Path):
    """The dataset as lerobot sees it, downloaded from the bucket."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    url = BucketUrl.parse(dataset)
    capture.bucket.fetch(url, dest)
    return LeRobotDataset(url.bucket_id, root=dest, video_backend="pyav")


def test_a_robot_records_an_episode_lerobot_reads_it(capture, tmp_path):
    dataset = "hf://buckets/lab/capture/datasets/round-trip"
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        eid = robot.open(dataset, CAMERAS, STATE, ACTION, fps=50, robot_type="test-arm")
        assert robot.send_frames(eid, **frames(4, 0, tag=0.5)) == 4
        assert robot.send_frames(eid, **frames(6, 4, tag=0.5)) == 10
        assert bucket_files(capture, dataset) == []  # nothing is committed before the close
        report = robot.close(eid, "wave at the camera")
    assert (report["episode_index"], report["frames"]) == (0, 10)
    assert any(p.endswith(".mp4") for p in report["files"]) and any(p.endswith("info.json") for p in report["files"])

    ds = read_dataset(capture, dataset, tmp_path / "ds")
    assert (ds.meta.total_episodes, len(ds), ds.fps, ds.meta.robot_type) == (1, 10, 50, "test-arm")
    for i in (0, 3, 9):
        item = ds[i]
        assert item["observation.state"].tolist() == [float(i)] * STATE
        assert item["action"].tolist() == [0.5] * ACTION
        assert item["task"] == "wave at the camera"
        image = item["observation.images.top"]  # float CHW in [0, 1], through a lossy video codec
        assert tuple(image.shape) == (3, H, W)
        assert abs(float(image.mean()) * 255 - 20 * i) < 6


def test_two_robots_share_a_dataset_and_no_episode_is_lost(capture, tmp_path):
    dataset = "hf://buckets/lab/capture/datasets/shared"
    reports, errors = {}, []

    def record(token: str, tag: float) -> None:
        try:
            with CaptureClient(capture.endpoint, token) as robot:
                eid = robot.open(dataset, CAMERAS, STATE, ACTION)
                for start in range(0, 8, 4):
                    robot.send_frames(eid, **frames(4, start, tag))
                reports[tag] = robot.close(eid, f"robot {tag:g}")
        except Exception as error:  # surfaced by the assert below, with the robot it came from
            errors.append((token, error))

    threads = [threading.Thread(target=record, args=(token, tag)) for token, tag in ((ROBOT_A, 1.0), (ROBOT_B, 2.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(r["episode_index"] for r in reports.values()) == [0, 1]
    ds = read_dataset(capture, dataset, tmp_path / "ds")
    assert (ds.meta.total_episodes, len(ds)) == (2, 16)
    for tag, report in reports.items():
        first = ds.meta.episodes[report["episode_index"]]["dataset_from_index"]
        assert ds[first]["action"].tolist() == [tag] * ACTION
        assert ds[first]["task"] == f"robot {tag:g}"


def _raw(n: int = 3, start: int = 0, **change) -> bytes:
    """A frame batch in the wire format, with fields replaced by `change` (to make it wrong)."""
    fields = {**frames(n, start), **change}
    return encode_frames(fields["timestamp"], fields["state"], fields["action"], fields["images"])


def test_decoded_images_do_not_keep_the_request_body_alive():
    # The episode's byte limit counts image bytes: a body padded with JSON whitespace must not stay in memory.
    line, _, images = _raw(n=2).partition(b"\n")
    body = line[:-1] + b" " * 100_000 + b"}\n" + images
    spec = DatasetSpec(cameras={"top": (H, W, 3)}, state_dim=STATE, action_dim=ACTION)
    decoded = decode_frames(body, spec)
    assert decoded.images["top"].shape == (2, H, W, 3)
    assert not np.shares_memory(decoded.images["top"], np.frombuffer(body, np.uint8))


def _nan_state() -> np.ndarray:
    state = frames(3)["state"].copy()
    state[1, 2] = np.nan
    return state


BAD_BATCHES = {
    "wrong image shape": (_raw(images={"top": np.zeros((3, H, W - 1, 3), np.uint8)}), 422, "3 x 2304 = 6912 bytes"),
    "wrong image dtype": (_raw(images={"top": np.zeros((3, H, W, 3), np.float32)}), 422, "uint8 images"),
    "wrong state size": (_raw(state=np.zeros((3, STATE + 1), np.float32)), 422, f"has {STATE + 1} values"),
    "NaN in state": (_raw(state=_nan_state()), 422, "state of frame 1 (in this batch) holds NaN"),
    "timestamps out of order": (_raw(timestamp=[0.0, 0.04, 0.02]), 422, "strictly increasing"),
    "timestamps before the last batch": (_raw(start=1), 422, "is not after the episode's last frame"),
    "negative timestamp": (_raw(timestamp=[-0.02, 0.0, 0.02]), 422, ">= 0"),
    "a dropped frame": (_raw(timestamp=np.array([3, 4, 6]) / 50), 422, "2.00 frame periods apart"),
    "another frame rate": (_raw(timestamp=np.array([3, 4, 5]) / 30), 422, "records at 50 fps"),
    "not the wire format": (b'{"timestamp": [0.0]}', 422, "JSON line, a newline"),
    "malformed JSON": (b"{oops\n", 422, "bad frames JSON"),
    "JSON nested past the parser's depth": (b"[" * 100_000 + b"\n", 422, "bad frames JSON"),
    "string for a number": (b'{"timestamp": ["0.1"], "state": [], "action": []}\n', 422, "timestamp.0"),
    "body over the limit": (_raw(n=MAX_BODY // (H * W * 3) + 1, start=3), 413, f"limit of {MAX_BODY} bytes"),
}


@pytest.mark.parametrize("case", BAD_BATCHES)
def test_bad_frames_are_refused_and_nothing_reaches_the_bucket(capture, case):
    body, status, message = BAD_BATCHES[case]
    dataset = f"hf://buckets/lab/capture/datasets/bad-{case.replace(' ', '-')}"
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        eid = robot.open(dataset, CAMERAS, STATE, ACTION)
        robot.send_frames(eid, **frames(3))  # good frames first: a bad batch must not spoil or leak them
        with pytest.raises(CaptureError) as refused:
            robot.send_raw(eid, body)
        assert refused.value.status == status and message in refused.value.message, refused.value
        assert bucket_files(capture, dataset) == []
        assert robot.send_frames(eid, **frames(2, 3)) == 5  # the episode is intact and still open
        robot.abort(eid)
    assert bucket_files(capture, dataset) == []


def test_episode_caps_unknown_and_foreign_episodes(capture):
    dataset = "hf://buckets/lab/capture/datasets/caps"
    with CaptureClient(capture.endpoint, ROBOT_A) as a, CaptureClient(capture.endpoint, ROBOT_B) as b:
        eid = a.open(dataset, CAMERAS, STATE, ACTION)
        a.send_frames(eid, **frames(MAX_FRAMES - 2))
        with pytest.raises(CaptureError, match=f"would hold {MAX_FRAMES + 1} frames; the limit is {MAX_FRAMES}") as e:
            a.send_frames(eid, **frames(3, MAX_FRAMES - 2))
        assert e.value.status == 413

        for robot, episode in ((a, "0" * 32), (b, eid)):  # never opened / another robot's: the same answer
            with pytest.raises(CaptureError, match="no open episode") as e:
                robot.send_raw(episode, _raw(start=100))
            assert e.value.status == 404
            with pytest.raises(CaptureError, match="no open episode"):
                robot.close(episode, "steal it")
            with pytest.raises(CaptureError, match="no open episode"):
                robot.abort(episode)

        for task in ("   ", "pick\nthe cube", "pick\x00"):
            with pytest.raises(CaptureError, match="task must be") as e:  # bad input loses nothing: still open
                a.close(eid, task)
            assert e.value.status == 422 and "still open" in str(e.value)
        a.abort(eid)  # it was still open; now it is gone
        with pytest.raises(CaptureError, match="no open episode"):
            a.close(eid, "try again")
        eid = a.open(dataset, CAMERAS, STATE, ACTION)
        with pytest.raises(CaptureError, match="no frames") as e:
            a.close(eid, "nothing recorded")
        assert e.value.status == 422
    assert bucket_files(capture, dataset) == []


@pytest.mark.parametrize(
    ("token", "dataset", "shape", "status", "message"),
    [
        (None, "hf://buckets/lab/capture/datasets/auth", (H, W, 3), 401, "robot token is required"),
        ("rl_not_a_token", "hf://buckets/lab/capture/datasets/auth", (H, W, 3), 401, "Invalid credentials"),
        (ROBOT_READ_ONLY, "hf://buckets/lab/capture/datasets/auth", (H, W, 3), 403, "read-only"),
        (ROBOT_ELSEWHERE, "hf://buckets/lab/capture/datasets/auth", (H, W, 3), 403, "scoped to namespace 'elsewhere'"),
        (ROBOT_A, "hf://datasets/lab/cube", (H, W, 3), 400, "robotloop stores data in buckets"),
        (ROBOT_A, "hf://buckets/la b/capture/datasets/x", (H, W, 3), 400, "alphanumeric chars"),
        (ROBOT_A, "hf://buckets/lab/capture/datasets/auth", (H, W, 4), 400, "cameras.top.2"),
    ],
)
def test_open_is_refused_with_a_reason(capture, token, dataset, shape, status, message):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    body = {"dataset": dataset, "cameras": {"top": list(shape)}, "state_dim": STATE, "action_dim": ACTION}
    response = httpx.post(f"{capture.endpoint}/v1/episodes", json=body, headers=headers)
    assert response.status_code == status and message in response.json()["error"], response.text
    assert bucket_files(capture, "hf://buckets/lab/capture/datasets/auth") == []


def test_frames_need_the_robots_token(capture):
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        eid = robot.open("hf://buckets/lab/capture/datasets/tokenless", CAMERAS, STATE, ACTION)
        for headers in ({}, {"authorization": "Bearer rl_not_a_token"}):
            response = httpx.post(f"{capture.endpoint}/v1/episodes/{eid}/frames", content=_raw(), headers=headers)
            assert response.status_code == 401, response.text
        robot.abort(eid)


def test_another_spec_for_an_open_dataset_is_a_conflict(capture):
    dataset = "hf://buckets/lab/capture/datasets/round-trip-spec"
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        eid = robot.open(dataset, CAMERAS, STATE, ACTION)
        with pytest.raises(CaptureError, match="state_dim 7") as e:
            robot.open(dataset, CAMERAS, STATE + 1, ACTION)
        assert e.value.status == 409
        robot.abort(eid)


def test_a_sim_cameras_rendering_is_kept_and_another_is_refused_at_open(capture, tmp_path):
    from robotloop.capture.recorder import camera_shadow_map

    dataset = "hf://buckets/lab/capture/datasets/rendered"
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        eid = robot.open(dataset, CAMERAS, STATE, ACTION, shadow_map=2048)
        robot.send_frames(eid, **frames(3))
        robot.close(eid, "transfer the cube")
        with pytest.raises(CaptureError, match="2048-texel shadow maps") as e:
            robot.open(dataset, CAMERAS, STATE, ACTION)  # gym-aloha's rendering: other pixels, another dataset
        assert e.value.status == 409
        with pytest.raises(CaptureError, match="shadow_map") as e:
            robot.open(f"{dataset}-bad", CAMERAS, STATE, ACTION, shadow_map=3000)
        assert e.value.status == 400 and "256, 512" in str(e.value)
    info = json.loads(capture.bucket.download(BucketUrl.parse(f"{dataset}/meta/info.json"), tmp_path / "i").read_text())
    assert camera_shadow_map(info["features"]["observation.images.top"]) == 2048
    assert bucket_files(capture, f"{dataset}-bad") == []
    fresh = EpisodeSessions(capture.bucket, vcodec="h264", staging=tmp_path / "fresh")  # a restarted service
    with pytest.raises(SpecConflict, match="rendered with 2048-texel shadow maps"):
        fresh.open("robot-x", BucketUrl.parse(dataset), CAMERAS, STATE, ACTION)


def test_idle_episodes_expire_and_each_robot_has_an_open_cap(capture, tmp_path):
    """The library directly, with a clock we move: idle episodes go, and free their robot's slot."""
    now = [0.0]
    sessions = EpisodeSessions(
        capture.bucket,
        Limits(max_open_per_robot=2, idle_timeout_s=10),
        "h264",
        clock=lambda: now[0],
        staging=tmp_path / "staging",
    )
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/idle")
    first = sessions.open("robot-1", url, CAMERAS, STATE, ACTION)
    now[0] = 6
    second = sessions.open("robot-1", url, CAMERAS, STATE, ACTION)
    with pytest.raises(TooManyEpisodes, match="already has 2 open episodes"):
        sessions.open("robot-1", url, CAMERAS, STATE, ACTION)
    other = sessions.open("robot-2", url, CAMERAS, STATE, ACTION)  # the cap is per robot
    now[0] = 12
    assert sessions.add_frames("robot-1", second, _raw()) == 3
    assert [gone.episode_id for gone in sessions.expire()] == [first]  # idle 12 s; the others 6 s
    with pytest.raises(EpisodeExpired, match="dropped after 10 s without a request"):
        sessions.add_frames("robot-1", first, _raw())
    with pytest.raises(UnknownEpisode, match="no open episode") as e:  # another robot learns nothing of it
        sessions.add_frames("robot-2", first, _raw())
    assert not isinstance(e.value, EpisodeExpired)
    sessions.open("robot-1", url, CAMERAS, STATE, ACTION)  # the expired episode freed its slot
    now[0] = 30
    gone = sessions.expire()
    assert sorted(g.frames for g in gone) == [0, 0, 3] and sessions.open_count() == 0
    with pytest.raises(EpisodeExpired):
        sessions.abort("robot-2", other)
    stats = sessions.stats()
    assert (stats["episodes_abandoned"], stats["open_episodes"], stats["open_frames"], stats["queued_frames"]) == (
        4,
        0,
        0,
        0,
    )
    assert bucket_files(capture, str(url)) == []


IDLE_S = 1


@pytest.fixture(scope="module")
def idle_capture(bucket_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    """A capture service that drops episodes after `IDLE_S` without a request (set with its flag)."""
    yield from start_capture(bucket_server, tmp_path_factory.mktemp("idle-capture"), "--idle-timeout-s", str(IDLE_S))


def _stats(capture: Capture, token: str = ROBOT_A) -> dict:
    response = httpx.get(f"{capture.endpoint}/v1/stats", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_vanished_robots_episode_is_dropped_counted_and_freed(idle_capture):
    """A robot streams frames, then vanishes mid-upload: its last request stops mid-body, and it never closes, aborts
    or disconnects. After the idle timeout the episode is gone, uncommitted, its frames and staging files freed, the
    log and the stats say so, the stalled request is answered 408, and a late request is told why."""
    capture, dataset = idle_capture, "hf://buckets/lab/capture/datasets/vanished"
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        eid = robot.open(dataset, CAMERAS, STATE, ACTION)
        robot.send_frames(eid, **frames(10))
        assert (_stats(capture)["open_episodes"], _stats(capture)["open_frames"]) == (1, 10)
        assert list(capture.staging.glob("*/episode-*"))  # the episode being written
        host, port = capture.endpoint.removeprefix("http://").split(":")
        stalled = socket.create_connection((host, int(port)))  # promise 100 kB, send 50 bytes, then nothing
        stalled.sendall(
            f"POST /v1/episodes/{eid}/frames HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ROBOT_A}"
            f"\r\nContent-Length: 100000\r\n\r\n".encode()
            + b"x" * 50
        )
        deadline = time.monotonic() + 10 * IDLE_S
        while _stats(capture)["episodes_abandoned"] == 0:
            assert time.monotonic() < deadline, _stats(capture)
            time.sleep(0.1)
        stats = _stats(capture, ROBOT_READ_ONLY)  # any robot token reads the stats
        assert (stats["open_episodes"], stats["open_frames"], stats["queued_frames"]) == (0, 0, 0), stats
        assert (stats["episodes_abandoned"], stats["episodes_committed"], stats["idle_timeout_s"]) == (1, 0, IDLE_S)
        assert list(capture.staging.glob("*/episode-*")) == []  # its encoder's files, gone
        stalled.settimeout(10 * IDLE_S)
        answer = b"".join(iter(lambda: stalled.recv(4096), b"")).decode()  # until the service closes it
        assert answer.startswith("HTTP/1.1 408") and "no byte of the request body arrived" in answer, answer
        stalled.close()
        with pytest.raises(CaptureError, match=f"dropped after {IDLE_S} s without a request") as late:
            robot.send_frames(eid, **frames(2, 10))
        assert late.value.status == 404 and "nothing of it was committed" in late.value.message
        with pytest.raises(CaptureError, match="dropped after"):
            robot.close(eid, "pick the cube")
    assert bucket_files(capture, dataset) == []
    said = capture.log.read_text()
    assert f"episode {eid} in {dataset} dropped after" in said and "10 frame(s) discarded, nothing committed" in said
    assert "Traceback" not in said, said


def test_an_episode_in_use_is_not_idle(idle_capture):
    """Requests keep an episode open however long it lives: only time without any request counts."""
    with CaptureClient(capture_endpoint := idle_capture.endpoint, ROBOT_B) as robot:
        eid = robot.open("hf://buckets/lab/capture/datasets/busy", CAMERAS, STATE, ACTION)
        for start in range(0, 24, 3):  # 8 batches over about 3 idle timeouts
            robot.send_frames(eid, **frames(3, start))
            time.sleep(IDLE_S * 0.4)
        assert robot.close(eid, "keep going")["frames"] == 24
    assert httpx.get(f"{capture_endpoint}/v1/health").json()["open_episodes"] == 0


def test_a_dataset_holds_one_robot_type_and_says_so_at_open(capture, tmp_path):
    dataset = "hf://buckets/lab/capture/datasets/one-robot-type"
    with CaptureClient(capture.endpoint, ROBOT_A) as a:
        eid = a.open(dataset, CAMERAS, STATE, ACTION, robot_type="so101_follower")
        a.send_frames(eid, **frames(4))
        a.close(eid, "pick the cube")
        with pytest.raises(CaptureError, match="robot type 'so101_follower'") as e:
            a.open(dataset, CAMERAS, STATE, ACTION, robot_type="koch_follower")  # refused before any frame is sent
        assert e.value.status == 409 and "koch_follower" in str(e.value)
    fresh = EpisodeSessions(capture.bucket, vcodec="h264", staging=tmp_path / "fresh")  # a restarted service
    with pytest.raises(SpecConflict, match="robot type 'so101_follower', not 'koch_follower'"):
        fresh.open("robot-x", BucketUrl.parse(dataset), CAMERAS, STATE, ACTION, robot_type="koch_follower")


def test_a_meta_info_that_is_no_dataset_is_a_conflict_at_open(capture, tmp_path):
    for name, body in (("not-json", b"\xff{oops"), ("no-shapes", b'{"features": {"observation.state": {}}}')):
        url = BucketUrl.parse(f"hf://buckets/lab/capture/datasets/{name}")
        (tmp_path / "info.json").write_bytes(body)
        capture.bucket.upload(tmp_path / "info.json", url / "meta" / "info.json")
        with CaptureClient(capture.endpoint, ROBOT_A) as robot, pytest.raises(CaptureError) as e:
            robot.open(str(url), CAMERAS, STATE, ACTION)
        assert e.value.status == 409 and "not a LeRobot dataset's" in str(e.value), e.value


def test_a_robot_that_disconnects_mid_body_leaves_no_traceback_and_its_episode_open(capture):
    dataset = "hf://buckets/lab/capture/datasets/disconnect"
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        eid = robot.open(dataset, CAMERAS, STATE, ACTION)
        robot.send_frames(eid, **frames(3))
        before = capture.log.stat().st_size
        host, port = capture.endpoint.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as raw:  # promise 100 kB, send 50 bytes, hang up
            raw.sendall(
                f"POST /v1/episodes/{eid}/frames HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ROBOT_A}"
                f"\r\nContent-Length: 100000\r\n\r\n".encode()
                + b"x" * 50
            )
        time.sleep(1.0)
        robot.send_frames(eid, **frames(2, 3))  # the episode is as it was
        report = robot.close(eid, "pick the cube")
        assert report["frames"] == 5
    said = capture.log.read_bytes()[before:].decode(errors="replace")
    assert "Traceback" not in said and "ClientDisconnect" not in said, said


def test_frames_are_encoded_while_the_episode_is_open_and_a_failed_upload_keeps_it(capture, tmp_path, monkeypatch):
    """The library directly: an open episode holds at most its encoder's queue, never the episode. With a queue of
    2 frames, 60 accepted frames prove the encoder took them before the close; none was dropped for a batch
    larger than the queue (the batch waited); and a failed upload keeps the encoded episode for another close."""
    from robotloop.compat import video_encoder_queues

    sessions = EpisodeSessions(
        capture.bucket, Limits(encoder_queue_s=2 / 50), "h264", staging=tmp_path / "staging"
    )  # 2 frames at 50 fps
    url = BucketUrl.parse("hf://buckets/lab/capture/datasets/streamed-open")
    eid = sessions.open("robot-1", url, CAMERAS, STATE, ACTION)
    for start in range(0, 60, 20):
        assert sessions.add_frames("robot-1", eid, _raw(20, start)) == start + 20
    live = sessions._sessions[eid].live
    queues = video_encoder_queues(live.dataset.writer)
    assert [q.maxsize for q in queues] == [2] and sum(q.qsize() for q in queues) <= 2  # 58+ already encoded
    assert live.frames == 60 and live.dropped_frames() == 0
    with pytest.raises(BadEpisode, match="frame 1 of the batch: state holds NaN"):  # checked as frames, all first
        sessions.add_frames("robot-1", eid, _with_nan_state(_raw(2, 60), row=1))
    assert live.frames == 60

    upload = capture.bucket.upload
    monkeypatch.setattr(capture.bucket, "upload", lambda *a: (_ for _ in ()).throw(StorageError("connection reset")))
    with pytest.raises(StorageError, match="connection reset"):
        sessions.close("robot-1", eid, "stack the blocks")
    assert bucket_files(capture, str(url)) == [] and sessions.open_count() == 1
    with pytest.raises(Conflict, match="close it again or abort it"):  # encoded for the close: no more frames
        sessions.add_frames("robot-1", eid, _raw(2, 60))
    monkeypatch.setattr(capture.bucket, "upload", upload)
    report = sessions.close("robot-1", eid, "stack the blocks")
    assert (report.episode_index, report.frames, sessions.open_count()) == (0, 60, 0)
    ds = read_dataset(capture, str(url), tmp_path / "ds")
    assert (len(ds), ds[59]["observation.state"].tolist(), ds[59]["task"]) == (60, [59.0] * STATE, "stack the blocks")


def _with_nan_state(body: bytes, row: int) -> Frames:
    """`body` decoded, with a NaN in one state row: a batch decoded elsewhere, so only the recorder checks it."""
    batch = decode_frames(body, DatasetSpec(cameras=CAMERAS, state_dim=STATE, action_dim=ACTION))
    batch.state[row, 0] = np.nan
    return batch


# -- fleet datasets (issue 29): intervention flags, policy actions and facts through the service ------------------
FLEET, DEMOS = "hf://buckets/lab/capture/datasets/fleet", "hf://buckets/lab/capture/datasets/fleet-demos"
FLEET_TASK, ROBOT_FACTS = "hand the cube over", {"robot_id": "r1", "release": "v7", "seed": 12}
EXPERT = (2, 3)  # the frames the expert drove in the committed fleet episode


def fleet_frames(n: int, start: int = 0) -> dict:
    """`frames`, plus what a fleet robot sends: the expert drives `EXPERT` (no policy action there: zeros), the
    policy proposes its frame number / 10 elsewhere; reward 0.5 per frame, 1.0 at frame 5, never a success."""
    i = np.arange(start, start + n)
    expert = np.isin(i, EXPERT)
    policy = np.where(expert[:, None], 0.0, np.repeat(i[:, None] / 10, ACTION, 1)).astype(np.float32)
    reward, success = np.where(i == 5, 1.0, 0.5), np.zeros(n, bool)
    return {**frames(n, start), "intervention": expert, "policy_action": policy, "reward": reward, "success": success}


def _fleet_raw(n: int = 3, start: int = 0, fleet: bool = True, **change) -> bytes:
    """A batch in the wire format: a fleet one (or, `fleet=False`, a demo one), its fields replaced by `change`
    (None: left out); a field given as a string is written into the JSON line as is (a wrong JSON type)."""
    fields = {**(fleet_frames(n, start) if fleet else frames(n, start)), **change}
    wire = {k: v for k, v in fields.items() if v is not None and not isinstance(v, str)}
    line, _, images = encode_frames(**wire).partition(b"\n")
    json_line = json.loads(line) | {k: json.loads(v) for k, v in fields.items() if isinstance(v, str)}
    return json.dumps(json_line).encode() + b"\n" + images


def _committed(capture: Capture, dataset: str) -> dict[str, str]:
    """Every file of the dataset and its Xet hash: equal hashes, equal bytes."""
    listing = capture.bucket.ls(BucketUrl.parse(dataset), recursive=True)
    return {e.url.path: e.xet_hash for e in listing if isinstance(e, Entry)}


@pytest.fixture(scope="module")
def fleet_datasets(capture) -> dict[str, dict[str, str]]:
    """A fleet dataset with one episode (6 frames, the expert on `EXPERT`) and a demo dataset with one, committed
    through the service; what each holds (`_committed`)."""
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        eid = robot.open(FLEET, CAMERAS, STATE, ACTION, robot_type="test-arm", fleet=True)
        robot.send_frames(eid, **fleet_frames(4))
        robot.send_frames(eid, **fleet_frames(2, 4))
        assert robot.close(eid, FLEET_TASK, facts=ROBOT_FACTS)["episode_index"] == 0
        eid = robot.open(DEMOS, CAMERAS, STATE, ACTION, robot_type="test-arm")
        robot.send_frames(eid, **frames(3))
        robot.close(eid, "demonstrate")
    return {url: _committed(capture, url) for url in (FLEET, DEMOS)}


def test_a_fleet_episode_through_the_service_is_what_the_fleet_recorder_writes(capture, fleet_datasets, tmp_path):
    from robotloop.fleet import EpisodeFacts

    ds = read_dataset(capture, FLEET, tmp_path / "ds")
    spec = DatasetSpec(CAMERAS, STATE, ACTION, robot_type="test-arm", fleet=True)  # what FleetRecorder records
    assert {k: (f["dtype"], tuple(f["shape"])) for k, f in ds.features.items() if k in spec.features()} == {
        k: (f["dtype"], tuple(f["shape"])) for k, f in spec.features().items()
    }
    rows = ds.hf_dataset  # the parquet's columns: no video decoded
    assert [bool(flag) for flag in rows["intervention"]] == [i in EXPERT for i in range(6)]
    assert [row.tolist() for row in rows["policy_action"]] == fleet_frames(6)["policy_action"].tolist()
    assert ds[3]["intervention"].item() and ds[3]["policy_action"].tolist() == [0.0] * ACTION  # through lerobot
    (line,) = (tmp_path / "ds" / EPISODE_FACTS_FILE).read_text().splitlines()
    # FleetRecorder's line: the episode's index, EpisodeFacts, then what the frames say.
    in_process = {"episode_index": 0, **asdict(EpisodeFacts("r1", "v7", FLEET_TASK, seed=12))}
    said = {"success": False, "max_reward": 1.0, "frames": 6, "expert_frames": 2, "kind": "takeover"}
    assert json.loads(line) == in_process | said


# Each refused request: the dataset of the episode it tries to spoil, the request, and the answer. The request gets
# the robot, the episode (open, with good frames) and the frame to send next.
FLEET_REFUSALS = {
    "a frame without intervention": (
        FLEET,
        lambda robot, eid, t: robot.send_raw(eid, _fleet_raw(start=t, intervention=None)),
        422,
        "'intervention' is missing",
    ),
    "a frame without policy_action": (
        FLEET,
        lambda robot, eid, t: robot.send_raw(eid, _fleet_raw(start=t, policy_action=None)),
        422,
        "'policy_action' is missing",
    ),
    "a policy_action of another length": (
        FLEET,
        lambda robot, eid, t: robot.send_raw(eid, _fleet_raw(start=t, policy_action=np.zeros((3, ACTION + 1)))),
        422,
        f"policy_action of frame 0 has {ACTION + 1} values, the dataset's policy_action has {ACTION}",
    ),
    "a policy_action of another type": (
        FLEET,
        lambda robot, eid, t: robot.send_raw(eid, _fleet_raw(start=t, policy_action='[["0.5"], [true], [1]]')),
        422,
        "policy_action.0.0",
    ),
    "an intervention of another type": (
        FLEET,
        lambda robot, eid, t: robot.send_raw(eid, _fleet_raw(start=t, intervention="[0, 1, 0]")),
        422,
        "intervention.0",
    ),
    "intervention sent to a demo dataset": (
        DEMOS,
        lambda robot, eid, t: robot.send_raw(eid, _fleet_raw(start=t, fleet=False, intervention=np.zeros(3, bool))),
        422,
        "'intervention' is a fleet dataset's feature",
    ),
    "policy_action sent to a demo dataset": (
        DEMOS,
        lambda robot, eid, t: robot.send_raw(eid, _fleet_raw(start=t, fleet=False, policy_action=np.zeros((3, 4)))),
        422,
        "'policy_action' is a fleet dataset's feature",
    ),
    "facts for a demo episode": (
        DEMOS,
        lambda robot, eid, t: robot.close(eid, "demonstrate", facts=ROBOT_FACTS),
        422,
        "facts are a fleet dataset's",
    ),
    "facts the service counts itself": (
        FLEET,
        lambda robot, eid, t: robot.close(eid, FLEET_TASK, facts={**ROBOT_FACTS, "kind": "expert"}),
        422,
        "facts ['kind'] are the service's to write",
    ),
    "a fact that is no flat value": (
        FLEET,
        lambda robot, eid, t: robot.close(eid, FLEET_TASK, facts={"robot_id": ["r1"]}),
        400,
        "facts.robot_id: Value error, a fact is a string, a number, true, false or null",
    ),
    "a fleet dataset opened without fleet": (
        FLEET,
        lambda robot, eid, t: robot.open(FLEET, CAMERAS, STATE, ACTION, robot_type="test-arm"),
        409,
        "fleet columns 'intervention' and 'policy_action'; this episode asks for",
    ),
    "a demo dataset opened as a fleet dataset": (
        DEMOS,
        lambda robot, eid, t: robot.open(DEMOS, CAMERAS, STATE, ACTION, robot_type="test-arm", fleet=True),
        409,
        "fleet columns 'intervention' and 'policy_action'. Use the same features",
    ),
}


@dataclass
class OpenEpisode:
    robot: CaptureClient
    id: str
    frames: int  # accepted so far: the next batch starts there


@pytest.fixture(scope="module")
def open_episodes(capture, fleet_datasets) -> Iterator[dict[str, OpenEpisode]]:
    """An open episode with good frames in each of `FLEET` and `DEMOS`, for every refusal to try to spoil: one each
    for all the cases, since dropping an episode waits a second for its encoder thread (lerobot's, polling its
    queue each second)."""
    with CaptureClient(capture.endpoint, ROBOT_A) as robot:
        episodes = {}
        for dataset, good in ((FLEET, fleet_frames), (DEMOS, frames)):
            eid = robot.open(dataset, CAMERAS, STATE, ACTION, robot_type="test-arm", fleet=dataset == FLEET)
            episodes[dataset] = OpenEpisode(robot, eid, robot.send_frames(eid, **good(3)))
        yield episodes
        for episode in episodes.values():
            robot.abort(episode.id)


@pytest.mark.parametrize("case", FLEET_REFUSALS)
def test_fleet_features_that_do_not_fit_are_refused_and_nothing_committed_changes(
    capture, fleet_datasets, open_episodes, case
):
    dataset, request, status, message = FLEET_REFUSALS[case]
    episode = open_episodes[dataset]
    with pytest.raises(CaptureError) as refused:
        request(episode.robot, episode.id, episode.frames)
    assert refused.value.status == status and message in refused.value.message, refused.value
    good = fleet_frames(2, episode.frames) if dataset == FLEET else frames(2, episode.frames)
    sent = episode.robot.send_frames(episode.id, **good)  # the episode is intact, still open, and took nothing
    episode.frames, before = sent, episode.frames
    assert sent == before + 2
    assert _committed(capture, FLEET) == fleet_datasets[FLEET]  # byte for byte: nothing committed changed
    assert _committed(capture, DEMOS) == fleet_datasets[DEMOS]


@pytest.mark.parametrize(("dataset", "fleet"), [(FLEET, False), (DEMOS, True)])
def test_a_restarted_service_refuses_the_other_kind_of_dataset_at_open(
    capture, fleet_datasets, tmp_path, dataset, fleet
):
    """A service that never opened the dataset reads its kind from the bucket's meta/info.json."""
    fresh = EpisodeSessions(capture.bucket, vcodec="h264", staging=tmp_path / "fresh")
    with pytest.raises(SpecConflict, match="'intervention' and 'policy_action' are a fleet dataset's"):
        fresh.open("robot-x", BucketUrl.parse(dataset), CAMERAS, STATE, ACTION, robot_type="test-arm", fleet=fleet)
    assert _committed(capture, dataset) == fleet_datasets[dataset]
