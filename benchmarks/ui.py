"""Dashboard figures for BENCHMARKS.md: the fleet page with 100 robots and the dataset page with 1,000 episodes
render in under 1 s; an episode's video starts playing in under 1 s after its click.

Run:  MUJOCO_GL=egl .venv/bin/python benchmarks/ui.py [--robots 100] [--episodes 1000] [--screenshots docs]

Everything is real and on localhost: a robotloop bucket server (embedded launcher, temporary root), the deploy
service (`python -m services.deploy`) with `--robots` registered robots that each sent a heartbeat, a LeRobot v3
dataset of `--episodes` episodes (8 frames of 24x32 each, h264, packed into shared files as lerobot packs them)
and the dashboard (`python -m services.ui`), driven by Debian's headless Chromium through Playwright.

- Render: from the navigation's start (`performance.timeOrigin`) to the moment the page's script has put every
  row in the DOM (`window.__robotloop.renderedAt`), so the server's answer, the JSON and the DOM work all count.
  The first load of each page is reported apart (the dashboard opens the dataset then); then the median and the
  slowest of `--repeats` reloads.
- Video: from the click on an episode's row to the first frame of that episode's own segment shown while playing
  (`requestVideoFrameCallback`, the frame's media time inside the episode's segment), for `--clicks` episodes
  spread over the dataset; the first click of a file includes loading its metadata by range requests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from robotloop.capture.episode import Episode
from robotloop.capture.recorder import DatasetSpec, episode_frame
from robotloop.deploy.client import DeployClient
from robotloop.deploy.keys import generate_keypair, load_private_key
from robotloop.deploy.local import start_local_deploy_service
from robotloop.deploy.publish import publish
from robotloop.deploy.runner import make_tiny_checkpoint
from robotloop.service_process import free_port, start_service_process
from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server

OPS, VIEWER = "bench-ops", "bench-viewer"
DATASET = "hf://buckets/bench/ui/datasets/many"
RUN = "hf://buckets/bench/ui/models/run"


def make_dataset(client: BucketClient, episodes: int, staging: Path) -> float:
    """`episodes` tiny episodes written with lerobot's own writer, then uploaded in one batch; seconds taken."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    t0 = time.perf_counter()
    spec = DatasetSpec({"top": (24, 32, 3)}, 14, 14, fps=10, vcodec="h264")
    root = staging / "dataset"
    dataset = LeRobotDataset.create(
        "bench/ui",
        fps=spec.fps,
        features=spec.features(),
        root=root,
        streaming_encoding=True,
        rgb_encoder=RGBEncoderConfig(vcodec=spec.vcodec),
    )
    frames = 8
    for k in range(episodes):
        images = np.full((frames, 24, 32, 3), (40 + 7 * k) % 256, np.uint8)
        state = np.tile(np.linspace(0, 1, frames, dtype=np.float32)[:, None], (1, 14))
        reward = np.linspace(0, 4, frames, dtype=np.float32)
        episode = Episode({"top": images}, state, state, f"task {k % 7}", reward, reward >= (4 if k % 5 else 5))
        for t in range(frames):
            dataset.add_frame(episode_frame(spec, episode, t))
        dataset.save_episode()
    dataset.finalize()
    url = BucketUrl.parse(DATASET)
    client.create_bucket(url)
    client.upload(root, url)
    return time.perf_counter() - t0


def make_fleet(client: BucketClient, deploy_url: str, robots: int, keys: Path) -> None:
    """Two releases (stable, canary) and `robots` robots, each with one heartbeat; a few swaps and rollbacks."""
    generate_keypair(keys / "deploy.key")
    ops = DeployClient(deploy_url, OPS)
    client.create_bucket(BucketUrl.parse(RUN))
    for step, name, channel in ((100, "v1", "stable"), (200, "v2", "canary")):
        url = BucketUrl.parse(f"{RUN}/checkpoints/{step:06d}")
        client.upload(make_tiny_checkpoint(keys / name, seed=step), url / "pretrained_model")
        publish(client, str(url), name, load_private_key(keys / "deploy.key"), ops, channel)
    for i in range(robots):
        robot, channel = f"r{i:03d}", "canary" if i % 10 == 0 else "stable"
        bot = DeployClient(deploy_url, ops.register_robot(robot, channel=channel))
        release = "v2" if channel == "canary" else "v1"
        if i % 25 == 0:
            bot.event(robot, "rollback", "v1", "v2", "health check: mean score 1.2 < 3.4 of v1")
        bot.heartbeat(robot, release, {"control_hz": 49.8, "max_gap_ms": 21.0, "health": {release: 3.6}, "episodes": i})
        bot.close()


def timed_loads(page, url: str, ready: str, repeats: int) -> dict:
    """First load and `repeats` reloads of `url`: ms from navigation start to `ready` (a JS expression)."""
    loads = []
    for _ in range(repeats + 1):
        page.goto(url)
        page.wait_for_function(
            f"() => window.__robotloop && window.__robotloop.renderedAt && ({ready})", timeout=60_000
        )
        loads.append(page.evaluate("() => window.__robotloop.renderedAt"))
    rest = loads[1:]
    return {"first_ms": round(loads[0]), "median_ms": round(statistics.median(rest)), "max_ms": round(max(rest))}


def video_starts(page, clicks: int, episodes: int) -> dict:
    """ms from a click on an episode to the first frame of its own segment shown while playing."""
    starts = []
    for k in np.linspace(0, episodes - 1, clicks).astype(int).tolist():
        page.wait_for_function("() => document.getElementById('video').paused || !document.getElementById('video').src")
        page.locator(f'#episodes tr[data-episode="{k}"]').click()
        page.wait_for_function("() => window.__robotloop.playingAt !== null", timeout=30_000)
        starts.append(page.evaluate("() => window.__robotloop.playingAt - window.__robotloop.clickedAt"))
        page.wait_for_function("() => document.getElementById('video').paused", timeout=30_000)
    return {
        "clicks": len(starts),
        "median_ms": round(statistics.median(starts)),
        "max_ms": round(max(starts)),
        "first_ms": round(starts[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--robots", type=int, default=100)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clicks", type=int, default=10)
    parser.add_argument("--screenshots", type=Path, default=None, help="Write fleet and dataset screenshots here.")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    base = Path(tempfile.mkdtemp(prefix="robotloop-bench-ui-"))
    server = ensure_embedded_server(base / "buckets")
    client = BucketClient(server.endpoint, server.token)
    deploy = start_local_deploy_service(base / "deploy", OPS)
    results: dict = {"machine": f"{platform.node()}: {os.cpu_count()} cores", "robots": args.robots}
    try:
        make_fleet(client, deploy.url, args.robots, base / "keys")
        results["dataset_build_s"] = round(make_dataset(client, args.episodes, base / "stage"), 1)
        results["episodes"] = args.episodes
        tokens = base / "ui.tokens"
        tokens.write_text(f"{VIEWER} read *\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        os.environ.update(
            {
                "ROBOTLOOP_CONFIG": os.devnull,
                "ROBOTLOOP_STORAGE__ENDPOINT": server.endpoint,
                "ROBOTLOOP_STORAGE__TOKEN": server.token,
                "ROBOTLOOP_DEPLOY__URL": deploy.url,
                "ROBOTLOOP_DEPLOY__TOKEN": OPS,
                "XDG_CACHE_HOME": str(base / "cache"),
            }
        )

        def answers() -> bool:
            try:
                return httpx.get(f"{url}/api/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        args_ui = ["--tokens", str(tokens), "--port", str(port), "--namespace", "bench"]
        ui = start_service_process("services.ui", args_ui, base / "ui.log", answers, 60)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
                page.goto(f"{url}/fleet")
                page.fill("#token", VIEWER)
                page.click("#login button[type=submit]")
                page.wait_for_selector("#robots tbody tr")
                rows = f"document.querySelectorAll('#robots tbody tr').length === {args.robots}"
                results["fleet"] = timed_loads(page, f"{url}/fleet", rows, args.repeats)
                if args.screenshots:
                    args.screenshots.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=args.screenshots / "ui-fleet.png")
                episodes = f"document.querySelectorAll('#episodes tbody tr').length === {args.episodes}"
                results["dataset"] = timed_loads(page, f"{url}/datasets?url={DATASET}", episodes, args.repeats)
                results["video_start"] = video_starts(page, args.clicks, args.episodes)
                if args.screenshots:
                    page.locator('#episodes tr[data-episode="3"]').click()
                    page.wait_for_function("() => window.__robotloop.plottedEpisode === 3")
                    page.wait_for_timeout(300)
                    page.screenshot(path=args.screenshots / "ui-dataset.png")
                browser.close()
        finally:
            ui.terminate()
            ui.wait(10)
    finally:
        deploy.stop()
        stop_embedded_server(base / "buckets")
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
