"""Evaluate a saved policy in the ALOHA sim: success rate with a confidence interval, rewards, videos.

Episodes run in parallel worker processes, each with its own `AlohaSim` and `PolicyRunner`. Episode `i`
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

import contextlib
import io
import json
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Settings
from ..errors import BadValue
from ..sim.constants import format_image_size
from ..storage import BucketClient

# Policy resolution lives in robotloop.deploy.resolve; pull_release_for, resolve_policy and resolve_release stay
# importable from here.
from .resolve import ResolvedPolicy, locate_policy_for, pull_release_for, resolve_policy, resolve_release
from .runner import PolicyRunner

DEFAULT_SEED = 1000  # lerobot-eval's default start seed
REPORT_FILE = "eval_report.json"
Z_95 = 1.959963984540054  # two-sided 95% normal quantile


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
        }

    def to_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary}

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


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


# -- workers -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Job:
    """What every worker needs to build its sim and runner (picklable)."""

    policy_dir: str
    task: str
    image_size: tuple[int, int] | None
    max_steps: int
    device: str
    video_dir: str | None
    torch_threads: int
    inference: dict | None = None


_worker: dict = {}  # per process: the job, its AlohaSim and PolicyRunner, built once


def _init_worker(job: _Job, runner: PolicyRunner | None = None, parent_pid: int | None = None) -> None:
    """Build this process's sim and runner; `runner` given: the caller's process, whose threads stay as set."""
    import torch

    from ..sim import AlohaSim
    from ..workers import start_worker

    if parent_pid is not None:  # a pool worker: it goes when the evaluating process goes, however that dies
        start_worker(parent_pid)
    if runner is None:
        # N workers share the cores: without this each torch grabs all of them and they thrash.
        torch.set_num_threads(job.torch_threads)
        runner = _load_quietly(Path(job.policy_dir), job.device, job.inference)
    sim = AlohaSim(job.task, image_size=job.image_size, max_episode_steps=job.max_steps)
    _worker.update(job=job, runner=runner, sim=sim)


def _load_quietly(path: Path, device: str, inference: dict | None = None) -> PolicyRunner:
    """PolicyRunner.load without lerobot's "Loading weights" stdout line (once per worker, amid progress bars).

    Swapping sys.stdout is process-wide: fine in an evaluation, which runs nothing else meanwhile."""
    with contextlib.redirect_stdout(io.StringIO()):
        return PolicyRunner.load(path, device, inference)


def _run_episode(index: int, seed: int, record: bool) -> EpisodeResult:
    """One episode in this worker's sim. Raises NonFiniteAction (the policy is broken) to the caller."""
    import torch

    job, runner, sim = _worker["job"], _worker["runner"], _worker["sim"]
    # ACT's eval forward is deterministic; seeding covers policies that sample.
    torch.manual_seed(seed)
    # A state-only policy: the sim renders nothing, so there is nothing to film.
    record = record and job.image_size is not None
    start = time.perf_counter()
    obs = sim.reset(seed=seed)
    runner.reset()
    frames = [obs["pixels"]["top"]] if record else []
    rewards: list[float] = []
    success = False
    while not success and len(rewards) < job.max_steps:
        obs, reward, success, _, _ = sim.step(runner.act(obs))
        rewards.append(reward)
        if record:
            frames.append(obs["pixels"]["top"])
    video = None
    if record and job.video_dir:
        video = str(write_video(Path(job.video_dir) / f"episode_{index:03d}_seed{seed}.mp4", frames))
    return EpisodeResult(
        index,
        seed,
        bool(success),
        max(rewards, default=0.0),
        float(sum(rewards)),
        len(rewards),
        time.perf_counter() - start,
        video,
    )


def write_video(path: Path, frames: list[np.ndarray], fps: int = 50) -> Path:
    """Write uint8 [H, W, 3] RGB frames as an H.264 mp4 with PyAV (odd sizes are padded by one pixel)."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames[0].shape[:2]
    ph, pw = h + h % 2, w + w % 2  # yuv420p needs even sizes
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = pw, ph, "yuv420p"
        for frame in frames:
            if (ph, pw) != (h, w):
                frame = np.pad(frame, ((0, ph - h), (0, pw - w), (0, 0)), mode="edge")
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        container.mux(stream.encode())
    return path


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
    threads_per_worker: int | None = None,
) -> EvalReport:
    """Run `episodes` sim episodes of `task` with the policy in `policy_dir`, `workers` processes in parallel.

    Args:
        policy_dir: a LeRobot `pretrained_model` directory (see `resolve_policy` for URLs and run dirs).
        seed: episode i uses seed `seed + i`.
        max_steps: steps per episode (default: the task's 400).
        image_size: rendered camera size; must be the policy's (the default) since the policy sees pixels.
        videos: record the first `videos` episodes as mp4 under `output_dir/videos/`.
        output_dir: where videos and `eval_report.json` go; None writes nothing.
        on_episode: called in this process as each episode finishes (progress bars).
        source: recorded in the report: where `policy_dir` came from (e.g. the run's bucket URL).
        checkpoint: for the report: the checkpoint `policy_dir` is (`robotloop.deploy.resolve.ResolvedPolicy`).
        inference: overrides of how the policy acts (`PolicyRunner.load`), e.g. temporal ensembling; in the report.
        threads_per_worker: torch threads of each worker (default: the cores shared out among `workers`; less when
            other evaluations run beside this one).

    Raises:
        ValueError: bad arguments, unknown task, or an image size the policy was not trained on.
        PolicyLoadError: the checkpoint cannot be loaded. NonFiniteAction: the policy produced NaN/inf.
    """
    from ..sim import get_task

    spec = get_task(task)  # KeyError/ValueError for an unknown task
    if episodes < 1 or workers < 1 or videos < 0:
        raise BadValue(f"episodes and workers must be >= 1 and videos >= 0, got {episodes}, {workers}, {videos}")
    if videos and output_dir is None:
        raise BadValue("videos need an output_dir to be written to")
    # Load once here: a broken checkpoint fails now, with its own error, not as a broken worker pool.
    runner = _load_quietly(Path(policy_dir), device, inference)
    if set(runner.image_keys) - {"observation.images.top"}:
        raise BadValue(f"the policy reads cameras {runner.image_keys}; the ALOHA sim renders only 'top'")
    trained = runner.image_size
    if image_size is not None and tuple(image_size) != trained:
        raise BadValue(
            f"the policy was trained on {format_image_size(trained)}; it cannot be evaluated at "
            f"{format_image_size(image_size)}"
        )
    steps = max_steps or spec.episode_length
    workers = min(workers, episodes)
    video_dir = str(Path(output_dir) / "videos") if videos else None
    job = _Job(
        str(policy_dir),
        spec.name,
        trained,
        steps,
        device,
        video_dir,
        threads_per_worker or max(1, (os.cpu_count() or 1) // workers),
        inference,
    )
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
    )
    start = time.perf_counter()
    args = [(i, seed + i, i < videos) for i in range(episodes)]
    for result in _run_all(job, args, workers, runner):
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


def _run_all(job: _Job, args: list[tuple[int, int, bool]], workers: int, runner: PolicyRunner):
    """Yield EpisodeResults as they finish: in this process (with `runner`) for one worker, else in a spawn pool."""
    if workers == 1:
        _init_worker(job, runner)
        try:
            for a in args:
                yield _run_episode(*a)
        finally:
            _worker.pop("sim").close()
            _worker.clear()
        return
    # spawn, not fork: MuJoCo's EGL context must be created in the worker, never inherited.
    with ProcessPoolExecutor(
        workers,
        mp_context=mp.get_context("spawn"),
        initializer=_init_worker,
        initargs=(job, None, os.getpid()),
    ) as pool:
        futures = [pool.submit(_run_episode, *a) for a in args]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            for future in futures:
                future.cancel()


def _acting(runner: PolicyRunner) -> dict:
    cfg = runner.policy.config
    return {
        "n_action_steps": cfg.n_action_steps,
        "temporal_ensemble_coeff": cfg.temporal_ensemble_coeff,
        "chunk_size": cfg.chunk_size,
    }


__all__ = [
    "EpisodeResult",
    "EvalReport",
    "default_output_dir",
    "evaluate",
    "locate_and_evaluate",
    "pull_release_for",
    "resolve_policy",
    "resolve_release",
    "wilson_interval",
    "write_video",
]
