"""The whole loop in one call: record demos, train streaming from the bucket, publish, a sim robot pulls and runs
the release, evaluate, report. Each stage is the library call the matching CLI command makes.

Example:
    ```python
    >>> report = run_loop(LoopSettings.preset("cpu"), connect())
    >>> report.success_rate, report.stage_s["train"]
    ```
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..capture import DatasetRecorder, DatasetSpec
from ..capture.sim_record import check_task, record_sim
from ..cluster import check_address
from ..config import RobotSettings
from ..deploy.client import DeployClient
from ..deploy.envs import SimControlEnv
from ..deploy.evaluate import EvalReport, evaluate
from ..deploy.fetch import XetFetcher
from ..deploy.keys import (
    generate_keypair,
    load_private_key,
    load_public_keys,
    public_path,
)
from ..deploy.local import start_local_deploy_service
from ..deploy.publish import publish
from ..deploy.resolve import resolve_policy
from ..deploy.runtime import RobotRuntime
from ..deploy.store import ReleaseStore
from ..errors import BadValue
from ..sim.constants import check_shadow_map, format_image_size
from ..storage import BucketClient, BucketUrl
from ..train.data import DataSettings
from ..train.device import resolve_device
from ..train.layout import checkpoint_url
from ..train.policy import TINY_ACT, ACTSettings
from ..train.trainer import Progress, TrainReport, TrainSettings, train
from .gpu import GpuMonitor
from .seeds import DEMO_ATTEMPTS, check_demo_seeds, demo_first_seed, demo_seeds_left

# The recipe measured on one H200 from random init (benchmarks/recipes.py; BENCHMARKS.md lists what was tried and
# what each scored): the policy sees the 480x640 camera at 120x160 (98% of 50 episodes in the sweep, against 88-96%
# at 240x320, which scored 89% over 200 seeds), learns its BatchNorm statistics, and trains at 10x lerobot's
# learning rate with warm-up and cosine decay; it acts with ACT's temporal ensembling (the paper's 0.01). bf16,
# compiled with CUDA graphs: a cold compile took ~90 s in the Insertion sweep, and the eager step, launch-bound at
# these image sizes, trained at 963 samples/s in the loop against 2,500-3,100 compiled with two runs sharing a GPU.
H200_RECIPE = dict(
    image_size=(120, 160),
    lr=1e-4,
    lr_backbone=1e-4,
    lr_schedule="cosine",
    warmup_steps=500,
    backbone_norm="batch",
    n_action_steps=1,
    temporal_ensemble_coeff=0.01,
    compile=True,
    cuda_graphs=True,
)
# Per-task values on top of the h200 preset. Insertion (two objects, a tighter goal) gets twice the demos, sees the
# camera at 240x320 (the peg and the socket's hole are a few pixels wide at 120x160) and trains 15,000 steps, ~25
# passes over its 100 demos: 6,000 steps scored 18%, and the sweep's 240x320 run scored 10%, 55% and 80% of its
# evaluations at 5,000, 10,000 and 15,000 steps (benchmarks/results/recipes_h200_insertion.json); the loop with
# these values scored 80% too (benchmarks/results/loop_h200_insertion.json). It acts in whole chunks (lerobot's ACT
# default), not ensembled: one policy's 200 paired seeds scored 83.5% so against 77.0% ensembled, winning 14 scenes
# and losing 1 (2026-12-06 13:54, BENCHMARKS.md); chunks of 20 scored 70.0%.
H200_TASKS: dict[str, dict[str, Any]] = {
    "insertion": dict(
        episodes=100,
        steps=15000,
        policy=dict(H200_RECIPE, image_size=(240, 320), n_action_steps=100, temporal_ensemble_coeff=None),
    ),
}


@dataclass
class LoopSettings:
    """One run of the loop. `preset("cpu")` finishes on a 2-core machine; `preset("h200")` is the real result."""

    task: str = "transfer_cube"
    episodes: int = 4
    image_size: tuple[int, int] = (48, 64)
    vcodec: str = "h264"  # faster than lerobot's default AV1 on a laptop's CPU; the h200 preset keeps AV1
    record_workers: int = 2
    steps: int = 150
    batch_size: int = 8
    device: str = "cpu"
    tiny_policy: bool = True  # a small ACT (dim 64): lerobot's default is 51.6M parameters
    decode_workers: int = 1
    eval_episodes: int = 4
    eval_workers: int = 2
    eval_max_steps: int | None = None  # default: the task's 400
    videos: int = 2
    bucket: str = "hf://buckets/local/loop"
    run: str = field(default_factory=lambda: time.strftime("run-%Y%m%d-%H%M%S"))
    report_dir: Path = Path("loop-report")
    backbone_weights: Path | None = None
    # ACTSettings fields on top of the architecture (tiny or lerobot's default) and, on CUDA, every speed option:
    # the recipe (policy image size, learning rate and schedule, normalization, augmentation, inference).
    policy: dict[str, Any] = field(default_factory=dict)
    # Start training once this many demos are in the bucket; recording of the rest goes on beside it and the
    # trainer folds each new episode in as it lands. None: train after all demos are recorded.
    train_after: int | None = None
    live: bool = False
    live_rounds: int = 3  # live: checkpoints evaluated (and maybe promoted) while recording goes on
    seed: int = 0
    # Recording and evaluation's sim workers and the fleet's robots on this Ray cluster (`robotloop.cluster`); None:
    # processes.
    ray: str | None = None
    # The sim cameras' shadow-map side for everything the run films: demos, the fleet, re-demonstrations, the
    # baseline, and (saved with the policy) evaluation. None: gym-aloha's, 4096 at 480x640, which is most of an
    # H200's frame time (2048 rendered 2.6x faster at 240x320; BENCHMARKS.md).
    shadow_map: int | None = None

    def __post_init__(self) -> None:
        """Raises ValueError (BadBucketUrl included) before anything starts: unknown task, bad bucket URL, ..."""
        check_task(self.task)
        BucketUrl.parse(self.bucket)
        check_shadow_map(self.shadow_map)
        if self.ray is not None:
            check_address(self.ray)
        self.device = resolve_device(self.device)  # a missing GPU fails here, not after the recording stage
        if self.train_after is not None and self.train_after < 1:
            raise BadValue(f"train_after must be at least 1 demo (or None), not {self.train_after}")
        check_demo_seeds(demo_first_seed(self.seed), DEMO_ATTEMPTS * self.episodes, self.eval_episodes)
        self.act()  # a bad recipe fails here, before anything is recorded

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> LoopSettings:
        """`cpu` (the default: small images, a tiny ACT, minutes on 2 cores; the policy is not expected to succeed)
        or `h200` (50 demos at 480x640, lerobot's default-size ACT trained with `H200_RECIPE` for 3,000 steps at
        batch 64, 50 evaluation episodes, under 5 minutes on one H200; BENCHMARKS.md has its success rates.
        `H200_TASKS` holds the per-task values, e.g. Insertion's 100 demos and 15,000 compiled steps). `overrides` win.

        Raises:
            BadValue: unknown preset.
        """
        h200 = dict(
            episodes=50,
            image_size=(480, 640),
            vcodec="libsvtav1",  # lerobot's default: smaller files, and 16 cores encode it beside the sim workers
            record_workers=15,
            steps=3000,
            batch_size=64,
            device="cuda",
            tiny_policy=False,
            decode_workers=8,
            eval_episodes=50,
            eval_workers=15,
            videos=3,
            train_after=10,
            policy=dict(H200_RECIPE),  # a copy: a run's settings never change the preset
        )
        presets = {"cpu": {}, "h200": h200}
        if name not in presets:
            raise BadValue(f"unknown loop preset '{name}'; choose one of {', '.join(sorted(presets))}")
        per_task = H200_TASKS.get(overrides.get("task", cls.task), {}) if name == "h200" else {}
        return cls(**{**presets[name], **per_task, **overrides})

    @property
    def dataset_url(self) -> BucketUrl:
        return BucketUrl.parse(f"{self.bucket}/datasets/{self.task}-{self.run}")

    @property
    def run_url(self) -> BucketUrl:
        return BucketUrl.parse(f"{self.bucket}/models/{self.run}")

    def dataset_spec(self) -> DatasetSpec:
        """What every dataset of the run records: the camera size, codec and rendering."""
        return DatasetSpec.aloha(self.image_size, self.vcodec, self.shadow_map)

    def act(self) -> ACTSettings:
        """The policy's settings: architecture, then the preset's recipe (`policy`), then the speed options.

        Raises:
            ValueError: an unknown or invalid `policy` field.
        """
        unknown = set(self.policy) - {f.name for f in fields(ACTSettings)}
        if unknown:
            names = ", ".join(sorted(unknown))
            raise BadValue(f"unknown policy setting(s) {names}; see robotloop.train.policy.ACTSettings")
        recipe = dict(self.policy)
        cuda = self.device.startswith("cuda")
        if not cuda:  # compile and CUDA graphs are GPU speed options: on a CPU a compile costs more than it saves
            recipe.update(compile=False, cuda_graphs=False)
        make = ACTSettings.fast if cuda else ACTSettings
        return make(**{**(TINY_ACT if self.tiny_policy else {}), "backbone_weights": self.backbone_weights, **recipe})


@dataclass
class LoopReport:
    settings: LoopSettings
    stage_s: dict[str, float] = field(default_factory=dict)
    episodes: int = 0
    demos_failed: int = 0  # scripted demos whose expert missed: dropped, their seeds skipped
    episodes_trained_on: int = 0  # in the trainer's buffer at its last progress report
    bytes_recorded: int = 0  # the episodes' own files as written
    recording_s: float = 0.0  # the recording's own time: its start to the last demo committed (beside training too)
    bytes_uploaded: int = 0  # what went over the wire (after Xet dedup), metadata included
    train: TrainReport | None = None
    release: str | None = None
    robot_running_after_s: float | None = None
    bytes_pulled: int = 0
    eval: EvalReport | None = None
    promotions: list[dict[str, Any]] = field(default_factory=list)  # live mode: one per evaluated checkpoint
    next_seed: int = 0  # the first demo seed not tried yet
    stage_spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # monotonic (start, end) per run
    gpu_util: dict[str, float | None] = field(default_factory=dict)  # mean GPU utilisation (%) per stage
    wall_s: float = 0.0  # first stage's start to the last one's end (stages overlap while recording goes on)

    @property
    def success_rate(self) -> float | None:
        return self.eval.success_rate if self.eval else None

    @property
    def total_s(self) -> float:
        return sum(self.stage_s.values())


Stage = Callable[[str, str], None]  # (stage, message): progress for the CLI and notebooks
Demo = Callable[[str, "LoopReport"], None]  # ("committed" or "failed", the report so far): the recording's progress


def run_loop(
    settings: LoopSettings,
    client: BucketClient,
    on_stage: Stage = lambda stage, msg: None,
    on_train: Callable[[Progress], None] | None = None,
    on_demo: Demo | None = None,
) -> LoopReport:
    """Record, train, publish, run on a sim robot, evaluate. Writes nothing outside the bucket and
    `settings.report_dir` (keys, robot store, evaluation videos); see `robotloop.loop.report` for the report.
    `on_stage` hears each stage start, `on_train` each training progress report, `on_demo` each scripted demo that
    lands in the bucket or fails (its kind, "committed" or "failed", and the report so far).

    Raises:
        robotloop.storage.StorageError: the bucket cannot be reached or written.
        RuntimeError: the deploy service or the robot did not come up.
    """
    s, report = settings, LoopReport(settings)
    s.report_dir.mkdir(parents=True, exist_ok=True)
    with GpuMonitor(s.device) as gpu:
        try:
            _run_stages(s, report, client, on_stage, on_train, on_demo)
        finally:
            report.gpu_util = {stage: gpu.mean(spans) for stage, spans in report.stage_spans.items()}
            spans = [span for spans in report.stage_spans.values() for span in spans]
            report.wall_s = max(b for _, b in spans) - min(a for a, _ in spans) if spans else 0.0
    return report


def _run_stages(
    s: LoopSettings, report: LoopReport, client: BucketClient, on_stage: Stage, on_train, on_demo: Demo | None
) -> None:
    recorder = DatasetRecorder(client, s.dataset_url, s.dataset_spec(), staging=s.report_dir / "staging")
    on_train = _counting_episodes(report, on_train)
    overlap = not s.live and s.train_after is not None and s.train_after < s.episodes
    recording = None
    if overlap:
        recording = _start_recording(recorder, s, report, on_stage, on_demo)
    else:
        with _timed(
            report, "record", on_stage, f"{s.episodes} scripted {s.task} demos at {format_image_size(s.image_size)}"
        ):
            _record(recorder, s, s.episodes, report, on_demo)
    service = None
    try:
        key = s.report_dir / "keys" / "deploy.key"
        if not key.exists():
            generate_keypair(key)
        service = start_local_deploy_service(s.report_dir / "deploy", trusted_keys=(public_path(key),))
        deploy = DeployClient(service.url, service.token)
        if s.live:
            _live(client, recorder, deploy, key, report, on_stage, on_train, on_demo)
        else:
            beside = ", demos folded in as they land" if overlap else ""
            with _timed(report, "train", on_stage, f"{s.steps} steps at batch {s.batch_size} on {s.device}{beside}"):
                report.train = _train(client, s, s.steps, on_train, fold_in=overlap)
            if overlap:
                with _timed(report, "record", on_stage, "waiting for the last demos"):
                    recording.finish()
            with _timed(report, "publish", on_stage, "signed release on channel stable"):
                report.release = f"{s.run}-{report.train.steps}"
                publish(client, str(s.run_url), report.release, load_private_key(key), deploy, channel="stable")
        with _timed(report, "robot", on_stage, "a sim robot pulls, verifies and runs the release"):
            _robot(client, deploy, key, report)
        with _timed(report, "evaluate", on_stage, f"{s.eval_episodes} episodes, {s.eval_workers} workers"):
            report.eval = _evaluate(
                s, ReleaseStore(s.report_dir / "robot-store").model_dir(report.release), s.report_dir / "eval"
            )
    finally:
        if recording is not None:  # a stage failed while demos were still being recorded
            recording.stop()
        if service is not None:
            service.stop()


# -- stages --------------------------------------------------------------------------------------------------
@contextmanager
def _timed(report: LoopReport, stage: str, on_stage: Stage, what: str) -> Iterator[None]:
    """Announce `stage`, run the block, add its seconds to `report.stage_s` (a stage may run several times)."""
    on_stage(stage, what)
    t0 = time.monotonic()
    try:
        yield
    finally:
        t1 = time.monotonic()
        report.stage_s[stage] = report.stage_s.get(stage, 0.0) + t1 - t0
        report.stage_spans.setdefault(stage, []).append((t0, t1))


def _record(
    recorder: DatasetRecorder,
    s: LoopSettings,
    episodes: int | None,
    report: LoopReport,
    on_demo: Demo | None = None,
    on_event: Callable[[str, int, Any], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    started = time.monotonic() - report.recording_s  # a later recording in this run adds its own time

    def count(kind: str, seed: int, commit: Any) -> None:  # as each demo lands: live mode reads them meanwhile
        if kind == "committed":
            report.recording_s = time.monotonic() - started
            report.episodes += 1
            report.bytes_recorded += commit.episode_bytes
            report.bytes_uploaded += commit.bytes_sent
        elif kind == "failed":
            report.demos_failed += 1
        if on_event is not None:
            on_event(kind, seed, commit)
        if on_demo is not None:
            on_demo(kind, report)

    # A restart takes new seeds (past the committed episodes); a later recording in this run starts past every
    # seed tried so far (failed demos are dropped, so the committed count alone would reuse their successors).
    seed_start = max(demo_first_seed(s.seed) + recorder.committed_episodes(), report.next_seed)
    # `episodes` None (live mode): until stopped, or until the seeds clear of the evaluation's run out.
    attempts = DEMO_ATTEMPTS * episodes if episodes is not None else demo_seeds_left(seed_start, s.eval_episodes)
    check_demo_seeds(seed_start, attempts, s.eval_episodes)
    if attempts == 0:
        return
    rec = record_sim(
        recorder,
        s.task,
        episodes if episodes is not None else attempts,
        s.record_workers,
        s.image_size,
        seed_start=seed_start,
        max_attempts=attempts,
        on_event=count,
        should_stop=should_stop,
        ray=s.ray,
    )
    report.next_seed = rec.next_seed


class _Recording:
    """All demos recorded in a thread; `finish()` waits for them and raises what the recording raised, `stop()`
    ends it early (demos in progress finish and are committed, so it waits for them) and `raise_if_failed()`
    raises what the recording raised so far."""

    def __init__(
        self,
        recorder: DatasetRecorder,
        s: LoopSettings,
        report: LoopReport,
        episodes: int | None,
        on_demo: Demo | None = None,
    ) -> None:
        """Record `episodes` demos (None: until stopped)."""
        self.first = threading.Event()  # the first `s.train_after` demos are committed (or recording ended)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._committed = 0
        self._thread = threading.Thread(
            target=self._run, args=(recorder, s, report, episodes, on_demo), name="loop-record", daemon=True
        )
        self._thread.start()

    def _run(self, recorder, s: LoopSettings, report: LoopReport, episodes: int | None, on_demo: Demo | None) -> None:
        def on_event(kind: str, seed: int, commit: Any) -> None:
            if kind == "committed":
                self._committed += 1
            if self._committed >= (s.train_after or 0):
                self.first.set()

        try:
            _record(recorder, s, episodes, report, on_demo, on_event, self._stop.is_set)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread by finish()
            self.error = error
        finally:
            self.first.set()

    def finish(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


def _start_recording(
    recorder: DatasetRecorder, s: LoopSettings, report: LoopReport, on_stage: Stage, on_demo: Demo | None
) -> _Recording:
    """Start recording every demo; return once the first `s.train_after` are in the bucket."""
    with _timed(
        report,
        "record",
        on_stage,
        f"first {s.train_after} of {s.episodes} scripted {s.task} demos at "
        f"{format_image_size(s.image_size)}; the rest are recorded while training runs",
    ):
        recording = _Recording(recorder, s, report, s.episodes, on_demo)
        recording.first.wait()
        if recording.error is not None:
            recording.finish()
    return recording


def _counting_episodes(report: LoopReport, on_train: Callable[[Progress], None] | None) -> Callable[[Progress], None]:
    def on_progress(p: Progress) -> None:
        report.episodes_trained_on = p.episodes
        if on_train is not None:
            on_train(p)

    return on_progress


def _train(
    client: BucketClient, s: LoopSettings, steps: int, on_train, resume: bool = False, fold_in: bool = False
) -> TrainReport:
    settings = TrainSettings(
        steps=steps,
        batch_size=s.batch_size,
        log_every=max(1, min(50, steps // 10)),
        checkpoint_every=steps,
        seed=s.seed,
        device=s.device,
        resume=resume,
    )
    # While demos still land (live mode, or training beside recording) the trainer looks for them often.
    data = DataSettings(decode_workers=s.decode_workers, refresh_every_s=5.0 if s.live or fold_in else 30.0)
    return train(client, [s.dataset_url], s.run_url, settings, s.act(), data, on_train)


def _robot(client: BucketClient, deploy: DeployClient, key: Path, report: LoopReport, timeout_s: float = 120.0) -> None:
    """Register a sim robot on channel stable, run it until it runs `report.release`, then stop it."""
    s = report.settings
    token = deploy.register_robot("loop-sim-1", channel="stable", rotate=True)
    trusted = load_public_keys([public_path(key)])
    options = RobotSettings(robot_id="loop-sim-1", device=s.device, poll_wait_s=5, heartbeat_s=1.0)
    runtimes: list[RobotRuntime] = []
    published = time.monotonic()

    def control() -> None:  # MuJoCo's EGL context belongs to the thread that made it
        env = SimControlEnv(s.task, s.image_size, episode_steps=s.eval_max_steps or 400, shadow_map=s.shadow_map)
        runtimes.append(
            RobotRuntime(
                env,
                DeployClient(deploy.url, token),
                ReleaseStore(s.report_dir / "robot-store"),
                trusted,
                options,
                lambda bucket: XetFetcher(client.endpoint, client.token, bucket),
            )
        )
        try:
            runtimes[0].run()
        finally:
            env.close()

    thread = threading.Thread(target=control, name="loop-robot", daemon=True)
    thread.start()
    try:
        while not (runtimes and runtimes[0].running == report.release):
            if time.monotonic() - published > timeout_s or not thread.is_alive():
                raise RuntimeError(f"the sim robot did not run {report.release} within {timeout_s:.0f} s")
            time.sleep(0.05)
        report.robot_running_after_s = time.monotonic() - published
        report.bytes_pulled = sum(p.bytes_fetched for p in runtimes[0].stats.pulls)
    finally:
        if runtimes:
            runtimes[0].stop()
        thread.join(30)


def _evaluate(s: LoopSettings, model_dir: Path, out: Path) -> EvalReport:
    return evaluate(
        model_dir,
        s.task,
        s.eval_episodes,
        s.eval_workers,
        max_steps=s.eval_max_steps,
        image_size=s.image_size,
        videos=s.videos,
        output_dir=out,
        device=s.device,
        ray=s.ray,  # the release's folder on this machine: a cluster of this machine, or folders all nodes see
    )


def _live(client, recorder, deploy, key, report: LoopReport, on_stage: Stage, on_train, on_demo) -> None:
    """Recording goes on in a thread while training runs in rounds; each round's checkpoint is published to
    canary, evaluated, and promoted to stable only when it beats the release stable runs."""
    s = report.settings
    # One worker: the CPU is for training.
    recording = _Recording(recorder, replace(s, record_workers=1), report, episodes=None, on_demo=on_demo)
    best: float | None = None
    try:
        for round_ in range(1, s.live_rounds + 1):
            recording.raise_if_failed()  # training on with a dead recording would report stale data as live
            steps = s.steps * round_
            with _timed(report, "train", on_stage, f"round {round_}: to step {steps}, episodes folded in as they land"):
                report.train = _train(client, s, steps, on_train, resume=round_ > 1)
            name = f"{s.run}-{steps}"
            with _timed(report, "publish", on_stage, f"{name} to canary"):
                publish(client, str(s.run_url), name, load_private_key(key), deploy, channel="canary")
            with _timed(report, "evaluate", on_stage, f"{name} on {s.eval_episodes} episodes"):
                model = resolve_policy(
                    str(checkpoint_url(s.run_url, steps)), lambda: client, s.report_dir / "checkpoints"
                )
                result = _evaluate(s, model, s.report_dir / f"eval-{steps}")
            promoted = best is None or result.success_rate > best
            if promoted:
                deploy.promote("stable", name, reason=f"success {result.success_rate:.0%} beats {best or 0:.0%}")
                best, report.release = result.success_rate, name
            report.promotions.append(
                {
                    "release": name,
                    "step": steps,
                    "success_rate": result.success_rate,
                    "episodes_trained_on": report.episodes_trained_on,
                    "episodes_recorded": report.episodes,
                    "promoted": promoted,
                }
            )
    finally:
        recording.stop()
    recording.raise_if_failed()


def settings_dict(settings: LoopSettings) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
