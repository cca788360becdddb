"""robotloop.cluster: `eval --ray` and `record --ray` on a real two-node Ray cluster of this machine, on CPU.

The cluster (`ray.cluster_utils.Cluster`: a head and a worker node, one CPU each, so two actors land one per node)
is started once for the module. A tiny random-weight ACT on 48x64 images never solves the task: what is checked is
that an episode on Ray is the episode the local run gives for its seed (frame for frame, in its video), that the
work spreads over both nodes, that a worker killed mid-episode costs a retry and nothing else, and that a killed
driver leaves no worker and no half episode behind.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from robotloop.cluster import ray_session
from robotloop.cluster.eval import ACTOR_CPUS, FILMS_PREFIX
from robotloop.config import load_settings
from robotloop.deploy.client import DeployClient
from robotloop.deploy.evaluate import evaluate, locate_and_evaluate
from robotloop.deploy.keys import generate_keypair, load_private_key, public_path
from robotloop.deploy.local import start_local_deploy_service
from robotloop.deploy.publish import publish
from robotloop.deploy.runner import make_tiny_checkpoint
from robotloop.rounds.fleet import FleetRobot, fleet_episodes, run_fleet
from robotloop.sim.constants import NO_SHADOWS
from robotloop.sim.scripted import record_demo
from robotloop.storage import BucketClient, BucketUrl

from .conftest import SESSION_CACHE, WRITE_TOKEN
from .test_capture import load_with_lerobot

pytest.importorskip("ray")
SIZE = (48, 64)


@pytest.fixture(scope="module")
def cluster() -> str:
    """A head and one worker node, one CPU each, the smallest object stores Ray takes, no dashboard."""
    from ray.cluster_utils import Cluster

    store = 80 * 2**20
    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": store, "include_dashboard": False},
    )
    try:
        nodes.add_node(num_cpus=1, object_store_memory=store)
        nodes.wait_for_nodes()
        yield nodes.address
    finally:
        nodes.shutdown()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("policy") / "pretrained_model", SIZE)


def _actor_processes(name: str) -> list[int]:
    """Pids of the Ray worker processes running an actor of class `name` (Ray titles them `ray::<class>...`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(f"ray::{name}".encode()):
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    return pids


def _decode(path: str) -> list[np.ndarray]:
    import av

    with av.open(path) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def _kill_first(title: str, killed: list[int], deadline_s: float = 60) -> threading.Thread:
    """A thread that SIGKILLs the first process titled `title` (an actor inside one of its calls) it sees."""

    def run() -> None:
        end = time.monotonic() + deadline_s
        while not killed and time.monotonic() < end:
            for pid in _actor_processes(title):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_eval_on_two_nodes_gives_the_local_episodes(tiny: Path, cluster: str, bucket_server, tmp_path: Path) -> None:
    """A run's checkpoint in the bucket, 4 episodes in waves of 2 on two actors, one per node, each downloading the
    checkpoint on its own; one actor killed inside its first wave: the report holds the local run's episodes, each
    filmed frame for frame as locally."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    model = BucketUrl.parse("hf://buckets/lab/ray/models/run1")
    client.create_bucket(model)
    client.upload(tiny, model / "checkpoints" / "000005" / "pretrained_model")
    (tmp_path / "last.json").write_text(json.dumps({"step": 5}))
    client.upload(tmp_path / "last.json", model / "checkpoints" / "last.json")
    storage = {"endpoint": bucket_server.endpoint, "token": WRITE_TOKEN, "cache_dir": str(tmp_path / "cache" / "read")}
    settings = load_settings({"storage": storage})
    run = dict(batch=2, max_steps=16, seed=11, videos=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(ACTOR_CPUS)  # the actors' thread count: the same float sums, so the same actions
    try:
        local = evaluate(tiny, "transfer_cube", 4, 1, output_dir=tmp_path / "local", **run)
    finally:
        torch.set_num_threads(threads)

    killed: list[int] = []
    killer = _kill_first("EvalWorker.run", killed)
    on_ray = locate_and_evaluate(
        settings, str(model), "transfer_cube", 4, 2, output_dir=tmp_path / "ray", ray=cluster, **run
    )
    killer.join()
    assert killed, "no evaluation actor was caught inside a wave"
    assert on_ray.workers == 2 and len(on_ray.nodes) == 2, on_ray.nodes
    assert sorted(i for episodes in on_ray.nodes.values() for i in episodes) == [0, 1, 2, 3]

    def facts(e):
        return e.index, e.seed, e.success, e.max_reward, e.sum_reward, e.steps, e.stage_steps

    assert [facts(e) for e in on_ray.episodes] == [facts(e) for e in local.episodes]
    for ours, theirs in zip(on_ray.episodes, local.episodes, strict=True):
        assert Path(ours.video).parent == tmp_path / "ray" / "videos"
        frames, expected = _decode(ours.video), _decode(theirs.video)
        assert len(frames) == len(expected) == ours.steps + 1, (len(frames), len(expected), ours.steps)
        # Frame for frame: the same actions (the local run on the actors' one thread) and films whose coding does
        # not depend on what the heap held (`write_video`: with x264's macroblock tree this failed now and then
        # until 2026-12-07).
        pairs = enumerate(zip(frames, expected, strict=True))
        differ = {i: int(np.abs(a.astype(int) - b).max()) for i, (a, b) in pairs if (a != b).any()}
        assert not differ, f"episode {ours.index}: frame -> largest pixel difference from the local run's: {differ}"
    saved = json.loads((tmp_path / "ray" / "eval_report.json").read_text())
    assert saved["nodes"] == on_ray.nodes and saved["summary"] == local.summary
    assert saved["checkpoint"] == f"{model}/checkpoints/000005"
    assert not _actor_processes("EvalWorker"), "evaluation actors outlived the evaluation"
    # The killed actor never closed; the actor that ran its wave again removed its film folder.
    assert not list(Path(tempfile.gettempdir()).glob(f"{FILMS_PREFIX}{killed[0]}-*"))


def test_record_on_ray_commits_the_local_demos(cluster: str, bucket_server, tmp_path: Path) -> None:
    """`robotloop record --ray`: two demos recorded by actors on both nodes, each committed on its node, one actor
    killed inside its first demo; read back with lerobot: the states and actions the scripted expert gives for those
    seeds, each once."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/ray/datasets/demos")
    env = {
        **os.environ,
        "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint,
        "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN,
        "COLUMNS": "300",
    }
    args = ["--sim", "transfer_cube", "--image-size", "24x32", "--max-steps", "20", "--keep-failed"]
    args += ["--codec", "h264", "--seed", "3", "--episodes", "2", "--workers", "2"]
    killed: list[int] = []
    killer = _kill_first("RecordWorker.demo", killed)
    done = subprocess.run(
        [sys.executable, "-m", "robotloop.cli", "record", "--to", str(url), *args, "--ray", cluster],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    killer.join()
    assert killed, "no recording actor was caught inside a demo"
    said = " ".join(done.stdout.split())  # 20 steps are too few for the expert: both demos kept, marked failed
    assert "committed 2 episodes" in said and any(f"(kept, marked): {s}" in said for s in ("[3, 4]", "[4, 3]")), said
    dataset = load_with_lerobot(client, url, tmp_path / "read")
    assert dataset.meta.total_episodes == 2 and len(dataset) == 40
    assert dataset[39]["observation.images.top"].shape == (3, 24, 32)  # the last episode's video is whole
    rows = dataset.hf_dataset.with_format("numpy")
    episodes = np.asarray(rows["episode_index"])
    states, actions = np.asarray(rows["observation.state"]), np.asarray(rows["action"])
    # Commits go in the order demos end, which on two nodes may be either: each episode is matched to its seed's.
    demos = {seed: record_demo("transfer_cube", seed, (24, 32), max_steps=20) for seed in (3, 4)}
    matched = set()
    for k in range(2):
        for seed, demo in demos.items():
            if np.allclose(states[episodes == k], demo.states[:20], atol=1e-5):
                np.testing.assert_allclose(actions[episodes == k], demo.actions[:20], atol=1e-6)
                matched.add(seed)
    assert matched == {3, 4}
    assert not _actor_processes("RecordWorker") + _actor_processes("EpisodeCommitter"), "Ray workers outlived it"


def test_a_killed_driver_leaves_no_worker_and_no_half_episode(cluster: str, bucket_server, tmp_path: Path) -> None:
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/ray/datasets/killed")
    env = {
        **os.environ,
        "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint,
        "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN,
    }
    args = ["--image-size", "24x32", "--max-steps", "12", "--keep-failed", "--codec", "h264", "--workers", "2"]
    cmd = [sys.executable, "-m", "robotloop.cli", "record", "--to", str(url), *args, "--episodes", "50"]
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen([*cmd, "--ray", cluster], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while _total_episodes(client, url) < 1 and time.monotonic() < deadline:
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        time.sleep(0.1)
    actors = _actor_processes("RecordWorker")
    assert actors, "the recording runs in Ray actors"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30  # Ray stops the actors and tasks a dead driver owned
    while (
        alive := _actor_processes("RecordWorker") + _actor_processes("EpisodeCommitter")
    ) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"actors {alive} outlived the killed driver"
    committed = _total_episodes(client, url)
    dataset = load_with_lerobot(client, url, tmp_path / "after-kill")
    assert dataset.meta.total_episodes == committed and len(dataset) == 12 * committed  # every episode whole


def test_fleet_robots_on_two_nodes_record_the_episodes_local_robots_record(
    tiny: Path, cluster: str, bucket_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet of `loop --rounds --ray`: two robots as Ray tasks, one per node, each pulling the signed release
    from the deploy service, running its own scene and recording it into its fleet dataset (the tiny policy stalls,
    the scripted expert takes over). What they record is what the same robots record as local processes."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    step = BucketUrl.parse("hf://buckets/lab/ray-fleet/models/run1/checkpoints/000005")
    client.create_bucket(step)
    client.upload(tiny, step / "pretrained_model")
    key = tmp_path / "keys" / "deploy.key"
    generate_keypair(key)
    service = start_local_deploy_service(tmp_path / "deploy", trusted_keys=(public_path(key),))
    ops = DeployClient(service.url, service.token)

    def robot(where: str, i: int) -> FleetRobot:
        name = f"{where}-{i}"
        return FleetRobot(
            robot_id=name,
            token=ops.register_robot(name, channel="stable", rotate=True),
            deploy_url=service.url,
            endpoint=bucket_server.endpoint,
            storage_token=WRITE_TOKEN,
            task="transfer_cube",
            image_size=SIZE,
            shadow_map=NO_SHADOWS,  # half a CPU frame
            device="cpu",
            first_seed=200_000 + 10 * i,
            episodes=1,
            policy_steps=12,
            stall_steps=6,
            record_to=f"hf://buckets/lab/ray-fleet/datasets/{name}",
            vcodec="h264",
            store=tmp_path / "stores" / name,
            trusted_keys=public_path(key).read_text(),
            rate_hz=math.inf,
        )

    try:
        publish(client, str(step), "run1-5", load_private_key(key), ops, channel="stable", onnx="off")
        # One torch thread, as Ray gives a 1-CPU task: with 2, ACT's sums round otherwise (~1e-7), which can move the
        # expert's re-plan by a step
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        local = run_fleet([robot("local", 1), robot("local", 2)], timeout_s=300)
        on_ray = run_fleet([robot("ray", 1), robot("ray", 2)], timeout_s=300, ray=cluster)
    finally:
        service.stop()
    assert all(r.error is None and r.finished == 1 and r.running == "run1-5" for r in local + on_ray), local + on_ray
    assert {r.node for r in local} == {None} and len({r.node for r in on_ray}) == 2, "not one robot per node"
    assert all(r.bytes_pulled > 0 and r.backend.startswith("torch (cpu)") for r in on_ray), on_ray
    # The robot on the driver's node keeps its store in the driver's folder, the other in its node's cache.
    assert [(tmp_path / "stores" / f"ray-{i}").exists() for i in (1, 2)].count(True) == 1
    caches = {SESSION_CACHE, Path(os.environ["XDG_CACHE_HOME"])}  # the nodes' (from the cluster's start), this test's
    assert len([s for c in caches for s in (c / "robotloop" / "fleet").glob("ray-*-*")]) == 1

    def facts(where: str) -> list[tuple]:
        found = fleet_episodes(client, [f"hf://buckets/lab/ray-fleet/datasets/{where}-{i}" for i in (1, 2)], "run1-5")
        return sorted((f["seed"], f["kind"], f["success"], f["frames"], f["expert_frames"]) for f in found)

    assert facts("ray") == facts("local") and len(facts("ray")) == 2
    assert all(kind == "takeover" for _, kind, *_ in facts("ray"))
    assert not _actor_processes("_ray_robot"), "a robot's Ray worker is still running it"


def test_without_ray_nothing_imports_it(tiny: Path, tmp_path: Path) -> None:
    """`robotloop eval` without --ray: the same command, with Ray never imported."""
    code = (
        "import sys\n"
        "from robotloop.cli import app\n"
        f"args = ['eval', '--policy', {str(tiny)!r}, '--episodes', '1', '--max-steps', '2', '--videos', '0',"
        f" '--output-dir', {str(tmp_path / 'out')!r}]\n"
        "app(args, standalone_mode=False)\n"
        "print('ray imported:', 'ray' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ray imported: False" in done.stdout


def _total_episodes(client: BucketClient, url: BucketUrl) -> int:
    try:
        return json.loads(client.read_range(url / "meta" / "info.json", 0, 1 << 20))["total_episodes"]
    except FileNotFoundError:
        return 0


def test_local_starts_its_own_cluster_with_workers_at_the_drivers_priority(
    cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--ray local` starts a one-node cluster for the command even where RAY_ADDRESS names another (the two-node
    one here), runs its workers at niceness 0 as a process pool's (Ray's default is 15, behind every other process
    of the machine) and stops it after."""
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    with ray_session("local") as ray:
        nice = ray.remote(lambda: os.nice(0))
        assert len(ray.nodes()) == 1, "joined the cluster RAY_ADDRESS names"
        assert ray.get(nice.remote()) == 0
    assert not ray.is_initialized()


def test_a_cluster_refusing_the_drivers_missing_auth_token_is_named_as_such() -> None:
    """`ray start` turns on token authentication while a driver sends its token only with RAY_AUTH_MODE=token: Ray
    then says "Failed to connect", with the refusal buried in its exception chain (as built here, from Ray 2.60's
    own text); robotloop names it and the fix."""
    from robotloop.cluster import _why_unreachable

    refused = RuntimeError("Failed to connect to GCS: RPC error: InvalidAuthToken: token is missing or incorrect")
    error = ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")
    error.__cause__ = refused
    assert "RAY_AUTH_MODE=token" in _why_unreachable(error)
    assert _why_unreachable(ConnectionError("refused")) == "no Ray cluster answers (refused)"
