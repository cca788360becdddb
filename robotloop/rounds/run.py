"""Rounds of the loop through the fleet: round 0 is `run_loop` (demos, train, publish to stable, evaluate); each
further round runs a sim fleet on the stable release over fresh seeds, with the expert taking over stalls, re-
demonstrates the scenes it failed (and, `RoundSettings.redemo_near`, fresh scenes near those the policy did not win
alone), fine-tunes from the stable release's checkpoint on demos and fleet data together (or,
`RoundSettings.from_scratch`, trains anew on them with round 0's recipe), evaluates on the seeds stable was evaluated
on while it publishes to canary, and promotes only what beats it.

Each round's expert frames (takeovers plus the expert's demos) are what the round cost a human on hardware. The fair
baseline (`RoundSettings.baseline`) spends the same frames on more scripted demos of fresh random scenes, trained
the same way from the same checkpoint, evaluated on the same seeds: what the fleet's data is worth beyond "more
demos".

Seeds (`robotloop.loop.seeds`): evaluations 1000 upwards (lerobot-eval's default start) whatever the loop seed;
round 0's demos, the fleet's scenes and the baseline's demos each in their own range of the loop seed's block: no
scene is both trained on and evaluated.

Example:
    ```python
    >>> report = run_rounds(LoopSettings.preset("cpu"), RoundSettings(rounds=2, fleet=2), connect())
    >>> [(r.round, r.success_rate, r.expert_frames) for r in report.rounds]
    ```
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..capture import DatasetRecorder
from ..capture.sim_record import record_sim
from ..cluster import driver_host
from ..deploy.client import DeployClient
from ..deploy.evaluate import EvalReport, Paired, evaluate, paired
from ..deploy.keys import public_path
from ..deploy.local import start_local_deploy_service
from ..deploy.publish import Publisher
from ..deploy.resolve import resolve_policy
from ..errors import BadValue
from ..loop.pipeline import LoopReport, LoopSettings, Stage, run_loop
from ..loop.seeds import (
    NEAR_CANDIDATES,
    baseline_first_seed,
    check_baseline_seeds,
    check_fleet_seeds,
    fleet_first_seed,
    near_candidates,
)
from ..sim.scenes import nearest_scenes
from ..sim.tasks import get_task
from ..storage import BucketClient, BucketUrl, NotFound
from ..train.data import DataSettings
from ..train.data.weighting import dataset_frames, with_share
from ..train.layout import checkpoint_url
from ..train.policy import ACTSettings
from ..train.trainer import Progress, TrainReport, TrainSettings, train
from ..train.weights import FrameWeights
from . import MAX_BRANCHES, MAX_REDEMO_NEAR
from .fleet import FleetRobot, FleetRobotResult, fleet_episodes, run_fleet, start_fork_server

# K per task: the scripted demos themselves go up to 162 (TransferCube) and 212 (Insertion) steps between new reward
# stages (robotloop.sim.expert.StallTrigger), so a smaller K would take over from a policy doing what they do.
STALL_STEPS = {"transfer_cube": 180, "insertion": 230}
# K stays this many steps above the slowest pace at which stable's evaluation still succeeded (`stall_steps_for`).
STALL_MARGIN = 20
# A round's fine-tune on the h200 preset: ~80 s at batch 64 on one H200, so that a round (fleet, re-demos, training,
# evaluation) fits its 5 minutes; round 0 trained Insertion from scratch for 15,000.
H200_ROUND_STEPS = 3000
# The h200 preset's fresh scenes near each fleet scene the policy did not win alone: Insertion's round 1 with 3 went
# from 85.5% to 91.5% (16 scenes won, 4 lost), where the same frames on random scenes gave 88.0%, and every round
# without them stayed within noise of stable (one H100, 2026-12-06 21:36, BENCHMARKS.md).
H200_REDEMO_NEAR = 3
# A round fine-tunes a converged checkpoint: its peak learning rate is this fraction of the recipe's. The h200 recipe
# peaks at 1e-4 and decays to 0 over round 0, so a fine-tune restarting at 1e-4 throws the policy off what it learned
# (Insertion, 2026-12-04 07:14: 77% -> 70.5% after a round at the full rate). 0.1 puts it back at lerobot's ACT rate.
ROUND_LR_SCALE = 0.1


def round_weights() -> FrameWeights:
    """A round's draws: demos 1, the expert's frames 2, the fleet's autonomous frames 0, successes included (the
    trainer's own default keeps those at 1). The policy's own successes are no expert data, and they cost: on
    TransferCube (one H200, BENCHMARKS.md) stable fine-tuned on the demos alone scored 99.5%, fine-tuned on the
    demos and the fleet's 60 successes 84.5-86.5% (three runs). `--round-success-weight` puts them back."""
    return FrameWeights(autonomous_success=0.0)


@dataclass
class RoundSettings:
    """The rounds after round 0 (see the module docstring). Defaults fit the cpu preset; `for_preset` the h200's."""

    rounds: int = 1
    fleet: int = 2  # sim robots, one process each
    fleet_episodes: int = 2  # episodes per robot per round
    steps: int | None = None  # fine-tuning steps per round (None: the loop's `steps`)
    stall_steps: int | None = None  # K (None: STALL_STEPS of the task)
    redemonstrate: bool = True  # the scripted expert re-demonstrates each failed episode's scene
    # Per fleet scene the policy did not win alone, the scripted expert also demonstrates this many fresh scenes
    # nearest it (`robotloop.sim.scenes.nearest_scenes`): where the policy is likely to fail too (0: none)
    redemo_near: int = 0
    # Per fleet episode the policy did not finish alone, n of its states (spread over the ticks after its last
    # progress) that the expert drives again from, each drive an episode of expert frames in the robot's dataset
    # (sim only; 0: none)
    branches: int = 0
    baseline: bool = False  # also train the same-expert-frames baseline each round
    # With `baseline`, beside the first n rounds only (None: every round). The baselines chain as the rounds do, so
    # round n's pair still spent the same expert frames; the rounds after it run at their own pace.
    baseline_rounds: int | None = None
    fleet_rate_hz: float = 50.0  # the sim robots' control rate; math.inf: as fast as the machine runs
    lr_scale: float = ROUND_LR_SCALE  # a fine-tune's peak learning rate, as a fraction of the recipe's
    fleet_check: bool = False  # also evaluate stable on the fleet's own scenes, episode by episode (`FleetCheck`)
    # Each round (and its baseline) trains from random init on all its data with round 0's recipe and steps, instead
    # of fine-tuning stable: slower, but what the data is worth when fully trained in, not only as a nudge.
    from_scratch: bool = False
    weights: FrameWeights = field(default_factory=round_weights)  # demo 1, expert 2, autonomous 0
    # The share of each batch drawn from the expert frames the rounds gathered (takeovers, re-demonstrations; the
    # baseline's extra demos), against the rest; None: as `weights` make it (in proportion to frames).
    data_share: float | None = None

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.fleet < 1 or self.fleet_episodes < 1:
            raise BadValue("rounds, fleet and fleet episodes must each be at least 1")
        check_fleet_seeds(self.rounds, self.fleet, self.fleet_episodes)
        if not 0 <= self.redemo_near <= MAX_REDEMO_NEAR:
            raise BadValue(
                f"scenes near each one the policy did not win: 0 to {MAX_REDEMO_NEAR}, not {self.redemo_near}"
            )
        if self.fleet * self.fleet_episodes * self.redemo_near > NEAR_CANDIDATES:
            raise BadValue(
                f"{self.redemo_near} scenes near each of {self.fleet} x {self.fleet_episodes} fleet episodes: more "
                f"than a round's {NEAR_CANDIDATES:,} candidates"
            )
        if not 0 <= self.branches <= MAX_BRANCHES:
            raise BadValue(f"branches per failed episode must be 0 to {MAX_BRANCHES}, not {self.branches}")
        if self.stall_steps is not None and self.stall_steps < 1:
            raise BadValue(f"the stall trigger's K must be at least 1 step, not {self.stall_steps}")
        if not 0 < self.lr_scale <= 1:
            raise BadValue(f"a round's learning-rate scale must be in (0, 1], not {self.lr_scale}")
        if self.data_share is not None and not 0 < self.data_share < 1:
            raise BadValue(f"the rounds' data share of the draws must be in (0, 1), not {self.data_share}")
        if self.baseline_rounds is not None and (not self.baseline or self.baseline_rounds < 1):
            raise BadValue(f"a baseline beside the first {self.baseline_rounds} rounds needs the baseline, and n >= 1")

    def baseline_beside(self, k: int) -> bool:
        """Whether round `k` trains its same-expert-frames baseline (`baseline`, `baseline_rounds`)."""
        return self.baseline and (self.baseline_rounds is None or k <= self.baseline_rounds)

    @classmethod
    def for_preset(cls, preset: str, **overrides: Any) -> RoundSettings:
        """`cpu` (2 robots, 2 episodes each) or `h200` (10 robots, 6 episodes each, on 16 cores beside one GPU,
        `H200_ROUND_STEPS` fine-tuning steps a round and `H200_REDEMO_NEAR` scenes demonstrated near each one the
        policy did not win alone).

        Raises:
            BadValue: unknown preset.
        """
        presets: dict[str, dict[str, Any]] = {
            "cpu": {},
            "h200": dict(fleet=10, fleet_episodes=6, steps=H200_ROUND_STEPS, redemo_near=H200_REDEMO_NEAR),
        }
        if preset not in presets:
            raise BadValue(f"unknown rounds preset '{preset}'; choose one of {', '.join(sorted(presets))}")
        return cls(**{**presets[preset], **overrides})


def stall_steps_for(task: str, stable: EvalReport, given: int | None = None) -> int:
    """The stall trigger's K for a round on `stable`: `given` if the user set it, else the task's `STALL_STEPS`
    raised above the longest stall among stable's own successful evaluation episodes. A policy is slower than the
    scripted demos the defaults were set from (Insertion's released policy, 2026-12-04, succeeded at steps 320-347),
    and a K it can exceed on its way to success hands the expert episodes the policy would have finished: fewer
    autonomous successes than its evaluation has, and expert frames where none were needed.

    Example:
        ```python
        >>> stall_steps_for("insertion", report)     # its successes went up to 251 steps without a new stage
        271
        ```
    """
    if given is not None:
        return given
    slowest = (stable.longest_stall_in_successes or {}).get("max", 0)
    return max(STALL_STEPS[task], slowest + STALL_MARGIN)


def round_recipe(loop: LoopSettings, settings: RoundSettings) -> tuple[int, ACTSettings]:
    """A round's training steps and recipe: round 0's from scratch (`settings.from_scratch`), else a fine-tune of
    `settings.steps` (default: round 0's) at `settings.lr_scale` of its learning rates (`fine_tune_recipe`).

    Example:
        ```python
        >>> steps, act = round_recipe(LoopSettings.preset("h200", task="insertion"), RoundSettings(steps=3000))
        >>> steps, act.lr
        (3000, 1e-05)
        ```
    """
    if settings.from_scratch:
        return loop.steps, loop.act()
    steps = settings.steps or loop.steps
    return steps, fine_tune_recipe(loop.act(), steps, settings.lr_scale)


def fine_tune_recipe(act: ACTSettings, steps: int, lr_scale: float) -> ACTSettings:
    """The recipe for a round's fine-tune of `steps` from a trained checkpoint: `lr_scale` x its learning rates and
    its warm-up cut to a tenth of the fine-tune (round 0's 500 warm-up steps would be a sixth of a 3,000-step round).

    Example:
        ```python
        >>> r = fine_tune_recipe(ACTSettings(lr=1e-4, lr_backbone=1e-4, warmup_steps=500), 3000, 0.1)
        >>> (r.lr, r.lr_backbone, r.warmup_steps)
        (1e-05, 1e-05, 300)
        ```
    """
    return replace(
        act,
        lr=act.lr * lr_scale,
        lr_backbone=act.lr_backbone * lr_scale,
        warmup_steps=min(act.warmup_steps, steps // 10),
    )


def split_branches(episodes: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A round's fleet episodes apart from the expert's drives from branch points (`RoundSettings.branches`:
    episodes whose every frame is the expert's), which are no robot's episode of its own: (episodes, drives).

    Example:
        ```python
        >>> split_branches([{"kind": "takeover"}, {"kind": "expert"}, {"kind": "autonomous"}])
        ([{'kind': 'takeover'}, {'kind': 'autonomous'}], [{'kind': 'expert'}])
        ```
    """
    drives = [e for e in episodes if e.get("kind") == "expert"]
    return [e for e in episodes if e.get("kind") != "expert"], drives


def has_new_draws(episodes: list[dict[str, Any]], weights: FrameWeights, expert_frames: int) -> bool:
    """Whether a round's training would draw any of its new data: the expert's frames (takeovers,
    re-demonstrations), or fleet episodes whose autonomous frames weigh more than 0. Without any, it would only
    fine-tune stable on the demos stable was trained on (measured: 99.5% against stable's 100% on TransferCube).

    Example:
        ```python
        >>> has_new_draws([{"success": True}], round_weights(), expert_frames=0)   # stable won alone everywhere
        False
        ```
    """
    if expert_frames > 0:
        return True
    return any((weights.autonomous_success if e["success"] else weights.autonomous_failed) > 0 for e in episodes)


@dataclass
class Baseline:
    """The same expert frames as scripted demos of fresh scenes, trained the same way, on the same seeds."""

    demos: int
    expert_frames: int
    success_rate: float
    ci95: tuple[float, float]
    minutes: float = 0.0  # recording, training and evaluating it: apart from its round's minutes
    versus_stable: Paired | None = None  # against the stable its round began with, scene by scene on the same seeds
    round_versus: Paired | None = None  # its round against it, scene by scene on the same seeds: is the lead noise?


@dataclass
class FleetCheck:
    """Stable evaluated in lockstep on the very scenes its fleet robots ran alone, paired episode by episode: does a
    robot running a release succeed as the evaluation of that release says it will? (`RoundSettings.fleet_check`)"""

    episodes: int  # fleet episodes compared (the ones the policy drove alone until success or its ticks ran out)
    fleet_successes: int  # of them, won by the robot alone
    eval_successes: int  # the same seeds, won in the evaluation
    fleet_only: int  # seeds won by the robot, lost in the evaluation
    eval_only: int  # seeds lost by the robot, won in the evaluation


@dataclass
class DemosTimeline:
    """Where a round's expert demos stage went, in seconds since it began: the dataset opened, the first and last
    demo committed, and the commits' uploads: one at a time by the round's own process (`record_sim`'s pool), or
    by each Ray actor for its own demos."""

    scenes: int
    workers: int
    on_ray: bool = False
    opened_s: float = 0.0
    first_s: float | None = None
    last_s: float | None = None
    upload_s: float = 0.0

    def describe(self, round_: int, stage_s: float) -> str:
        """E.g. "Round 1's expert demos (65 s), 54 scenes on 15 workers: the dataset opened at 1 s, the first demo
        committed at 20 s, the last at 64 s; their uploads 18 s in all, one at a time."."""
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        text = f"Round {round_}'s expert demos ({stage_s:.0f} s), {self.scenes} scenes on {workers}: "
        text += f"the dataset opened at {self.opened_s:.0f} s"
        if self.first_s is not None and self.last_s is not None:
            text += f", the first demo committed at {self.first_s:.0f} s, the last at {self.last_s:.0f} s"
        by = "by the Ray actors" if self.on_ray else "one at a time"
        return text + f"; their uploads {self.upload_s:.0f} s in all, {by}."


@dataclass
class RoundResult:
    """One round. Round 0's expert frames are its demos'."""

    round: int
    release: str
    promoted: bool
    success_rate: float
    ci95: tuple[float, float]
    eval_episodes: int
    expert_frames: int = 0
    takeover_frames: int = 0
    redemo_frames: int = 0
    near_frames: int = 0  # the expert's demos of fresh scenes near those the policy did not win alone
    branch_frames: int = 0  # the expert's drives from the states of episodes the policy did not finish alone
    branches: int = 0  # those drives (episodes of expert frames)
    fleet_episodes: int = 0
    fleet_failures: int = 0  # fleet episodes that ended without success, takeovers and all
    autonomous_successes: int = 0  # fleet episodes the policy finished alone
    takeovers: int = 0
    takeovers_at_end: int = 0  # of which at the end of the policy's ticks; the others by the stall trigger
    stall_steps: int | None = None  # the stall trigger's K this round (`stall_steps_for`)
    declined: int = 0  # stalls the expert found no way back from
    dropped: int = 0  # fleet episodes lost by the robots' recorders
    minutes: float = 0.0  # the round's own: its baseline's minutes are apart (`Baseline.minutes`)
    gain_per_1000_expert_frames: float | None = None  # success gained over stable per 1,000 expert frames
    robots: list[dict[str, Any]] = field(default_factory=list)
    stage_s: dict[str, float] = field(default_factory=dict)
    train_split_s: dict[str, float] | None = None  # the training stage's setup, steps and export (`TrainReport.split`)
    demos: DemosTimeline | None = None  # where the expert's demos stage went (None: no demo this round)
    # The canary publish's own seconds (its ONNX export made there), beside the evaluation: stage_s["publish"] is
    # only what it took past the evaluation's end.
    publish_s: float | None = None
    versus_stable: Paired | None = None  # against the stable it began with, scene by scene on the same seeds
    baseline: Baseline | None = None
    fleet_check: FleetCheck | None = None
    trained: bool = True  # False: nothing new to learn (`has_new_draws`), stable kept without training

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RoundsReport:
    loop: LoopReport  # round 0
    settings: RoundSettings
    rounds: list[RoundResult] = field(default_factory=list)
    stable: str | None = None  # the release stable runs at the end

    @property
    def wall_s(self) -> float:
        """The rounds' seconds, round 0's included, the baselines' not (they are the benchmark's, not the loop's)."""
        return self.loop.wall_s + sum(60 * r.minutes for r in self.rounds[1:])

    @property
    def baseline_s(self) -> float:
        return sum(60 * r.baseline.minutes for r in self.rounds if r.baseline is not None)


Round = Callable[["RoundsReport"], None]  # the report so far: after each round's figure, again after its baseline


def run_rounds(
    loop: LoopSettings,
    settings: RoundSettings,
    client: BucketClient,
    on_stage: Stage = lambda stage, msg: None,
    on_train: Callable[[Progress], None] | None = None,
    on_demo: Callable[[str, LoopReport], None] | None = None,
    on_round: Round | None = None,
) -> RoundsReport:
    """Round 0 (`run_loop`), then `settings.rounds` rounds through the fleet (module docstring).

    Raises:
        BadValue: `loop.live` (live mode is its own kind of rounds).
        robotloop.storage.StorageError: the bucket cannot be reached or written.
        RuntimeError: the deploy service did not come up, or every fleet robot failed.
    """
    if loop.live:
        raise BadValue("rounds through the fleet and --live are two ways of running rounds: choose one")
    start = time.monotonic()
    if settings.rounds and loop.ray is None:
        start_fork_server()  # its imports go on beside round 0, not at the start of round 1's fleet
    first = run_loop(loop, client, on_stage, on_train, on_demo)
    report = RoundsReport(first, settings, stable=first.release)
    zero = _round_zero(first, time.monotonic() - start)
    report.rounds.append(zero)
    tell = on_round or (lambda report: None)
    tell(report)
    key = loop.report_dir / "keys" / "deploy.key"
    # The fleet's robots reach it: on this machine, or over the Ray cluster's network when they are its tasks
    host = "127.0.0.1" if loop.ray is None else driver_host(loop.ray)
    service = start_local_deploy_service(loop.report_dir / "deploy", trusted_keys=(public_path(key),), host=host)
    try:
        run = _Rounds(loop, settings, client, DeployClient(service.url, service.token), key, report, on_stage, on_train)
        for k in range(1, settings.rounds + 1):
            result = run.round(k)
            report.rounds.append(result)
            tell(report)  # before the baseline: a run cut during it keeps the round's own figures
            if settings.baseline_beside(k) and result.trained:
                result.baseline = run.baseline(k, result.expert_frames, result.stage_s)
                tell(report)
    finally:
        service.stop()
    return report


def _round_zero(first: LoopReport, seconds: float) -> RoundResult:
    e = first.eval
    frames = first.episodes * get_task(first.settings.task).episode_length
    return RoundResult(
        0,
        first.release or "",
        True,
        e.success_rate,
        e.success_ci95,
        len(e.episodes),
        expert_frames=frames,
        redemo_frames=0,
        minutes=seconds / 60,
        stage_s=dict(first.stage_s),
    )


def fleet_dataset_urls(loop: LoopSettings, robots: int) -> list[str]:
    """The datasets the fleet's robots record into, one per robot (written or not yet)."""
    return [f"{loop.bucket}/datasets/{loop.task}-{loop.run}-fleet-{i + 1}" for i in range(robots)]


def written_fleet_datasets(client: BucketClient, urls: list[str]) -> list[BucketUrl]:
    """Those of the fleet's datasets `urls` with episodes in them, in their order."""
    written = {e["dataset"] for e in fleet_episodes(client, urls)}
    return [BucketUrl.parse(u) for u in urls if u in written]


def dataset_exists(client: BucketClient, url: BucketUrl) -> bool:
    """Whether a dataset was written at `url` (its meta/info.json is there)."""
    try:
        client.stat(BucketUrl.parse(f"{url}/meta/info.json"))
        return True
    except NotFound:
        return False


def baseline_demos_url(loop: LoopSettings) -> BucketUrl:
    """The dataset of the baseline's extra scripted demos, every round's in one."""
    return BucketUrl.parse(f"{loop.bucket}/datasets/{loop.task}-{loop.run}-baseline")


def train_round(
    client: BucketClient,
    loop: LoopSettings,
    settings: RoundSettings,
    datasets: list[BucketUrl],
    run_url: BucketUrl,
    init_from: str,
    on_train: Callable[[Progress], None] | None = None,
    seed: int | None = None,
) -> TrainReport:
    """Train `run_url` on `datasets` as a round does (`round_recipe`): from `init_from` (a checkpoint), or from
    scratch with `settings.from_scratch`; `seed` (default: the loop's) seeds the weights and the sampler.

    Raises:
        robotloop.storage.StorageError: the bucket cannot be read or written.
    """
    steps, act = round_recipe(loop, settings)
    train_settings = TrainSettings(
        steps=steps,
        batch_size=loop.batch_size,
        log_every=max(1, min(50, steps // 10)),
        checkpoint_every=steps,
        seed=loop.seed if seed is None else seed,
        device=loop.device,
        init_from=None if settings.from_scratch else init_from,
        # No ONNX export at the checkpoint: a round's publish makes it in a child process beside the round's
        # evaluation (`Publisher`), and the baseline's and the ablation's checkpoints are never published.
        onnx="off",
    )
    weights = settings.weights
    if settings.data_share is not None:  # the expert's gathered frames drawn as that share of the draws
        extra_demos = {str(url) for url in datasets if url != loop.dataset_url}  # re-demos, baseline demos
        weights = with_share(weights, dataset_frames(client, datasets, weights), extra_demos, settings.data_share)
    data = DataSettings(decode_workers=loop.decode_workers, weights=weights)
    return train(client, datasets, run_url, train_settings, act, data, on_train)


def evaluate_checkpoint(
    client: BucketClient, loop: LoopSettings, checkpoint: BucketUrl, folder: str, seeds: list[int] | None = None
) -> EvalReport:
    """`checkpoint` in the loop's sims: on `seeds`, or on the loop's evaluation seeds; the report under
    `loop.report_dir / folder`."""
    model = resolve_policy(str(checkpoint), lambda: client, loop.report_dir / "checkpoints")
    return evaluate(
        model,
        loop.task,
        len(seeds) if seeds else loop.eval_episodes,
        loop.eval_workers,
        seeds=seeds,
        max_steps=loop.eval_max_steps,
        image_size=loop.image_size,
        videos=0,
        output_dir=loop.report_dir / folder,
        device=loop.device,
        ray=loop.ray,  # each Ray worker downloads the checkpoint itself
        worker_policy=str(checkpoint),
        worker_bucket=(client.endpoint, client.token),
    )


class _Rounds:
    """The state rounds share: the stable release, its checkpoint and score, the datasets so far."""

    def __init__(self, loop, settings, client, deploy, key: Path, report: RoundsReport, on_stage, on_train) -> None:
        self.loop, self.settings, self.client, self.deploy, self.key = loop, settings, client, deploy, key
        self.report, self.on_stage, self.on_train = report, on_stage, on_train
        first = report.loop
        self.stable = first.release
        self.stable_checkpoint = str(checkpoint_url(loop.run_url, first.train.steps))
        self.stable_eval = first.eval  # stable's evaluation, on the seeds every round is evaluated on
        self.round_began_with = first.eval  # the stable evaluation the current round (and its baseline) pair with
        self.round_eval = first.eval  # the current round's own evaluation, which its baseline pairs with
        self.stall_steps = stall_steps_for(loop.task, first.eval, settings.stall_steps)
        self.baseline_checkpoint = self.stable_checkpoint
        self.fleet_datasets = fleet_dataset_urls(loop, settings.fleet)
        self.redemos = BucketUrl.parse(f"{loop.bucket}/datasets/{loop.task}-{loop.run}-redemos")
        self.baseline_demos = baseline_demos_url(loop)
        self.next_baseline_seed = baseline_first_seed(loop.seed)
        self.seen: set[tuple[str, int]] = set()  # (dataset, episode index) of the fleet episodes of earlier rounds

    def round(self, k: int) -> RoundResult:
        s, loop, t0 = self.settings, self.loop, time.monotonic()
        stages: dict[str, float] = {}
        with self._timed(
            stages, "fleet", f"round {k}: {s.fleet} sim robots x {s.fleet_episodes} episodes on {self.stable}"
        ):
            robots = run_fleet(self._robots(k), ray=loop.ray)
        failed = [r for r in robots if r.error]
        if len(failed) == len(robots):
            raise RuntimeError(f"every fleet robot failed in round {k}: {failed[0].error}")
        episodes, branched = split_branches(self._new_episodes())
        check = self._fleet_check(k, episodes, stages) if s.fleet_check else None
        misses = [e for e in episodes if not e["success"]]
        redemo_frames, near_frames, demos = self._expert_demos(k, episodes, misses, stages)
        takeover_frames = sum(e["expert_frames"] for e in episodes)
        branch_frames = sum(e["expert_frames"] for e in branched)
        expert_frames = takeover_frames + branch_frames + redemo_frames + near_frames
        self.round_began_with = self.stable_eval
        stable_before = self.round_began_with.success_rate
        learn = has_new_draws(episodes, s.weights, expert_frames)
        if learn:
            datasets = [loop.dataset_url, *self._written_datasets(redemo_frames + near_frames)]
            release, checkpoint, result, train_split, publish_s = self._train_and_evaluate(k, datasets, stages)
        else:  # fine-tuning stable on the demos it was trained on: nothing to gain, minutes to spend
            self.on_stage("train", f"round {k}: nothing new to learn (no failure, no expert frame): not trained")
            release, checkpoint, result = self.stable, self.stable_checkpoint, self.stable_eval
            train_split = publish_s = None
        self.round_eval = result
        gained = result.success_rate - stable_before
        versus = paired(result, self.round_began_with) if learn else None
        promoted = gained > 0
        if promoted:
            reason = f"round {k}: success {result.success_rate:.0%} beats {stable_before:.0%}"
            self.deploy.promote("stable", release, reason=reason)
            self.stable, self.stable_eval = release, result
            self.stall_steps = stall_steps_for(loop.task, result, s.stall_steps)
            self.stable_checkpoint = checkpoint
            self.report.stable = release
        minutes = (time.monotonic() - t0) / 60
        lo, hi = result.success_ci95
        if learn:
            self.on_stage(
                "evaluate",
                f"round {k}: {release} {result.success_rate:.1%} (CI {lo:.1%}-{hi:.1%}) against stable's "
                f"{stable_before:.1%} ({versus.describe()}), {expert_frames} expert frames, "
                f"{minutes:.1f} min{', promoted' if promoted else ''}",
            )
        return RoundResult(
            k,
            release,
            promoted,
            result.success_rate,
            result.success_ci95,
            len(result.episodes),
            expert_frames=expert_frames,
            takeover_frames=takeover_frames,
            redemo_frames=redemo_frames,
            near_frames=near_frames,
            branch_frames=branch_frames,
            branches=len(branched),
            fleet_episodes=len(episodes),
            fleet_failures=len(misses),
            autonomous_successes=sum(e["success"] and e["kind"] == "autonomous" for e in episodes),
            takeovers=sum(r.takeovers.get("takeovers", 0) for r in robots),
            takeovers_at_end=sum(r.takeovers.get("at_end", 0) for r in robots),
            stall_steps=self.stall_steps,
            declined=sum(r.takeovers.get("declined", 0) for r in robots),
            dropped=sum(r.recording.get("dropped", 0) for r in robots),
            minutes=minutes,
            gain_per_1000_expert_frames=1000 * gained / expert_frames if expert_frames else None,
            trained=learn,
            robots=[_robot_row(r) for r in robots],
            stage_s=stages,
            train_split_s=train_split,
            demos=demos,
            publish_s=publish_s,
            versus_stable=versus,
            fleet_check=check,
        )

    def _train_and_evaluate(
        self, k: int, datasets: list[BucketUrl], stages: dict[str, float]
    ) -> tuple[str, str, EvalReport, dict[str, float], float]:
        """Round `k`'s release and checkpoint, trained on `datasets`, published to canary, its evaluation on
        stable's seeds, where its training's time went (`TrainReport.split`) and the publish's own seconds."""
        s, loop = self.settings, self.loop
        name = f"{loop.run}-r{k}"
        run_url = BucketUrl.parse(f"{loop.bucket}/models/{name}")
        steps = round_recipe(loop, s)[0]
        start = "random init" if s.from_scratch else self.stable
        # The publisher's process starts (its imports) while the round trains; it publishes (its ONNX export made on
        # the CPU) while the checkpoint is evaluated on the GPU: the round's "publish" stage is only what the publish
        # takes past the evaluation.
        with Publisher() as publisher:
            with self._timed(stages, "train", f"round {k}: {steps} steps from {start} on {len(datasets)} datasets"):
                trained = self._train(datasets, run_url, self.stable_checkpoint)
            release = f"{name}-{trained.steps}"
            checkpoint = checkpoint_url(run_url, trained.steps)
            started, publish_s = time.monotonic(), []
            publishing = publisher.publish(self.client, str(run_url), release, self.key, self.deploy, channel="canary")
            publishing.add_done_callback(lambda _: publish_s.append(time.monotonic() - started))
            evaluated = f"{release} on the {loop.eval_episodes} seeds stable was evaluated on"
            with self._timed(stages, "evaluate", evaluated):
                result = self._evaluate(checkpoint, f"eval-r{k}")
            with self._timed(stages, "publish", f"{release} to canary (published beside its evaluation)"):
                publishing.result()
        return release, str(checkpoint), result, trained.split(), publish_s[0]

    # -- stages ------------------------------------------------------------------------------------------------
    @contextmanager
    def _timed(self, stages: dict[str, float], stage: str, what: str) -> Iterator[None]:
        """Announce `stage`, run the block, add its seconds to this round's `stages`."""
        self.on_stage(stage, what)
        t0 = time.monotonic()
        try:
            yield
        finally:
            stages[stage] = stages.get(stage, 0.0) + time.monotonic() - t0

    def _robots(self, k: int) -> list[FleetRobot]:
        s, loop = self.settings, self.loop
        robots, trusted = [], public_path(self.key).read_text()
        for i, record_to in enumerate(self.fleet_datasets):
            robot_id = f"fleet-{i + 1}"
            token = self.deploy.register_robot(robot_id, channel="stable", rotate=True)
            robots.append(
                FleetRobot(
                    robot_id=robot_id,
                    token=token,
                    deploy_url=self.deploy.url,
                    endpoint=self.client.endpoint,
                    storage_token=self.client.token,
                    task=loop.task,
                    image_size=loop.image_size,
                    shadow_map=loop.shadow_map,
                    device=loop.device,
                    first_seed=fleet_first_seed(loop.seed, k, i, s.fleet, s.fleet_episodes),
                    episodes=s.fleet_episodes,
                    policy_steps=loop.eval_max_steps or get_task(loop.task).episode_length,
                    stall_steps=self.stall_steps,
                    record_to=record_to,
                    vcodec="h264",  # fast enough to keep up with a 50 Hz robot on one core (issue 29's rate figure)
                    store=(loop.report_dir / "fleet" / robot_id).resolve(),
                    trusted_keys=trusted,
                    rate_hz=s.fleet_rate_hz,
                    branches=s.branches,
                )
            )
        return robots

    def _new_episodes(self) -> list[dict[str, Any]]:
        """This round's fleet episodes, as the bucket has them (a stable kept from the last round ran those too)."""
        new = [
            e
            for e in fleet_episodes(self.client, self.fleet_datasets)
            if (e["dataset"], e["episode_index"]) not in self.seen
        ]
        self.seen |= {(e["dataset"], e["episode_index"]) for e in new}
        return new

    def _expert_demos(
        self, k: int, episodes: list[dict[str, Any]], misses: list[dict[str, Any]], stages: dict[str, float]
    ) -> tuple[int, int, DemosTimeline | None]:
        """The scripted expert's demos of round `k`: each failed scene again (`redemonstrate`), and fresh scenes near
        those the policy did not win alone (`redemo_near`). Their frames (re-demonstrated, near) and timeline."""
        redo = [e["seed"] for e in misses] if self.settings.redemonstrate else []
        near = self._near_scenes(k, episodes)
        if not (redo or near):
            return 0, 0, None
        parts = [f"re-demonstrates {len(redo)} failed scenes"] if redo else []
        parts += [f"demonstrates {len(near)} scenes near those the policy did not win alone"] if near else []
        with self._timed(stages, "redemo", "the expert " + " and ".join(parts)):
            frames, timeline = self._demonstrate(redo + near)
        return sum(frames.get(seed, 0) for seed in redo), sum(frames.get(seed, 0) for seed in near), timeline

    def _near_scenes(self, k: int, episodes: list[dict[str, Any]]) -> list[int]:
        """`settings.redemo_near` fresh scenes near each fleet scene the policy did not win alone (a takeover, a
        failure): where it is likely to fail again (`robotloop.sim.scenes.nearest_scenes`)."""
        if not self.settings.redemo_near:
            return []
        unwon = [e["seed"] for e in episodes if not (e["success"] and e["kind"] == "autonomous")]
        candidates = near_candidates(self.loop.seed, k)
        return nearest_scenes(self.loop.task, unwon, candidates, self.settings.redemo_near)

    def _demonstrate(self, seeds: list[int]) -> tuple[dict[int, int], DemosTimeline]:
        """The scripted expert on each scene of `seeds`, from its initial state, into the re-demonstrations'
        dataset: the frames committed per seed (a scene the expert failed is not committed), and where the time
        went."""
        loop, frames, start = self.loop, {}, time.monotonic()
        timeline = DemosTimeline(len(seeds), min(loop.record_workers, len(seeds)), on_ray=loop.ray is not None)
        recorder = DatasetRecorder(
            self.client, self.redemos, loop.dataset_spec(), staging=loop.report_dir / "staging-redemos"
        )
        timeline.opened_s = time.monotonic() - start

        def count(kind: str, seed: int, commit: Any) -> None:
            if kind == "committed":
                frames[seed] = commit.frames
                timeline.last_s = time.monotonic() - start
                timeline.first_s = timeline.first_s if timeline.first_s is not None else timeline.last_s
                timeline.upload_s += commit.upload_s

        record_sim(
            recorder,
            loop.task,
            len(seeds),
            loop.record_workers,
            loop.image_size,
            seeds=seeds,
            ray=loop.ray,
            on_event=count,
        )
        return frames, timeline

    def _written_datasets(self, redemo_frames: int) -> list[BucketUrl]:
        """The fleet datasets with episodes in them, and the re-demonstrations once there are any."""
        urls = written_fleet_datasets(self.client, self.fleet_datasets)
        if redemo_frames or dataset_exists(self.client, self.redemos):
            urls.append(self.redemos)
        return urls

    def _train(self, datasets: list[BucketUrl], run_url: BucketUrl, init_from: str) -> TrainReport:
        return train_round(self.client, self.loop, self.settings, datasets, run_url, init_from, self.on_train)

    def _evaluate(self, checkpoint: BucketUrl, folder: str, seeds: list[int] | None = None) -> EvalReport:
        return evaluate_checkpoint(self.client, self.loop, checkpoint, folder, seeds)

    def _fleet_check(self, k: int, episodes: list[dict[str, Any]], stages: dict[str, float]) -> FleetCheck:
        """Stable in lockstep on the seeds of the fleet's episodes, paired with what the robots did alone."""
        alone = {e["seed"]: bool(e["success"] and e["kind"] == "autonomous") for e in episodes if e.get("seed")}
        seeds = sorted(alone)
        with self._timed(
            stages, "fleet_check", f"round {k}: {self.stable} in lockstep on the fleet's {len(seeds)} scenes"
        ):
            report = self._evaluate(BucketUrl.parse(self.stable_checkpoint), f"fleet-check-r{k}", seeds)
        won = {e.seed: e.success for e in report.episodes}
        check = FleetCheck(
            len(seeds),
            sum(alone.values()),
            sum(won.values()),
            sum(alone[x] and not won[x] for x in seeds),
            sum(won[x] and not alone[x] for x in seeds),
        )
        self.on_stage(
            "fleet_check",
            f"round {k}: on the same {check.episodes} scenes the robots won {check.fleet_successes} alone, the "
            f"evaluation {check.eval_successes} ({check.fleet_only} won only by the robots, {check.eval_only} only in "
            "the evaluation)",
        )
        return check

    def baseline(self, k: int, expert_frames: int, stages: dict[str, float]) -> Baseline:
        """As many frames of scripted demos of fresh scenes as the round's expert spent, trained the same way."""
        loop = self.loop
        length = get_task(loop.task).episode_length  # a scripted demo's: it runs the task's whole episode
        demos = max(1, math.ceil(expert_frames / length))
        recorder = DatasetRecorder(
            self.client, self.baseline_demos, loop.dataset_spec(), staging=loop.report_dir / "staging-baseline"
        )
        check_baseline_seeds(loop.seed, self.next_baseline_seed, demos)
        with self._timed(
            stages, "baseline", f"round {k}: {demos} more scripted demos ({expert_frames} frames), same training"
        ):
            rec = record_sim(
                recorder,
                loop.task,
                demos,
                loop.record_workers,
                loop.image_size,
                seed_start=self.next_baseline_seed,
                ray=loop.ray,
            )
            self.next_baseline_seed = rec.next_seed
            run_url = BucketUrl.parse(f"{loop.bucket}/models/{loop.run}-baseline-r{k}")
            trained = self._train([loop.dataset_url, self.baseline_demos], run_url, self.baseline_checkpoint)
            self.baseline_checkpoint = str(checkpoint_url(run_url, trained.steps))
            result = self._evaluate(checkpoint_url(run_url, trained.steps), f"eval-baseline-r{k}")
        frames = sum(c.frames for c in rec.committed)
        minutes = stages["baseline"] / 60
        versus, round_versus = paired(result, self.round_began_with), paired(self.round_eval, result)
        rate, ci95 = result.success_rate, result.success_ci95
        return Baseline(len(rec.committed), frames, rate, ci95, minutes, versus, round_versus)


def _robot_row(r: FleetRobotResult) -> dict[str, Any]:
    return {
        "robot": r.robot_id,
        "episodes": r.finished,
        "recorded": r.recording.get("recorded", 0),
        "dropped": r.recording.get("dropped", 0),
        "unfinished": r.recording.get("unfinished", 0),
        "recording_error": r.recording.get("last_error"),  # why the last dropped episode was lost
        "takeovers": r.takeovers.get("takeovers", 0),
        "expert_frames": r.takeovers.get("expert_frames", 0),
        "branches": r.takeovers.get("branches", 0),  # its expert drives from branch points, apart from those frames
        "branches_declined": r.takeovers.get("branches_declined", 0),
        "control_hz": r.control_hz,
        "bytes_pulled": r.bytes_pulled,
        "error": r.error,
        "backend": r.backend,
        "timings": r.timings,
        "node": r.node,
    }


__all__ = ["STALL_STEPS", "Baseline", "RoundResult", "RoundSettings", "RoundsReport", "run_rounds"]
