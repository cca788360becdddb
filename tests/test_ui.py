"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright's Python API, against real
services on 127.0.0.1 (bucket server, deploy service, training service, the dashboard itself as
`python -m services.ui`) and a sim robot (MuJoCo, 48x64) that pulls and runs releases.

Checked: a page without a session asks for a token and shows nothing; the fleet page shows the robot running the
release it pulled and a rollback with its reason; promote and roll back need a write session, the CSRF header and
the same origin; markup from robots, datasets and reports stays text; an episode's video plays its own time
segment of a shared mp4 (its first frame is the episode's, its `currentTime` advances, it stops at its end); a
loop report uploaded beside its run (`upload_report`) shows on its release's page, with its figures and rollout
video served by name only, and a broken or missing one is an unknown item; a training job's loss curve grows while
the page is open; a fleet dataset's episode shows its robot, release, kind and expert frames, and its takeovers
marked on its timeline; a rounds report shows its table of rounds; a robot's heartbeat shows its recorded and
dropped episodes and its last recording error. Each test writes screenshots under its tmp folder.

Skipped, saying why, when Chromium (`apt-get install chromium`) or Playwright (the `dev` extra) is missing.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest

from robotloop.capture import DatasetRecorder, DatasetSpec
from robotloop.capture.episode import Episode
from robotloop.config import RobotSettings
from robotloop.deploy.client import DeployClient, DeployError
from robotloop.deploy.keys import generate_keypair, load_private_key, load_public_keys, public_path
from robotloop.deploy.local import LocalDeployService, start_local_deploy_service
from robotloop.errors import RobotloopError
from robotloop.service_process import free_port, start_service_process
from robotloop.storage import BucketClient, BucketUrl
from robotloop.train.client import TrainerClient

from .conftest import WRITE_TOKEN
from .test_train_service import DATASET as TRAIN_DATASET
from .test_train_service import READER as TRAINER_READER
from .test_train_service import WRITER as TRAINER_WRITER
from .test_train_service import job as job_spec
from .test_train_service import trainer  # noqa: F401 - the training service fixture, with its 2-episode dataset

CHROMIUM = os.environ.get("ROBOTLOOP_CHROMIUM", "/usr/bin/chromium")
try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # the dev extra is not installed
    sync_playwright = None

pytestmark = pytest.mark.skipif(
    sync_playwright is None or not Path(CHROMIUM).exists(),
    reason=f"browser tests need Playwright (pip install -e '.[dev]') and Chromium at {CHROMIUM} "
    "(apt-get install chromium; scripts/system-deps installs it)",
)

UI_WRITE, UI_READ, UI_SCOPED = "rl_ui_write", "rl_ui_read", "rl_ui_lab_only"
OPS = "rl_ui_ops"
DATASET = "hf://buckets/lab/ui/datasets/colours"
FLEET_DATASET = "hf://buckets/lab/ui/datasets/fleet-cube"  # fleet_views's: two episodes of two robots
RUN = "hf://buckets/lab/ui/models/ui-run"  # the loop report of _reports names this run
LIVE_RUN = "hf://buckets/lab/trainsvc/models/ui-live"  # the loss curve's training job; fleet_views's rounds report
XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 1">'
FPS, FRAMES = 10, 30  # 3 s per episode: long enough to watch it play and stop
IMAGE = (48, 64)


def colour(k: int) -> int:
    return 40 + 70 * k  # episode k's frames are all this grey: a frame tells which episode it belongs to


@dataclass
class Ui:
    url: str
    deploy: LocalDeployService
    bucket: BucketClient
    reports: Path
    trainer_url: str
    key: Path

    def ops(self) -> DeployClient:
        return DeployClient(self.deploy.url, OPS)

    def call(self, method: str, path: str, **kw) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", timeout=30, **kw)


def _record_colours(bucket: BucketClient, staging: Path) -> None:
    """Three episodes in one shared mp4, each a different grey, with markup in the second one's task."""
    spec = DatasetSpec({"top": (24, 32, 3)}, 14, 14, fps=FPS, vcodec="h264")
    recorder = DatasetRecorder(bucket, BucketUrl.parse(DATASET), spec, staging=staging)
    for k in range(3):
        images = np.full((FRAMES, 24, 32, 3), colour(k), np.uint8)
        state = np.tile(np.linspace(0, 1, FRAMES, dtype=np.float32)[:, None], (1, 14)) * (k + 1)
        reward = np.linspace(0, 4, FRAMES, dtype=np.float32)
        task = f"stack {XSS}" if k == 1 else "stack the cubes"
        solved = reward >= (4 if k != 2 else 5)  # episode 2 never succeeds
        recorder.commit(Episode({"top": images}, state, np.full((FRAMES, 14), k, np.float32), task, reward, solved))


def _reports(base: Path, video: Path) -> Path:
    """A loop report with markup and a figure, and an evaluation of release ui-v1 with one rollout video."""
    loop, evaluation = base / "loop", base / "eval" / "ui-v1"
    (evaluation / "videos").mkdir(parents=True)
    loop.mkdir(parents=True)
    (loop / "report.md").write_text(
        f"# robotloop loop: ui-run\n\n{XSS}\n\n| stage | s |\n|---|---|\n| train | 1.5 |\n\n![loss](loss.png)\n"
    )
    settings = {"run": "ui-run", "bucket": "hf://buckets/lab/ui"}  # LoopSettings.run_url: RUN
    (loop / "report.json").write_text(json.dumps({"settings": settings, "release": "ui-v1"}))
    (loop / "notes.txt").write_text("not a figure")
    (loop / "loss.png").write_bytes(_png())
    shutil.copy(video, evaluation / "videos" / "episode_0.mp4")
    episodes = [
        {"index": i, "seed": i, "success": i < 3, "max_reward": 4.0, "sum_reward": 1.0, "steps": 10, "wall_s": 1.0}
        for i in range(4)
    ]
    episodes[0]["video"] = str(evaluation / "videos" / "episode_0.mp4")
    summary = {
        "n_episodes": 4,
        "success_rate": 0.75,
        "success_ci95": [0.3006, 0.9544],
        "mean_max_reward": 4.0,
        "failures_by_stage": {"cube lifted": 1},
    }
    (evaluation / "eval_report.json").write_text(
        json.dumps(
            {"policy": "/x", "task": "transfer_cube", "checkpoint": "ui-v1", "episodes": episodes, "summary": summary}
        )
    )
    return base


def _report_id(ui: Ui) -> str:
    """The dashboard's id of the loop report `_reports` writes (a hash of its folder)."""
    from robotloop.ui.runs import report_id

    return report_id((ui.reports / "loop").resolve())


def _board(ui: Ui, reports: list[Path]):
    """A dashboard in this process over the same services as `ui`'s."""
    from robotloop.config import load_settings
    from robotloop.ui import Dashboard

    services = {
        "storage": {"endpoint": ui.bucket.endpoint, "token": WRITE_TOKEN},
        "deploy": {"url": ui.deploy.url, "token": OPS},
        "trainer": {"url": ui.trainer_url, "token": TRAINER_READER},
    }
    return Dashboard(load_settings(services), reports=reports)


def test_a_training_run_finds_its_loop_report(ui):
    runs = _board(ui, [ui.reports]).runs
    assert [r["id"] for r in runs.reports(RUN)] == [r["id"] for r in runs.reports(RUN + "/")] == [_report_id(ui)]
    assert runs.reports(RUN + "-2") == [] and runs.reports("hf://buckets/lab/ui/models") == []
    cookies = ui.call("POST", "/api/session", json={"token": UI_READ}, headers={"x-robotloop-ui": "1"}).cookies
    found = ui.call("GET", "/api/reports", params={"run": RUN}, cookies=cookies).json()
    assert [r["run_url"] for r in found["reports"]] == [RUN] and found["evaluations"] == []
    assert ui.call("GET", "/api/reports", params={"run": RUN}).status_code == 401


def _png() -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 1))
    fig.subplots().plot([0, 1], [1, 0])
    png = io.BytesIO()  # in memory: nothing left behind in /tmp
    fig.savefig(png, format="png", dpi=40)
    return png.getvalue()


@pytest.fixture(scope="module")
def ui(bucket_server, trainer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:  # noqa: F811
    base = tmp_path_factory.mktemp("ui")
    bucket = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    bucket.create_bucket(BucketUrl.parse(DATASET))
    if bucket.ls(BucketUrl.parse(DATASET)):  # another module's instance (the fuzz tests') recorded it before
        bucket.delete(BucketUrl.parse(DATASET), recursive=True)
    _record_colours(bucket, base / "stage")
    deploy = start_local_deploy_service(base / "deploy", OPS)
    reports = _reports(base / "reports", next((base / "stage").rglob("*.mp4")))
    generate_keypair(base / "keys" / "deploy.key")
    tokens = base / "ui.tokens"
    tokens.write_text(f"{UI_WRITE} write *\n{UI_READ} read *\n{UI_SCOPED} read lab\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROBOTLOOP_", "HF_"))}
    env.update(
        {
            "ROBOTLOOP_CONFIG": os.devnull,
            "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint,
            "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN,
            "ROBOTLOOP_DEPLOY__URL": deploy.url,
            "ROBOTLOOP_DEPLOY__TOKEN": OPS,
            "ROBOTLOOP_TRAINER__URL": trainer.endpoint,
            "ROBOTLOOP_TRAINER__TOKEN": TRAINER_READER,
            "XDG_CACHE_HOME": str(base / "cache"),
            "HF_HOME": str(base / "hf"),
        }
    )
    url = f"http://127.0.0.1:{port}"
    args = ["--tokens", str(tokens), "--port", str(port), "--reports", str(reports), "--namespace", "lab"]

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/api/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    old = dict(os.environ)
    os.environ.update(env)  # start_service_process passes the environment on
    try:
        proc = start_service_process("services.ui", args, base / "ui.log", answers, 60)
    finally:
        os.environ.clear()
        os.environ.update(old)
    yield Ui(url, deploy, bucket, reports, trainer.endpoint, base / "keys" / "deploy.key")
    proc.terminate()
    proc.wait(10)
    deploy.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        # --no-sandbox: the suite runs as root in containers, where Chromium's sandbox cannot start.
        launched = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--autoplay-policy=no-user-gesture-required"]
        )
        yield launched
        launched.close()


def signed_in(browser: Browser, ui: Ui, token: str = UI_WRITE) -> Page:
    """A fresh browser context, signed in through the page's own form."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(f"{ui.url}/fleet")
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    expect(page.locator("#main")).to_be_visible()
    return page


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.1)


# -- tokens ----------------------------------------------------------------------------------------------------
def test_a_page_without_a_token_asks_for_one_and_shows_nothing(ui, browser, tmp_path):
    page = browser.new_page()
    for path in ("/fleet", "/datasets", "/runs/x", "/reports"):
        page.goto(f"{ui.url}{path}")
        expect(page.locator("#login")).to_be_visible()
        expect(page.locator("#main")).to_be_hidden()
    page.screenshot(path=tmp_path / "login.png")
    for path in (
        "/api/fleet",
        "/api/runs",
        f"/api/dataset?url={DATASET}",
        "/api/reports",
        f"/media/bucket?url={DATASET}/x.mp4",
    ):
        assert ui.call("GET", path).status_code == 401, path
    page.fill("#token", "not-a-token")
    page.click("#login button[type=submit]")
    expect(page.locator("#login-error")).to_have_text("unknown token")
    page.fill("#token", UI_SCOPED)  # a namespace-scoped line: the dashboard shows every namespace
    page.click("#login button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("'<token> <read|write> *' lines")
    page.fill("#token", UI_READ)
    page.click("#login button[type=submit]")
    expect(page.locator("#who")).to_have_text("signed in (read-only)")
    cookie = next(c for c in page.context.cookies() if c["name"] == "robotloop_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and UI_READ not in cookie["value"]
    assert page.evaluate("() => sessionStorage.length + localStorage.length") == 0  # the token is not kept
    page.click("#logout")
    expect(page.locator("#login")).to_be_visible()
    assert ui.call("GET", "/api/fleet", cookies={"robotloop_ui": cookie["value"]}).status_code == 401
    page.context.close()


def test_the_dashboard_serves_its_schema_and_names_the_settings_it_lacks(ui, tmp_path):
    schema = ui.call("GET", "/openapi.json")
    assert schema.status_code == 200 and schema.json()["info"]["title"] == "robotloop dashboard"
    from robotloop.train.client import TrainerClient

    with pytest.raises(RobotloopError) as refused:  # what the runs page shows without a trainer token
        TrainerClient("http://127.0.0.1:9", None).jobs()
    assert "ROBOTLOOP_TRAINER__TOKEN" in str(refused.value) and "--service-token" not in str(refused.value)


def test_writes_need_a_write_token_the_header_and_the_same_origin(ui):
    ops = ui.ops()
    ops.register_robot("csrf-bot", channel="csrf")
    with pytest.raises(DeployError, match="bad robot name"):  # a robot id cannot carry markup at all
        ops.register_robot("<script>", channel="csrf")
    guard = {"x-robotloop-ui": "1"}
    read = ui.call("POST", "/api/session", json={"token": UI_READ}, headers=guard).cookies["robotloop_ui"]
    write = ui.call("POST", "/api/session", json={"token": UI_WRITE}, headers=guard).cookies["robotloop_ui"]
    assert ui.call("POST", "/api/session", json={"token": UI_WRITE}).status_code == 403  # login CSRF too
    body = {"reason": "test"}
    path = "/api/robots/csrf-bot/rollback"
    refused = ui.call("POST", path, json=body, headers=guard, cookies={"robotloop_ui": read})
    assert refused.status_code == 403 and "read-only" in refused.json()["error"]
    assert "header" in ui.call("POST", path, json=body, cookies={"robotloop_ui": write}).json()["error"]
    evil = ui.call(
        "POST", path, json=body, headers={**guard, "origin": "http://evil.example"}, cookies={"robotloop_ui": write}
    )
    assert evil.status_code == 403 and "origin" in evil.json()["error"]
    cross = ui.call(
        "POST", path, json=body, headers={**guard, "sec-fetch-site": "cross-site"}, cookies={"robotloop_ui": write}
    )
    assert cross.status_code == 403
    # Allowed through: the deploy service's own answer comes back (the robot never ran anything to go back to).
    passed = ui.call("POST", path, json=body, headers={**guard, "origin": ui.url}, cookies={"robotloop_ui": write})
    assert passed.status_code == 404 and "roll back" in passed.json()["error"]


# -- fleet -----------------------------------------------------------------------------------------------------
@pytest.fixture
def robot(ui, tmp_path_factory: pytest.TempPathFactory):
    """Robot `ui-bot` on channel `ui`: ALOHA TransferCube at 48x64, 15-step episodes, in a thread (stopped after
    its test: the 2-core suite machine has no cycles for a robot nobody looks at)."""
    from robotloop.deploy.envs import SimControlEnv
    from robotloop.deploy.fetch import XetFetcher
    from robotloop.deploy.runtime import RobotRuntime
    from robotloop.deploy.store import ReleaseStore

    base = tmp_path_factory.mktemp("robot")
    token = ui.ops().register_robot("ui-bot", channel="ui")
    options = RobotSettings(robot_id="ui-bot", poll_wait_s=5, heartbeat_s=0.5, health_window=2)
    made: list = []

    def control() -> None:  # MuJoCo's EGL context belongs to the thread that made it
        env = SimControlEnv("transfer_cube", IMAGE, episode_steps=15)
        fetcher = lambda bucket: XetFetcher(ui.bucket.endpoint, WRITE_TOKEN, bucket)  # noqa: E731
        trusted = load_public_keys([public_path(ui.key)])
        client = DeployClient(ui.deploy.url, token)
        made.append(RobotRuntime(env, client, ReleaseStore(base / "store"), trusted, options, fetcher))
        try:
            made[0].run()
        finally:
            env.close()

    thread = threading.Thread(target=control, daemon=True)
    thread.start()
    _wait(lambda: made, 30, "the robot to start")
    yield made[0]
    made[0].stop()
    thread.join(10)


def _publish(
    ui: Ui, name: str, ckpt: Path, step: int, lineage: dict | None = None, channel: str | None = "ui", run: str = RUN
):
    from robotloop.deploy.publish import publish

    url = BucketUrl.parse(f"{run}/checkpoints/{step:06d}")
    ui.bucket.upload(ckpt, url / "pretrained_model")
    if lineage is not None:
        path = ui.reports.parent / f"lineage-{step}.json"
        path.write_text(json.dumps(lineage))
        ui.bucket.upload(path, url / "lineage.json")
    # Without its ONNX export (~8 s each on 2 cores): the pages show releases whatever they hold.
    return publish(ui.bucket, str(url), name, load_private_key(ui.key), ui.ops(), channel, onnx="off")


def test_fleet_shows_the_robot_running_its_release_and_a_rollback_with_its_reason(ui, robot, browser, tmp_path):
    from robotloop.deploy.runner import make_tiny_checkpoint
    from robotloop.fleet import RecordingStats
    from robotloop.train.data.catalog import DatasetSource

    source = DatasetSource(ui.bucket, BucketUrl.parse(DATASET))
    lineage = {"step": 100, "datasets": [DATASET], "episodes": [e.lineage() for e in source.episodes]}
    v1 = make_tiny_checkpoint(tmp_path / "v1", image_size=IMAGE)
    v2 = make_tiny_checkpoint(tmp_path / "v2", image_size=IMAGE, seed=1)
    _publish(ui, "ui-v1", v1, 100, lineage)
    page = signed_in(browser, ui)
    running = page.locator('#robots tr[data-robot="ui-bot"]')
    expect(running).to_have_attribute("data-running", "ui-v1", timeout=60_000)  # pulled, verified, running
    expect(running.locator("td").nth(4)).not_to_have_text("—")  # its heartbeat's control rate
    _publish(ui, "ui-v2", v2, 200)
    expect(running).to_have_attribute("data-running", "ui-v2", timeout=30_000)
    expect(page.locator("#events tbody tr.event-swap").first).to_contain_text("ui-v2")
    page.screenshot(path=tmp_path / "fleet-v2.png", full_page=True)

    # Roll channel ui back from the page: a confirmation, a reason with markup in it, then the robot goes back.
    channel = page.locator('#channels tr[data-channel="ui"]')
    expect(channel.locator("td").nth(1)).to_have_text("ui-v2")
    channel.get_by_role("button", name="Roll back").click()
    expect(page.locator("#confirm")).to_be_visible()
    expect(page.locator("#confirm-text")).to_have_text("Roll channel ui back to its previous release?")
    page.fill("#confirm-reason", f"gripper slips {XSS}")
    page.click("#confirm-ok")
    rollback = page.locator("#events tbody tr.event-rollback").first
    expect(rollback).to_contain_text(f"gripper slips {XSS}")  # the reason, as text
    expect(running).to_have_attribute("data-running", "ui-v1", timeout=30_000)
    assert page.evaluate("() => window.__pwned") is None
    event = ui.ops().history(channel="ui", limit=5)[0]
    assert event["kind"] == "rollback" and event["detail"].startswith("gripper slips")
    page.screenshot(path=tmp_path / "fleet-rollback.png", full_page=True)

    # A robot's own heartbeat figures with markup in them are shown as text too; this one records its episodes
    # (robotloop.fleet's recorder): its recorded and dropped episodes and its last recording error.
    stats = RecordingStats(multiprocessing.get_context("spawn"))
    for outcome in ("recorded", "recorded", "dropped"):
        stats.add(outcome, f"StorageError: {XSS}" if outcome == "dropped" else None)
    bot = DeployClient(ui.deploy.url, ui.ops().register_robot("xss-bot", channel="other"))
    bot.heartbeat("xss-bot", None, {"control_hz": 49.5, "health": {XSS: 1.0}, "recording": stats.as_dict()})
    cells = page.locator('#robots tr[data-robot="xss-bot"] td')
    expect(page.locator('#robots tr[data-robot="xss-bot"]')).to_contain_text(XSS)
    expect(page.locator("#robots thead th").nth(8)).to_have_text("recorded")
    expect(cells.nth(8)).to_have_text("2")
    expect(cells.nth(9)).to_have_text("1")
    expect(cells.nth(10)).to_have_text(f"StorageError: {XSS}")
    expect(running.locator("td").nth(8)).to_have_text("—")  # ui-bot records nothing
    assert page.evaluate("() => window.__pwned") is None and page.locator("#robots img").count() == 0

    # The release page: lineage down to the episodes and their Xet hashes, the evaluation, and links along it.
    page.goto(f"{ui.url}/releases/ui-v1")
    expect(page.locator("#evaluations")).to_contain_text("success 75.0% over 4 episodes (95% interval 30.1% to 95.4%)")
    expect(page.locator("#evaluations")).to_contain_text("Failed episodes got as far as: cube lifted 1")
    expect(page.locator("#evaluations video")).to_have_count(1)
    expect(page.locator("#lineage tbody tr")).to_have_count(3)
    expect(page.locator("#lineage code").first).to_have_attribute("title", source.episodes[0].data.xet_hash)
    expect(page.locator("#release-facts")).to_contain_text(RUN)  # the training run, and its loop report
    expect(page.locator("#release-facts").get_by_role("link", name="ui-run", exact=True)).to_have_attribute(
        "href", f"/reports/{_report_id(ui)}"
    )
    page.screenshot(path=tmp_path / "release.png", full_page=True)
    page.locator("#lineage tbody tr").nth(1).get_by_role("link", name="episode 1").click()
    expect(page.locator("#player-title")).to_contain_text("Episode 1", timeout=20_000)
    page.goto(f"{ui.url}/releases")
    expect(page.locator("#channel-histories")).to_contain_text("gripper slips")
    page.context.close()


# -- datasets --------------------------------------------------------------------------------------------------
def test_an_episode_plays_its_own_segment_of_the_shared_video(ui, fleet_views, browser, tmp_path):
    page = signed_in(browser, ui, UI_READ)
    page.goto(f"{ui.url}/datasets?bucket=hf://buckets/lab/ui")
    expect(page.locator("#buckets")).to_contain_text("hf://buckets/lab/ui")  # --namespace lab
    page.get_by_role("link", name=DATASET).click()
    rows = page.locator("#episodes tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(1)).to_contain_text(f"stack {XSS}")  # markup in a task is text
    assert [rows.nth(k).locator("td").nth(3).inner_text() for k in range(3)] == ["yes", "yes", "no"]
    # The first frame shown once it plays, grabbed when the browser presents it (at the 'playing' event itself the
    # frame may not be decoded yet: a loaded machine drew it black once): its grey says which episode it is.
    page.evaluate(
        """() => { const v = document.getElementById('video');
        v.addEventListener('playing', () => v.requestVideoFrameCallback(() => {
          const c = document.createElement('canvas'); c.width = 32; c.height = 24;
          const g = c.getContext('2d'); g.drawImage(v, 0, 0, 32, 24);
          window.__first = {t: v.currentTime, grey: g.getImageData(16, 12, 1, 1).data[0]}; }), {once: true}); }"""
    )
    rows.nth(1).click()
    page.wait_for_function("() => window.__first !== undefined", timeout=10_000)
    first = page.evaluate("() => window.__first")
    assert 3.0 <= first["t"] < 3.2, first  # episode 1 starts 3 s into the shared file
    assert abs(first["grey"] - colour(1)) < 12, first  # ... and that frame is episode 1's
    page.wait_for_function("() => document.getElementById('video').currentTime > 3.5")  # it plays
    page.screenshot(path=tmp_path / "dataset.png", full_page=True)
    page.wait_for_function("() => document.getElementById('video').paused", timeout=10_000)  # and stops at its end
    end = page.evaluate("() => document.getElementById('video').currentTime")
    assert 5.7 <= end <= 6.0, end
    page.wait_for_function("() => window.__robotloop.plottedEpisode === 1")
    expect(page.locator("#state-plot canvas")).to_have_count(1)
    assert page.evaluate("() => window.__pwned") is None
    # The video route answers byte ranges, and refuses what is not a dataset's mp4.
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    video = page.evaluate("() => document.getElementById('video').src")
    part = ui.call("GET", video.removeprefix(ui.url), headers={"range": "bytes=0-99"}, cookies=cookies)
    assert (
        part.status_code == 206 and len(part.content) == 100 and part.headers["content-range"].startswith("bytes 0-99/")
    )
    whole = ui.call("GET", video.removeprefix(ui.url), cookies=cookies)  # no Range: the whole file, streamed
    assert whole.status_code == 200 and whole.content[:100] == part.content
    assert len(whole.content) == int(part.headers["content-range"].rsplit("/", 1)[1])
    past = ui.call(
        "GET", video.removeprefix(ui.url), headers={"range": f"bytes={len(whole.content)}-"}, cookies=cookies
    )
    assert past.status_code == 416
    assert ui.call("GET", f"/media/bucket?url={DATASET}/meta/info.json", cookies=cookies).status_code == 400

    # A fleet dataset: each episode's robot, release, kind and expert frames, its takeovers on its timeline.
    shown = ui.call("GET", "/api/dataset", params={"url": FLEET_DATASET}, cookies=cookies).json()
    demos = ui.call("GET", "/api/dataset", params={"url": DATASET}, cookies=cookies).json()
    assert shown["role"] == "fleet" and demos["role"] == "demo" and "takeovers" not in demos["episodes"][0]
    assert (shown["shadow_maps"], demos["shadow_maps"]) == ({"observation.images.top": 2048}, {})
    assert [(e["fleet"]["robot"], e["fleet"]["kind"], e["success"], e["takeovers"]) for e in shown["episodes"]] == [
        ("fleet-r1", "takeover", True, [[TAKEOVER.start, TAKEOVER.stop]]),
        ("fleet-r2", "autonomous", False, []),
    ]
    page.goto(f"{ui.url}/datasets?url={quote(FLEET_DATASET)}&episode=0")
    rows = page.locator("#episodes tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#dataset-facts")).to_contain_text("8 expert frames in 1 takeovers, robots fleet-r1, fleet-r2")
    expect(page.locator("#dataset-facts")).to_contain_text(
        "filmed with 2048-texel shadow maps (observation.images.top)"
    )
    expect(page.locator("#episodes thead th")).to_have_text(
        ["episode", "frames", "task", "success", "robot", "release", "kind", "expert frames", "takeovers"]
    )
    expect(rows.nth(0).locator("td")).to_have_text(
        ["episode 0", "20", "transfer the cube", "yes", "fleet-r1", "ui-v1", "takeover", "8", "1"]
    )
    # Frames 5 to 12 of 20 taken over: a mark from 25% of the timeline's width, 40% of it wide.
    mark = page.locator("#timeline .takeover")
    expect(mark).to_have_count(1)
    expect(mark).to_have_attribute("data-start", "5")
    bar, box = page.locator("#timeline").bounding_box(), mark.bounding_box()
    assert abs((box["x"] - bar["x"]) / bar["width"] - 0.25) < 0.01 and abs(box["width"] / bar["width"] - 0.4) < 0.01
    expect(page.locator("#takeovers")).to_have_text("Takeovers (the expert drove): frames 5–12 (0.50 s to 1.30 s)")
    page.evaluate("() => { const v = document.getElementById('video'); v.pause(); v.currentTime = 0; }")
    mark.click()  # plays from the takeover's first frame
    page.wait_for_function(
        "() => { const v = document.getElementById('video'); return !v.paused && v.currentTime >= 0.5; }"
    )
    page.screenshot(path=tmp_path / "fleet-dataset.png", full_page=True)
    rows.nth(1).click()
    expect(page.locator("#takeovers")).to_have_text("No takeover: the policy drove every frame.")
    expect(page.locator("#timeline .takeover")).to_have_count(0)
    page.context.close()


TAKEOVER = range(5, 13)  # fleet-r1's episode: the expert drove frames 5 to 12


def _record_fleet(bucket: BucketClient, staging: Path) -> None:
    """A fleet dataset as robots' recorders commit it (`DatasetSpec(fleet=True)`: frames with `intervention` and
    `policy_action`, a facts line per episode; here through the capture path, in this process): fleet-r1's episode,
    taken over at TAKEOVER, then solved; fleet-r2's, autonomous and failed."""
    from robotloop.capture.recorder import episode_frame
    from robotloop.fleet import EpisodeFacts

    spec = DatasetSpec({"top": (24, 32, 3)}, 14, 14, fps=FPS, vcodec="h264", fleet=True, shadow_map=2048)
    recorder = DatasetRecorder(bucket, BucketUrl.parse(FLEET_DATASET), spec, staging=staging)
    n, task = 20, "transfer the cube"
    for k, (robot, expert) in enumerate((("fleet-r1", TAKEOVER), ("fleet-r2", range(0)))):
        intervention = np.isin(np.arange(n), list(expert))
        reward = np.linspace(0, 4 if k == 0 else 2, n, dtype=np.float32)
        action = np.zeros((n, 14), np.float32)
        images = {"top": np.full((n, 24, 32, 3), colour(k), np.uint8)}
        episode = Episode(images, action.copy(), action, task, reward, reward >= 4, intervention, action + 1)
        live = recorder.begin(task)
        live.add_frames([episode_frame(spec, episode, t) for t in range(n)])
        kind = "takeover" if intervention.any() else "autonomous"
        outcome = {"success": k == 0, "max_reward": float(reward.max()), "frames": n, "kind": kind}
        facts = {**asdict(EpisodeFacts(robot, "ui-v1", task, seed=100 + k)), **outcome}
        live.commit(facts={**facts, "expert_frames": int(intervention.sum())})


def _write_rounds_report(folder: Path) -> None:
    """A rounds report as `robotloop rounds` writes it (`write_rounds_report`): round 0 and one round through the
    fleet, promoted, with the same-expert-frames baseline beside it."""
    from robotloop.deploy.evaluate import Paired
    from robotloop.loop.pipeline import LoopReport, LoopSettings
    from robotloop.rounds.report import write_rounds_report
    from robotloop.rounds.run import Baseline, RoundResult, RoundSettings, RoundsReport

    bucket, run = LIVE_RUN.split("/models/")
    settings = LoopSettings(bucket=bucket, run=run, report_dir=folder)
    loop = LoopReport(settings, {"record": 1.0, "train": 2.0}, episodes=4)
    loop.release, loop.robot_running_after_s = "ui-r0", 1.5
    rounds = [
        RoundResult(0, "ui-r0", True, 0.25, (0.1, 0.5), 8, expert_frames=1600, minutes=3.5),
        RoundResult(
            1,
            "ui-r1",
            True,
            0.5,
            (0.25, 0.75),
            8,
            expert_frames=400,
            takeover_frames=100,
            near_frames=300,
            fleet_episodes=4,
            fleet_failures=3,
            takeovers=3,
            branches=2,
            minutes=2.5,
            gain_per_1000_expert_frames=0.625,
            versus_stable=Paired(2, 0, 0.5),
            baseline=Baseline(
                5,
                400,
                0.375,
                (0.14, 0.69),
                minutes=1.5,
                versus_stable=Paired(2, 1, 1.0),
                round_versus=Paired(3, 2, 1.0),
            ),
        ),
    ]
    report = RoundsReport(loop, RoundSettings(baseline=True), rounds, stable="ui-r1")
    write_rounds_report(report, folder)


@pytest.fixture(scope="module")
def fleet_views(ui, tmp_path_factory: pytest.TempPathFactory) -> str:
    """FLEET_DATASET in the bucket and a rounds report in the dashboard's report folder; the report's id."""
    from robotloop.ui.runs import report_id

    if ui.bucket.ls(BucketUrl.parse(FLEET_DATASET)):  # another module's instance recorded it before
        ui.bucket.delete(BucketUrl.parse(FLEET_DATASET), recursive=True)
    _record_fleet(ui.bucket, tmp_path_factory.mktemp("fleet-stage"))
    _write_rounds_report(ui.reports / "rounds")
    return report_id((ui.reports / "rounds").resolve())


def test_fleet_figures_from_a_robot_or_a_report_that_are_not_what_they_should_be_show_as_nothing():
    """What pages get from a facts line, a report.json or a heartbeat that is torn or of the wrong types (robots
    write their own heartbeats and facts), and takeovers at an episode's edges (the pages show the good ones)."""
    from robotloop.ui.datasets import fleet_facts, takeover_segments
    from robotloop.ui.fleet import recording_row
    from robotloop.ui.runs import evaluation_row, rounds_rows

    assert takeover_segments([]) == takeover_segments([False] * 3) == []
    assert takeover_segments([True, False, True, True]) == [(0, 1), (2, 4)]  # a single frame; one to the end
    lines = [
        '{"episode_index": 4, "robot_id": "r2"',  # torn
        json.dumps({"episode_index": "5", "robot_id": "r3"}),  # no integer index
        json.dumps({"episode_index": True, "robot_id": "r4"}),
        json.dumps({"episode_index": 6, "robot_id": {"nested": [1]}, "seed": None}),
        "[1, 2]",
    ]
    facts = fleet_facts("\n".join(lines))
    assert list(facts) == [6] and facts[6]["robot"] == '{"nested": [1]}' and facts[6]["kind"] is None  # as text
    assert rounds_rows({}) == rounds_rows({"rounds": "many"}) == rounds_rows({"rounds": None}) == []
    broken = {"round": True, "release": ["x"], "promoted": "yes", "success_rate": float("nan"), "ci95": [0.1]}
    (row,) = rounds_rows({"rounds": [{**broken, "expert_frames": 10**400, "baseline": "none"}, "not a round", 7]})
    assert [row[k] for k in ("round", "release", "promoted", "decision", "success_rate", "ci95", "baseline")] == [
        None
    ] * 7
    assert row["expert_frames"] == 10**400  # a number, however large
    odd_split = {"round": 1, "takeover_frames": "12", "redemo_frames": float("nan"), "near_frames": 30}
    assert rounds_rows({"rounds": [odd_split]})[0]["expert_split"] == {"near misses": 30}  # the figures it can show
    for odd in ("2 of 3", {"won": 2, "lost": "1", "p_value": 0.5}, {"won": 2, "lost": 1}):
        (row,) = rounds_rows({"rounds": [{"round": 1, "versus_stable": odd}]})
        assert row["versus_stable"] is None, odd
    json.dumps(row, allow_nan=False)
    for stages, shown in (("many", {}), ([1], {}), ({"both lifted": "3", "no stage": 2, "x": True}, {"no stage": 2})):
        assert evaluation_row("e", {"summary": {"failures_by_stage": stages}}, set())["failures_by_stage"] == shown
    assert recording_row({"control_hz": 50.0}) is None and recording_row(None) is None  # it records nothing
    assert recording_row({"recording": ["recorded"]}) is None
    odd = recording_row({"recording": {"recorded": "3", "dropped": True, "unfinished": -1, "last_error": 5}})
    assert odd == dict.fromkeys(("recorded", "dropped", "unfinished", "not_kept", "not_sampled", "last_error"))


def test_a_report_renders_with_its_markup_escaped(ui, fleet_views, browser, tmp_path):
    page = signed_in(browser, ui, UI_READ)
    page.goto(f"{ui.url}/reports")
    page.get_by_role("link", name="ui-run").click()
    expect(page.locator("#report h1")).to_have_text("robotloop loop: ui-run")
    expect(page.locator("#report")).to_contain_text(XSS)
    expect(page.locator("#report table td").first).to_have_text("train")
    page.wait_for_function("() => document.querySelector('#report img').naturalWidth > 0")  # the figure loads
    assert page.evaluate("() => window.__pwned") is None and page.locator("#report script").count() == 0
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    report_id = page.url.rsplit("/", 1)[-1]
    assert ui.call("GET", f"/media/report/{report_id}/notes.txt", cookies=cookies).status_code == 404  # figures only
    assert ui.call("GET", f"/media/report/{report_id}/..%2Freport.json", cookies=cookies).status_code == 404
    for name in ("loss.png", "%0Aloss.png"):  # no session: refused, whatever the name (a newline included)
        assert ui.call("GET", f"/media/report/{report_id}/{name}").status_code == 401, name
    page.screenshot(path=tmp_path / "report.png", full_page=True)
    expect(page.locator("#rounds-section")).to_be_hidden()  # a loop's report: no rounds

    # A rounds report: listed with its rounds, and its page shows their table above report.md's.
    listed = {r["id"]: r["rounds"] for r in ui.call("GET", "/api/reports", cookies=cookies).json()["reports"]}
    assert listed[fleet_views] == 2 and listed[report_id] == 0
    page.goto(f"{ui.url}/reports/{fleet_views}")
    _expect_rounds(page)
    expect(page.locator("#report")).to_contain_text("Rounds through the fleet")
    page.context.close()


def _expect_rounds(page: Page) -> None:
    """The table of `_write_rounds_report`'s rounds, as the run and report pages show it."""
    rounds = page.locator("#rounds tbody tr")
    expect(rounds).to_have_count(2)
    expect(page.locator("#rounds-stable")).to_have_text(
        "stable runs ui-r1; the rounds took 2.5 min (the baselines 1.5 min more)"
    )
    expect(rounds.nth(0).locator("td")).to_have_text(
        ["0", "ui-r0", "start", "25.0% (10.0% to 50.0%)", "1600", "—", "—", "3.5", "—", "—"]
    )
    second = ["1", "ui-r1", "promoted", "50.0% (25.0% to 75.0%); against stable 2 won, 0 lost (p 0.5)"]
    second += ["400 (100 takeovers, 300 near misses)", "4 (3)"]
    second += ["3 + 2 branch drives", "2.5", "+62.50 pts"]
    base = (
        "37.5% (14.0% to 69.0%), 5 demos; against stable 2 won, 1 lost (p 1); the round against it 3 won, 2 lost (p 1)"
    )
    expect(rounds.nth(1).locator("td")).to_have_text([*second, base])


BUCKET_RUN = "hf://buckets/lab/ui/models/ui-bucket-run"  # its loop report is only in the bucket


def _upload_loop_report(ui: Ui, folder: Path, release: str) -> Path:
    """A loop report of BUCKET_RUN as `robotloop loop` writes and uploads it (`write_report`, the evaluation of
    `release` with one rollout video, `upload_report`), with markup in it. Returns the local folder."""
    from robotloop.deploy.evaluate import EpisodeResult, EvalReport
    from robotloop.loop.pipeline import LoopReport, LoopSettings
    from robotloop.loop.report import upload_report, write_report
    from robotloop.train.trainer import TrainReport

    settings = LoopSettings(bucket="hf://buckets/lab/ui", run="ui-bucket-run", report_dir=folder)
    video = folder / "eval" / "videos" / "episode_000_seed0.mp4"
    video.parent.mkdir(parents=True)
    shutil.copy(next((ui.reports.parent / "stage").rglob("*.mp4")), video)
    episodes = [EpisodeResult(i, i, i == 0, 4.0, 1.0, 10, 1.0, str(video) if i == 0 else None) for i in range(2)]
    evaluation = EvalReport("/models/x", "transfer_cube", 0, 10, IMAGE, 1, episodes, checkpoint=release)
    evaluation.save(folder / "eval" / "eval_report.json")
    report = LoopReport(settings, {"record": 1.0, "train": 2.0}, episodes=2, bytes_recorded=10, bytes_uploaded=5)
    report.train = TrainReport(4, 2.0, 10.0, 0.1, 0.5, losses=[(1, 1.0), (4, 0.5)])
    report.release, report.robot_running_after_s, report.eval = release, 1.5, evaluation
    promoted = {"step": 4, "episodes_trained_on": 2, "episodes_recorded": 2, "success_rate": 0.5, "promoted": False}
    report.promotions = [{**promoted, "release": XSS}]
    write_report(report)
    assert str(upload_report(ui.bucket, report)) == f"{BUCKET_RUN}/report"
    return folder


def test_a_loop_report_in_the_bucket_shows_on_its_release_and_its_run(ui, browser, tmp_path):
    from robotloop.deploy.runner import make_tiny_checkpoint
    from robotloop.ui.bucket_reports import report_id

    folder = _upload_loop_report(ui, tmp_path / "loop", "ui-b1")
    _publish(ui, "ui-b1", make_tiny_checkpoint(tmp_path / "b1", image_size=IMAGE), 4, channel=None, run=BUCKET_RUN)
    rid = report_id(BucketUrl.parse(f"{BUCKET_RUN}/report"))
    guard = {"x-robotloop-ui": "1"}
    cookies = ui.call("POST", "/api/session", json={"token": UI_READ}, headers=guard).cookies

    # Asked for by id first: the dashboard finds it beside the run of a release it knows.
    found = ui.call("GET", f"/api/reports/{rid}", cookies=cookies)
    assert found.status_code == 200, found.text
    report = found.json()
    assert report["dir"] == f"{BUCKET_RUN}/report" and report["summary"]["release"] == "ui-b1"
    assert report["markdown"] == (folder / "report.md").read_text()
    assert f"/media/report/{rid}/loss.png" in report["html"] and "<script>" not in report["html"]
    figure = ui.call("GET", f"/media/report/{rid}/loss.png", cookies=cookies)
    assert figure.status_code == 200 and figure.headers["content-type"] == "image/png"
    assert figure.content == (folder / "loss.png").read_bytes()
    video = ui.call("GET", f"/media/report/{rid}/episode_000_seed0.mp4", cookies=cookies)
    assert video.headers["content-type"] == "video/mp4"
    assert video.content == (folder / "eval" / "videos" / "episode_000_seed0.mp4").read_bytes()
    for name in ("report.json", "..%2Freport.md", "eval%2Feval_report.json", "nothing.png"):  # listed media only
        assert ui.call("GET", f"/media/report/{rid}/{name}", cookies=cookies).status_code == 404, name
    missing = ui.call("GET", "/api/reports/0123456789ab", cookies=cookies)
    assert missing.status_code == 404 and "no report '0123456789ab'" in missing.json()["error"]

    # Listed for its run (a training job's page asks so), on the reports page, and on its release's page.
    run = ui.call("GET", "/api/reports", params={"run": BUCKET_RUN}, cookies=cookies).json()["reports"]
    assert [(r["id"], r["source"], r["run"], r["release"]) for r in run] == [(rid, "bucket", "ui-bucket-run", "ui-b1")]
    assert abs(run[0]["modified"] - time.time()) < 600  # when it was uploaded, as the bucket's listing says
    listed = ui.call("GET", "/api/reports", cookies=cookies).json()
    assert rid in {r["id"] for r in listed["reports"]} and _report_id(ui) in {r["id"] for r in listed["reports"]}
    release = ui.call("GET", "/api/releases/ui-b1", cookies=cookies).json()
    assert [r["id"] for r in release["reports"]] == [rid]
    assert [(e["id"], e["success_rate"], e["videos"]) for e in release["evaluations"]] == [
        (rid, 0.5, ["episode_000_seed0.mp4"])
    ]

    page = signed_in(browser, ui, UI_READ)
    page.goto(f"{ui.url}/releases/ui-b1")
    page.locator("#release-facts").get_by_role("link", name="ui-bucket-run", exact=True).click()
    expect(page.locator("#report h1")).to_have_text("robotloop loop: ui-bucket-run")
    expect(page.locator("#report")).to_contain_text(XSS)  # the markup in it, as text
    page.wait_for_function("() => [...document.querySelectorAll('#report img')].every((i) => i.naturalWidth > 0)")
    assert page.evaluate("() => window.__pwned") is None
    page.screenshot(path=tmp_path / "bucket-report.png", full_page=True)
    page.context.close()


def test_a_broken_or_missing_bucket_report_is_an_unknown_item(ui, tmp_path):
    from robotloop.ui import UnknownItem
    from robotloop.ui.bucket_reports import report_id

    run = "hf://buckets/lab/ui/models/ui-broken-run"
    url = BucketUrl.parse(f"{run}/report")
    runs = _board(ui, []).runs
    runs.bucket.ttl_s = 0  # each call lists the bucket again
    rid = report_id(url)
    (tmp_path / "report.json").write_text("not JSON {")
    (tmp_path / "loss.png").write_bytes(_png())
    ui.bucket.upload(tmp_path / "report.json", url / "report.json")
    ui.bucket.upload(tmp_path / "loss.png", url / "loss.png")
    assert runs.reports(run) == []  # no report.md, no evaluation: not a report
    with pytest.raises(UnknownItem, match=f"no report '{rid}'"):
        runs.report(rid)
    (tmp_path / "report.md").write_text("# broken\n\n![loss](loss.png)\n")
    ui.bucket.upload(tmp_path / "report.md", url / "report.md")
    assert [r["id"] for r in runs.reports(run)] == [rid]
    assert runs.report(rid)["summary"] == {} and runs.report_file(rid, "loss.png").read_bytes() == _png()
    with pytest.raises(UnknownItem, match="has no file 'report.json'"):
        runs.report_file(rid, "report.json")
    ui.bucket.delete(url / "report.md")
    with pytest.raises(UnknownItem):  # gone from the bucket since it was listed
        runs.report(rid)
    ui.bucket.delete(url, recursive=True)
    with pytest.raises(UnknownItem, match=f"no report '{rid}'"):
        runs.report_file(rid, "loss.png")


# -- training --------------------------------------------------------------------------------------------------
def test_a_training_jobs_loss_curve_grows(ui, fleet_views, browser, tmp_path):
    client = TrainerClient(ui.trainer_url, TRAINER_WRITER)
    job = client.submit(job_spec(LIVE_RUN, 100_000, checkpoint_every=1000))
    try:
        page = signed_in(browser, ui, UI_READ)
        page.goto(f"{ui.url}/runs")
        expect(page.locator(f'#jobs tr[data-job="{job["id"]}"]')).to_be_visible()
        page.get_by_role("link", name=job["id"]).click()
        page.wait_for_function("() => (window.__robotloop.lossPoints || 0) >= 2", timeout=90_000)
        before = page.evaluate("() => window.__robotloop.lossPoints")
        page.wait_for_function(f"() => window.__robotloop.lossPoints > {before}", timeout=30_000)  # no reload
        expect(page.locator("#job-facts")).to_contain_text("running")
        expect(page.locator("#job-facts")).to_contain_text(TRAIN_DATASET)
        expect(page.locator("#job-facts dd").last).to_have_text(LIVE_RUN.rsplit("/", 1)[1])  # the rounds report
        _expect_rounds(page)  # ... and its rounds, on the run's page
        page.screenshot(path=tmp_path / "run.png", full_page=True)
        page.context.close()
    finally:
        client.cancel(job["id"])
