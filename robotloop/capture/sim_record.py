"""Record scripted sim demonstrations into a bucket: N sim workers in parallel, one committing recorder.

Workers run the scripted expert, render and encode the episode's video (the expensive parts, ~3.8 s of encode for
a 400-frame 480x640 demo); the main process only appends each successful demo to the dataset and uploads it, as
soon as it arrives. Failed demos are never kept (nor encoded): they are dropped, counted and reported by seed.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadValue
from ..sim.tasks import TASKS
from ..workers import start_worker
from .recorder import CommitReport, DatasetRecorder, DatasetSpec, EpisodeWriter, WrittenEpisode, lerobot_frame

TASK_TEXT = {name: spec.text for name, spec in TASKS.items()}  # the sim tasks recordable, by name


@dataclass
class RecordReport:
    """The outcome of one `record_sim` call."""

    task: str
    committed: list[CommitReport] = field(default_factory=list)
    failed_seeds: list[int] = field(default_factory=list)
    attempted: int = 0
    wall_s: float = 0.0
    next_seed: int = 0  # the first seed this call did not use: where a later recording into the dataset starts

    @property
    def episodes_per_minute(self) -> float:
        return 60 * len(self.committed) / self.wall_s if self.wall_s else 0.0

    @property
    def success_rate(self) -> float:
        return 1 - len(self.failed_seeds) / self.attempted if self.attempted else 0.0


@dataclass(frozen=True)
class _Target:
    """Where a worker writes its encoded episode: the recorder's spec, dataset id and staging (picklable)."""

    spec: DatasetSpec
    repo_id: str
    staging: Path


def _demo(
    task: str, seed: int, image_size: tuple[int, int], max_steps: int | None, target: _Target, keep_failed: bool
) -> tuple[int, bool, WrittenEpisode | None]:
    from ..sim import get_task, record_demo  # imported in the worker: each process owns its own MuJoCo and renderer

    spec = get_task(task)
    # The frames stream into the encoder while the replay renders the next ones, so the demo's end leaves only
    # the encoder's tail (a failed demo's files are dropped).
    writer = EpisodeWriter(target.spec, target.repo_id, target.staging, max_frames=max_steps or spec.episode_length)

    def stream(frame, state, action, reward) -> None:
        solved = reward >= spec.max_reward
        writer.add(lerobot_frame(target.spec, {"top": frame}, state, action, reward, solved, TASK_TEXT[task]))

    try:
        demo = record_demo(task, seed, image_size, max_steps, on_step=stream, shadow_map=target.spec.shadow_map)
    except BaseException:  # a frame the writer refused has been discarded already; the sim's own errors not
        writer.discard()
        raise
    if not (demo.success or keep_failed):
        writer.discard()
        return seed, False, None
    return seed, demo.success, writer.finish()


def _init_worker(parent_pid: int) -> None:
    """A sim worker dies with its parent, and keeps ffmpeg's notes about each demo's video to itself ("moving the
    moov atom ..." on every encode, printed once lerobot hands logging back to ffmpeg; errors still show)."""
    import av

    start_worker(parent_pid)
    av.logging.set_libav_level(av.logging.ERROR)


def check_task(task: str) -> None:
    """Raises BadValue naming the choices when `task` is not a sim task robotloop records (check it before
    touching a dataset: a wrong task is the caller's first mistake to hear about)."""
    if task not in TASK_TEXT:
        raise BadValue(f"unknown sim task '{task}'; choose one of {', '.join(sorted(TASK_TEXT))}")


def record_sim(
    recorder: DatasetRecorder,
    task: str,
    episodes: int,
    workers: int = 1,
    image_size: tuple[int, int] = (480, 640),
    max_steps: int | None = None,
    seed_start: int = 0,
    max_attempts: int | None = None,
    keep_failed: bool = False,
    on_event: Callable[[str, int, CommitReport | None], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    seeds: Sequence[int] | None = None,
    ray: str | None = None,
) -> RecordReport:
    """Record `episodes` successful scripted demos of `task` into `recorder`'s dataset, filmed as its spec says
    (`DatasetSpec.shadow_map`: the lights' shadow maps).

    Seeds run from `seed_start` upwards; `seeds` instead gives the scenes to demonstrate, each tried once (the
    re-demonstrations of a fleet's failed episodes). A failed demo is reported in `failed_seeds` and dropped, or with
    `keep_failed` committed marked as failed (`next.success` never true) and counted as an episode; the
    next seed is tried, up to `max_attempts` seeds (default 2 x episodes).
    `on_event(kind, seed, report)` is called with kind "committed" or "failed" (for progress bars).
    `should_stop()` is asked after each finished demo: once True, no new demo starts; demos already running
    finish and are committed (so stopping waits for them).
    `ray`: run the demos on `workers` Ray actors of this cluster (`robotloop.cluster.check_address`) instead of
    the process pool; each commits its own episodes (see `robotloop.cluster.record`). Same seeds, same demos.

    Raises:
        BadValue: unknown task. robotloop.cluster.RayUnavailable: with `ray`, no Ray or no cluster there.
    """
    check_task(task)
    max_attempts = len(seeds) if seeds is not None else max_attempts or 2 * episodes
    report, start = RecordReport(task), time.perf_counter()
    candidates = iter(seeds) if seeds is not None else itertools.count(seed_start)
    next_seed, tried = seed_start, 0
    if ray is not None:
        from ..cluster.record import RecordJob, record_on_ray

        client = recorder.client
        job = RecordJob(
            client.endpoint, client.token, str(recorder.url), recorder.spec, task, image_size, max_steps, keep_failed
        )
        next_seed = record_on_ray(ray, job, workers, episodes, candidates, max_attempts, report, on_event, should_stop)
        report.wall_s, report.next_seed = time.perf_counter() - start, max(next_seed, seed_start)
        return report
    target = _Target(recorder.spec, recorder.url.bucket_id, recorder.staging)
    # spawn, not fork: MuJoCo's EGL context must be created in the worker, never inherited.
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(os.getpid(),)
    ) as pool:
        pending: set[Future] = set()

        def submit() -> None:
            nonlocal next_seed, tried
            seed = next(candidates)
            pending.add(pool.submit(_demo, task, seed, image_size, max_steps, target, keep_failed))
            next_seed, tried = max(next_seed, seed + 1), tried + 1

        while len(pending) < workers and tried < max_attempts:
            submit()
        while pending and len(report.committed) < episodes:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                seed, success, written = future.result()
                if len(report.committed) >= episodes:
                    _discard(written)
                    continue
                report.attempted += 1
                if not success:
                    report.failed_seeds.append(seed)
                    _notify(on_event, "failed", seed, None)
                if written is not None:
                    report.committed.append(recorder.commit_written(written))
                    _notify(on_event, "committed", seed, report.committed[-1])
                if should_stop():
                    pending = {f for f in pending if not f.cancel()}  # queued demos go; running ones finish
                elif len(report.committed) + len(pending) < episodes and tried < max_attempts:
                    submit()
        for future in pending:
            future.cancel()
    report.wall_s, report.next_seed = time.perf_counter() - start, next_seed
    return report


def _discard(written: WrittenEpisode | None) -> None:
    """A demo encoded after enough were committed: its staged files go."""
    import shutil

    if written is not None:
        shutil.rmtree(Path(written.root).parent, ignore_errors=True)


def _notify(callback, kind: str, seed: int, commit: CommitReport | None) -> None:
    if callback is not None:
        callback(kind, seed, commit)
