"""Evaluate a saved policy in the ALOHA sim: success rate with a confidence interval, rewards, videos.

Episodes run in lockstep (`robotloop.deploy.lockstep`): worker processes step and render the sims, and this
process runs the policy once per step on the whole batch. Episode `i`
uses seed `seed + i` (lerobot-eval's scheme; its default start seed 1000 keeps evaluation clear of the
seeds `robotloop record` starts its demos from, 0 upwards), so a report is reproducible and two policies
evaluated with the same seed face the same object placements.

An episode ends when the task is solved (reward reaches the task's max reward, gym-aloha's `is_success`)
or after `max_steps` steps. Per episode the report keeps the max reward (0..4, the furthest stage reached)
and the sum of rewards (as lerobot-eval's `avg_max_reward` / `avg_sum_reward`).

Example:
    ```python
    >>> report = evaluate(Path("ckpt/pretrained_model"), "transfer_cube", episodes=50, workers=8,
    ...                   videos=3, output_dir=Path("outputs/eval/run1"))
    >>> report.success_rate, report.success_ci95
    (0.82, (0.69, 0.90))
    ```
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Settings
from ..errors import BadInput, BadValue
from ..features import image_key
from ..sim.constants import format_image_size
from ..storage import BucketClient, ensure_endpoint
from .lockstep import SimBatch, Slot, write_video
from .policy import Policy, load_policy

# Policy resolution lives in robotloop.deploy.resolve; pull_release_for, resolve_policy and resolve_release stay
# importable from here.
from .resolve import ResolvedPolicy, locate_policy_for, pull_release_for, resolve_policy, resolve_release
from .runner import PolicyRunner

DEFAULT_SEED = 1000  # lerobot-eval's default start seed
REPORT_FILE = "eval_report.json"
Z_95 = 1.959963984540054  # two-sided 95% normal quantile
# Episodes in one wave (`evaluate`'s `batch`): 200 Insertion sims at 480x640 hold 184 MB of frames in shared memory
# and one EGL context each.
MAX_BATCH = 256


@dataclass(frozen=True)
class EpisodeResult:
    """One evaluation episode."""

    index: int
    seed: int
    success: bool  # reward reached the task's max reward (the episode stops there)
    max_reward: float  # furthest reward stage reached, 0..max_reward
    sum_reward: float  # rewards summed over the steps run
    steps: int
    wall_s: float
    video: str | None = None  # path of its mp4, when recorded
    stage_steps: tuple[int, ...] = ()  # the step at which each reward stage (1, 2, ...) was first reached

    @property
    def longest_stall(self) -> int:
        """The most steps the episode went without reaching a new stage (from its start, between stages): what a
        stall trigger's K must exceed not to cut an episode like this one short."""
        marks = (0, *self.stage_steps, *(() if self.success else (self.steps,)))
        return max((b - a for a, b in itertools.pairwise(marks)), default=self.steps)


def describe_failures(failures: dict[str, int]) -> str | None:
    """`EvalReport.failures_by_stage` in words, e.g. "failed episodes got as far as: peg on the socket 11, both
    lifted 25"; None when nothing failed."""
    if not failures:
        return None
    return "failed episodes got as far as: " + ", ".join(f"{stage} {n}" for stage, n in failures.items())


def describe_acting(inference: dict | None) -> str | None:
    """How the policy acted (`EvalReport.inference`) in words; None when not known (an evaluation made elsewhere).

    Example:
        ```python
        >>> describe_acting({"n_action_steps": 100, "temporal_ensemble_coeff": None, "chunk_size": 100})
        'acting in whole chunks of 100 actions'
        >>> describe_acting({"n_action_steps": 1, "temporal_ensemble_coeff": 0.01, "chunk_size": 100})
        "acting with ACT's temporal ensembling (0.01), a model pass every step"
        ```
    """
    if not inference or inference.get("n_action_steps") is None:
        return None
    if (coeff := inference.get("temporal_ensemble_coeff")) is not None:
        return f"acting with ACT's temporal ensembling ({coeff:g}), a model pass every step"
    steps, chunk = inference["n_action_steps"], inference.get("chunk_size")
    if steps == chunk:
        return f"acting in whole chunks of {steps} actions"
    return f"acting on {steps} of each chunk's {chunk or '?'} actions, then a new chunk"


@dataclass
class LockstepTime:
    """Where a local evaluation's time went: the policy's batched forward passes in this process (the copies to the
    device and the wait for its result included) against stepping and rendering the sims in the worker processes
    (the slowest worker of each step, the pipes included). What to speed up next, measured on every run."""

    steps: int = 0  # lockstep steps, over all waves
    policy_s: float = 0.0
    sims_s: float = 0.0  # resets included
    # Per sim worker process: its time resetting and stepping its sims (what `sims_s` waits on, less the pipes and
    # the wait for the slowest worker), of that the time rendering frames, and the frames it rendered.
    workers_busy_s: list[float] = field(default_factory=list)
    workers_render_s: list[float] = field(default_factory=list)
    workers_frames: list[int] = field(default_factory=list)

    def add(self, policy_s: float, sims_s: float, steps: int = 1) -> None:
        self.steps += steps
        self.policy_s += policy_s
        self.sims_s += sims_s

    def add_workers(self, busy: list[tuple[float, float, int]]) -> None:
        """`SimBatch.busy()` of a batch that ran, added to what earlier batches' workers spent."""
        if not self.workers_busy_s:
            self.workers_busy_s, self.workers_render_s = [0.0] * len(busy), [0.0] * len(busy)
            self.workers_frames = [0] * len(busy)
        for i, (busy_s, render_s, frames) in enumerate(busy):
            self.workers_busy_s[i] += busy_s
            self.workers_render_s[i] += render_s
            self.workers_frames[i] += frames


@dataclass
class EvalReport:
    """All episodes of one evaluation, with the aggregates lerobot-eval reports plus a 95% Wilson interval."""

    policy: str
    task: str
    seed: int
    max_steps: int
    image_size: tuple[int, int] | None
    workers: int
    episodes: list[EpisodeResult] = field(default_factory=list)
    wall_s: float = 0.0
    source: str | None = None  # what the policy was resolved from (a bucket URL), when not `policy` itself
    checkpoint: str | None = None  # the checkpoint that was (a run's "latest" resolved to a step; a release name)
    inference: dict | None = None  # how the policy acted: n_action_steps, temporal_ensemble_coeff
    nodes: dict[str, list[int]] = field(default_factory=dict)  # with Ray: the episodes each node's workers ran
    lockstep: LockstepTime | None = None  # the process pool's split of the time (None: on Ray, each actor's own)
    shadow_map: int | None = None  # the side of the sims' shadow maps (None: nothing rendered)

    @property
    def successes(self) -> int:
        return sum(e.success for e in self.episodes)

    @property
    def success_rate(self) -> float:
        return self.successes / len(self.episodes) if self.episodes else 0.0

    @property
    def success_ci95(self) -> tuple[float, float]:
        """95% Wilson score interval of the success rate (sound at 0%, 100% and small n, unlike p ± 1.96 SE)."""
        return wilson_interval(self.successes, len(self.episodes))

    @property
    def mean_max_reward(self) -> float:
        return self._mean("max_reward")

    @property
    def mean_sum_reward(self) -> float:
        return self._mean("sum_reward")

    def _mean(self, name: str) -> float:
        values = [getattr(e, name) for e in self.episodes]
        return float(np.mean(values)) if values else 0.0

    @property
    def videos(self) -> list[str]:
        return [e.video for e in self.episodes if e.video]

    @property
    def summary(self) -> dict:
        """The aggregates, as the report file's `summary` holds them (and the agent's tool answers them)."""
        return {
            "successes": self.successes,
            "n_episodes": len(self.episodes),
            "success_rate": self.success_rate,
            "success_ci95": list(self.success_ci95),
            "mean_max_reward": self.mean_max_reward,
            "mean_sum_reward": self.mean_sum_reward,
            "longest_stall_in_successes": self.longest_stall_in_successes,
            "failures_by_stage": self.failures_by_stage,
        }

    @property
    def failures_by_stage(self) -> dict[str, int]:
        """Failed episodes by the furthest reward stage they reached, named, furthest first: where the policy fails
        (Insertion's failures stopping at "both lifted" never brought the peg to the socket)."""
        from ..sim import get_task

        spec = get_task(self.task)
        reached = sorted((e.max_reward for e in self.episodes if not e.success), reverse=True)
        return dict(collections.Counter(spec.stage_name(r) for r in reached))

    @property
    def longest_stall_in_successes(self) -> dict[str, int] | None:
        """Median, 90th percentile and max of the successful episodes' `longest_stall`: a stall trigger with K above
        the max never takes over an episode that the policy goes on to finish at this pace. None: no success."""
        stalls = [e.longest_stall for e in self.episodes if e.success and e.stage_steps]
        if not stalls:
            return None
        p50, p90 = np.percentile(stalls, [50, 90], method="inverted_cdf")  # nearest rank: steps some episode took
        return {"p50": int(p50), "p90": int(p90), "max": max(stalls)}

    def to_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary}

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> EvalReport:
        """An evaluation `save` wrote (an `eval_report.json`): what it evaluated and its episodes, to compare with
        (`paired`); how its time went is not read back.

        Raises:
            BadInput: no such file, or not an evaluation report.
        """
        try:
            data = json.loads(Path(path).read_text())
            episodes = [
                EpisodeResult(**{**e, "stage_steps": tuple(e.get("stage_steps") or ())}) for e in data["episodes"]
            ]
            size = data.get("image_size")
            return cls(
                data["policy"],
                data["task"],
                int(data["seed"]),
                int(data["max_steps"]),
                tuple(size) if size else None,
                int(data["workers"]),
                episodes,
                source=data.get("source"),
                checkpoint=data.get("checkpoint"),
                inference=data.get("inference"),
            )
        except OSError as error:
            raise BadInput(f"cannot read the evaluation report {path}: {error.strerror or error}") from None
        except (ValueError, KeyError, TypeError) as error:  # JSON's errors are ValueErrors
            raise BadInput(f"{path} is not an evaluation report (eval_report.json): {error!r}") from None


@dataclass(frozen=True)
class Paired:
    """Two evaluations of the same seeds compared scene by scene (`paired`): the scenes the first `won` and the
    second lost, those it `lost`, and the exact two-sided sign test's `p_value` on them. Scenes both won or both lost
    say nothing of which policy is better; paired, a difference of a few points can be told from the noise where
    two success intervals overlap."""

    won: int
    lost: int
    p_value: float

    def describe(self) -> str:
        return (
            f"{self.won} scene{'s' if self.won != 1 else ''} won, {self.lost} lost (sign test p = {self.p_value:.2g})"
        )


def paired(new: EvalReport, old: EvalReport) -> Paired:
    """`new` against `old` on the seeds both ran.

    Example:
        ```python
        >>> paired(round_eval, stable_eval).describe()
        '4 scenes won, 6 lost (sign test p = 0.75)'
        ```

    Raises:
        BadValue: the two evaluations share no seed.
    """
    before = {e.seed: e.success for e in old.episodes}
    pairs = [(e.success, before[e.seed]) for e in new.episodes if e.seed in before]
    if not pairs:
        raise BadValue(f"{new.policy} and {old.policy} were evaluated on no common seed: nothing to pair")
    won = sum(now and not then for now, then in pairs)
    lost = sum(then and not now for now, then in pairs)
    return Paired(won, lost, sign_test(won, lost))


def sign_test(won: int, lost: int) -> float:
    """The exact two-sided sign test's p-value: how likely a split at least this uneven is if each discordant scene
    were a coin toss (1.0 with none). Written out rather than scipy's `binomtest` (the same figure): robotloop does
    not depend on scipy, and this module is the robot's too."""
    n = won + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(won, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when n is 0.

    Example:
        ```python
        >>> wilson_interval(8, 10)
        (0.49015..., 0.94332...)
        ```
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 and n successes the bounds are exactly 0 and 1; rounding would leave them a hair inside.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def _load_quietly(path: Path, device: str, inference: dict | None = None, backend: str = "torch") -> Policy:
    """`load_policy` without lerobot's "Loading weights" stdout line (amid progress bars).

    Swapping sys.stdout is process-wide: fine in an evaluation, which runs nothing else meanwhile."""
    with contextlib.redirect_stdout(io.StringIO()):
        return load_policy(path, backend, device, inference)


# -- episodes in lockstep -----------------------------------------------------------------------------
def _run_local(
    runner: Policy, start: Callable[[], SimBatch], slots: list[Slot], time_split: LockstepTime
) -> Iterator[EpisodeResult]:
    """`slots` on this machine's batch of sim processes (`start()`), closed once the last episode is out."""
    with start() as sims:
        yield from _run_lockstep(runner, sims, slots, sims.max_steps, time_split)
        time_split.add_workers(sims.busy())


def _run_lockstep(
    runner: Policy, sims: SimBatch, slots: list[Slot], max_steps: int, time_split: LockstepTime | None = None
) -> Iterator[EpisodeResult]:
    """Run `slots` in waves of the batch's size; yield each episode as it ends (a filmed one once its wave's videos
    are written). `time_split` adds up where the time went."""
    time_split = time_split or LockstepTime()
    for first in range(0, len(slots), sims.size):
        wave = slots[first : first + sims.size]
        filmed = []
        for result in _run_wave(runner, sims, wave, max_steps, time_split):
            if wave[result.index - wave[0].index].record:
                filmed.append(result)
            else:
                yield result
        videos = sims.videos()
        for result in filmed:
            yield replace(result, video=videos.get(result.index))


def _run_wave(
    runner: Policy, sims: SimBatch, wave: list[Slot], max_steps: int, time_split: LockstepTime
) -> Iterator[EpisodeResult]:
    """One wave, one policy forward pass per step for all its episodes. An episode ends at success or after
    `max_steps` steps; a finished episode's sim idles while the rest of its wave runs on."""
    n = len(wave)
    if runner.backend == "torch":
        import torch

        torch.manual_seed(wave[0].seed)  # ACT's eval forward is deterministic; this covers policies that sample
    resetting = time.perf_counter()
    images, states = sims.reset(wave)
    time_split.add(0.0, time.perf_counter() - resetting, steps=0)
    runner.reset()
    start = time.perf_counter()
    steps, sums, best, done = np.zeros(n, int), np.zeros(n), np.zeros(n), np.zeros(n, bool)
    reached: list[list[int]] = [[] for _ in range(n)]  # per episode: the step each stage was first reached

    def result(j: int) -> EpisodeResult:
        s = wave[j]
        wall = time.perf_counter() - start
        return EpisodeResult(
            s.index, s.seed, bool(done[j]), float(best[j]), float(sums[j]), int(steps[j]), wall, None, tuple(reached[j])
        )

    for _ in range(max_steps):
        active = ~done
        acting = time.perf_counter()
        actions = runner.act_batch({"top": images} if images is not None else {}, states)
        stepping = time.perf_counter()
        # Midway through a chunk the policy will not look at the next frames: the sims skip rendering them, which
        # was nearly all of an evaluation's time acting in whole chunks (BENCHMARKS.md, "Frames the policy sees").
        images, states, rewards, successes = sims.step(actions, active, frames=runner.at_chunk_boundary)
        time_split.add(stepping - acting, time.perf_counter() - stepping)
        steps[active] += 1
        sums[active] += rewards[active]
        for j in np.flatnonzero(active & (rewards > best)):  # a jump of two stages reaches both at this step
            reached[j].extend([int(steps[j])] * (int(rewards[j]) - len(reached[j])))
        best[active] = np.maximum(best[active], rewards[active])
        for j in np.flatnonzero(active & successes):
            done[j] = True
            yield result(j)
        if done.all():
            return
    for j in np.flatnonzero(~done):
        yield result(j)


def wave_size(episodes: int, batch: int | None = None) -> int:
    """Episodes run at once: `batch`, else all of them in the fewest waves of at most `MAX_BATCH`, as even as can be.

    Each sim worker holds a fixed slice of the batch's rows, so a short last wave (400 episodes as 256 then 144)
    leaves the workers past its rows idle while the rest step as many sims as in a full wave; 2 waves of 200 do the
    same episodes with every worker busy in both (BENCHMARKS.md, "Rounds on one H100, ... 400 seeds").

    Example:
        ```python
        >>> wave_size(400), wave_size(300), wave_size(200), wave_size(400, batch=64)
        (200, 150, 200, 64)
        ```
    """
    if batch:
        return min(episodes, batch)
    waves = max(1, math.ceil(episodes / MAX_BATCH))
    return math.ceil(episodes / waves)


# -- evaluation ----------------------------------------------------------------------------------------
def evaluate(
    policy_dir: Path,
    task: str,
    episodes: int,
    workers: int = 1,
    *,
    seed: int = DEFAULT_SEED,
    max_steps: int | None = None,
    image_size: tuple[int, int] | None = None,
    videos: int = 0,
    output_dir: Path | None = None,
    device: str = "cpu",
    on_episode: Callable[[EpisodeResult], None] | None = None,
    source: str | None = None,
    checkpoint: str | None = None,
    inference: dict | None = None,
    batch: int | None = None,
    backend: str = "torch",
    seeds: list[int] | None = None,
    ray: str | None = None,
    worker_policy: str | None = None,
    worker_bucket: tuple[str, str | None] | None = None,
    shadow_map: int | None = None,
) -> EvalReport:
    """Run `episodes` sim episodes of `task` with the policy in `policy_dir`, `workers` processes in parallel.

    Args:
        policy_dir: a LeRobot `pretrained_model` directory (see `resolve_policy` for URLs and run dirs).
        seed: episode i uses seed `seed + i`.
        seeds: the episodes' seeds instead, in order (e.g. the scenes a fleet ran); `episodes` must be their count.
        max_steps: steps per episode (default: the task's 400).
        image_size: rendered camera size; must be the policy's (the default) since the policy sees pixels.
        videos: record the first `videos` episodes as mp4 under `output_dir/videos/`.
        output_dir: where videos and `eval_report.json` go; None writes nothing.
        on_episode: called in this process as each episode finishes (progress bars).
        source: recorded in the report: where `policy_dir` came from (e.g. the run's bucket URL).
        checkpoint: for the report: the checkpoint `policy_dir` is (`robotloop.deploy.resolve.ResolvedPolicy`).
        inference: overrides of how the policy acts (`PolicyRunner.load`), e.g. temporal ensembling; in the report.
        workers: processes stepping and rendering the sims; the policy runs in this process, on the whole batch.
        batch: episodes run at once, one policy forward pass per step for all of them (default: all of them, or
            the fewest even waves of at most `MAX_BATCH`: `wave_size`); more episodes run in waves of this size.
        backend: what runs the policy (`robotloop.deploy.policy.load_policy`): ``torch`` (the checkpoint), ``onnx``
            (a release's ONNX export on ONNX Runtime: what a robot without torch runs) or ``auto``.
        ray: run the waves on `workers` Ray actors of this cluster (`robotloop.cluster.check_address`), each with
            a policy of its own, instead of the process pool (see `robotloop.cluster.eval`). A wave's episodes
            are those of the same wave without Ray: the same `batch` gives the same episodes.
        worker_policy: with `ray`, what each actor locates the policy from on its node (default `policy_dir`): a
            checkpoint URL, so that every node downloads the same step from the bucket.
        worker_bucket: with `ray`, the bucket endpoint and token actors download a `worker_policy` URL with.
        shadow_map: side of the sims' shadow maps (default: those the policy's data was recorded with,
            `PolicyRunner.shadow_map`, else `robotloop.sim.constants.shadow_map_size` of the camera, gym-aloha's 4096
            at 480x640). Smaller renders faster on a GPU and moves a few pixels at shadow edges: given for a policy
            recorded with other maps, what success that costs is what this measures.

    Raises:
        ValueError: bad arguments, unknown task, or an image size the policy was not trained on.
        PolicyLoadError: the checkpoint cannot be loaded (BackendUnavailable: not with `backend`).
        NonFiniteAction: the policy produced NaN/inf.
        robotloop.cluster.RayUnavailable: with `ray`, no Ray or no cluster there, or workers kept dying.
    """
    from ..sim import get_task
    from ..sim.constants import check_shadow_map, rendered_shadow_map

    spec = get_task(task)  # KeyError/ValueError for an unknown task
    check_shadow_map(shadow_map)
    if episodes < 1 or workers < 1 or videos < 0 or (batch is not None and batch < 1):
        raise BadValue(
            f"episodes, workers and batch must be >= 1 and videos >= 0, got {episodes}, {workers}, {batch}, {videos}"
        )
    if videos and output_dir is None:
        raise BadValue("videos need an output_dir to be written to")
    if seeds is not None and len(seeds) != episodes:
        raise BadValue(f"{len(seeds)} seeds given for {episodes} episodes")
    # Load once here: a broken checkpoint fails now, with its own error, not as a broken worker pool.
    runner = _load_quietly(Path(policy_dir), device, inference, backend)
    if set(runner.image_keys) - {image_key("top")}:
        raise BadValue(f"the policy reads cameras {runner.image_keys}; the ALOHA sim renders only 'top'")
    trained = runner.image_size
    if shadow_map is None:  # render as the policy's data was rendered
        shadow_map = runner.shadow_map
    if image_size is not None and tuple(image_size) != trained:
        raise BadValue(
            f"the policy was trained on {format_image_size(trained)}; it cannot be evaluated at "
            f"{format_image_size(image_size)}"
        )
    steps = max_steps or spec.episode_length
    if ray is None:
        size = wave_size(episodes, batch)
        workers = min(workers, size)
    else:  # each Ray worker runs whole waves: by default one per worker, so that all of them have one
        size = min(episodes, batch or math.ceil(episodes / workers), MAX_BATCH)
        workers = min(workers, math.ceil(episodes / size))
    video_dir = str(Path(output_dir) / "videos") if videos else None
    report = EvalReport(
        str(policy_dir),
        spec.name,
        seed,
        steps,
        trained,
        workers,
        source=source,
        checkpoint=checkpoint,
        inference=_acting(runner),
        shadow_map=rendered_shadow_map(shadow_map, *trained) if trained is not None else None,  # None: no camera
    )
    start = time.perf_counter()
    # A state-only policy: the sim renders nothing, so there is nothing to film.
    film = videos if trained is not None else 0
    slots = [Slot(i, seeds[i] if seeds is not None else seed + i, i < film) for i in range(episodes)]
    if ray is not None:
        from ..cluster.eval import EvalJob, evaluate_on_ray

        policy = worker_policy or str(policy_dir)
        job = EvalJob(policy, worker_bucket, spec.name, steps, trained, device, inference, backend, shadow_map)
        results = evaluate_on_ray(ray, job, slots, size, workers, video_dir, report.nodes)
    else:
        report.lockstep = LockstepTime()
        start_sims = functools.partial(
            SimBatch, spec.name, size, workers, trained, steps, video_dir, shadow_map=shadow_map
        )
        results = _run_local(runner, start_sims, slots, report.lockstep)
    with contextlib.closing(results):  # a failing on_episode closes the workers now, not when collected
        for result in results:
            report.episodes.append(result)
            if on_episode is not None:
                on_episode(result)
    report.episodes.sort(key=lambda e: e.index)
    report.wall_s = time.perf_counter() - start
    if output_dir is not None:
        report.save(Path(output_dir) / REPORT_FILE)
    return report


def default_output_dir(task: str, root: Path = Path("outputs/eval")) -> Path:
    """Where an evaluation's videos and report go when the caller names no folder: `<root>/<time>_<task>`."""
    return root / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{task}"


def locate_and_evaluate(
    settings: Settings,
    policy: str,
    task: str,
    episodes: int,
    workers: int = 1,
    *,
    output_dir: Path,
    client_factory: Callable[[], BucketClient] | None = None,
    on_located: Callable[[ResolvedPolicy], None] | None = None,
    **options: Any,
) -> EvalReport:
    """`robotloop eval` and the agent's `evaluate_policy` tool: the task checked, `policy` (a folder, a bucket URL
    or a release name) located with robotloop's settings (`locate_policy_for`), then evaluated (`evaluate`), the
    report saved under `output_dir` and naming what `policy` resolved to.

    Args:
        on_located: called with what `policy` resolved to before the first episode (the CLI prints the step).
        options: `evaluate`'s keyword arguments (seed, max_steps, image_size, videos, device, on_episode, ...).

    Raises:
        BadInput: an unknown task (before anything is downloaded) or bad arguments; PolicyLoadError, and for
        release names the deploy service's errors: see `locate_policy_for` and `evaluate`.
    """
    from ..sim import get_task

    get_task(task)  # an unknown task fails before a checkpoint is downloaded
    found = locate_policy_for(settings, policy, client_factory)
    if on_located is not None:
        on_located(found)
    if options.get("ray") is not None and found.checkpoint.startswith("hf://"):
        # Each Ray worker downloads the step "latest" resolved to here, through the endpoint this process uses (the
        # embedded server's when it started one); a folder or a release is read where it is (one machine).
        options["worker_policy"] = found.checkpoint
        options["worker_bucket"] = ensure_endpoint(settings)
    return evaluate(
        found.path,
        task,
        episodes,
        workers,
        output_dir=output_dir,
        source=policy,
        checkpoint=found.checkpoint,
        **options,
    )


def _acting(runner: Policy) -> dict:
    if isinstance(runner, PolicyRunner):
        cfg = runner.policy.config
        acting = (cfg.n_action_steps, cfg.temporal_ensemble_coeff, cfg.chunk_size)
    else:  # the ONNX export's own description of how it acts
        acting = (runner.n_action_steps, runner.temporal_ensemble_coeff, runner.chunk_size)
    keys = ("n_action_steps", "temporal_ensemble_coeff", "chunk_size")
    return {**dict(zip(keys, acting, strict=True)), "backend": runner.backend, "runs_on": runner.runs_on}


__all__ = [
    "EpisodeResult",
    "EvalReport",
    "Paired",
    "default_output_dir",
    "evaluate",
    "locate_and_evaluate",
    "paired",
    "pull_release_for",
    "resolve_policy",
    "resolve_release",
    "sign_test",
    "wilson_interval",
    "write_video",
]
