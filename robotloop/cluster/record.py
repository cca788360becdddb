"""`robotloop record --ray`: scripted sim demos on Ray actors, each committing its own episodes to the bucket.

Without Ray, pool workers encode each demo into the recorder's staging folder and the driver commits it. Across
nodes the driver would have to fetch every encoded episode first, so here the actor that encoded a demo commits it
too, with a `DatasetRecorder` of its own (its node's staging folder: actors on one node share it, as recorders on
one machine do). Commits to one dataset must not overlap (each grows the same files), so the driver hands out the
turn to commit, one actor at a time, in the order the demos finished; sims and encoders run on meanwhile.

Faults: an actor that dies during a demo loses that demo; its seed runs again on a fresh actor (`ATTEMPTS` runs,
then it is reported failed). One that dies during its commit leaves the dataset as its metadata says (the commit
uploads metadata last); its seed runs again.

Example:
    ```python
    >>> report = record_sim(recorder, "transfer_cube", episodes=50, workers=8, ray="auto")
    ```
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..capture.recorder import CommitReport, DatasetRecorder, DatasetSpec, WrittenEpisode
from ..capture.sim_record import RecordReport, _demo, _discard, _notify, _Target
from . import ATTEMPTS, call_error, ray_session, worker_died
from .eval import _close


@dataclass(frozen=True)
class RecordJob:
    """What every recording actor needs (picklable: sent once per actor)."""

    endpoint: str
    token: str | None
    url: str  # the dataset's bucket URL
    spec: DatasetSpec
    task: str
    image_size: tuple[int, int]
    max_steps: int | None
    keep_failed: bool


class RecordWorker:
    """A Ray actor (`ray.remote(RecordWorker)`): runs scripted demos, holds the last one encoded until told to commit
    it or drop it."""

    def __init__(self, job: RecordJob) -> None:
        import av

        from ..output import log_to_console, quiet_libraries
        from ..storage import BucketClient, BucketUrl

        quiet_libraries()
        log_to_console()
        av.logging.set_libav_level(av.logging.ERROR)  # as the pool's workers: no "moov atom" note per episode
        self.job = job
        self.recorder = DatasetRecorder(BucketClient(job.endpoint, job.token), BucketUrl.parse(job.url), job.spec)
        self.written: WrittenEpisode | None = None

    def demo(self, seed: int) -> tuple[bool, bool]:
        """Run and encode the demo of `seed`: (the expert succeeded, an episode waits to be committed)."""
        self.discard()
        job, rec = self.job, self.recorder
        target = _Target(rec.spec, rec.url.bucket_id, rec.staging)
        _, success, self.written = _demo(job.task, seed, job.image_size, job.max_steps, target, job.keep_failed)
        return success, self.written is not None

    def commit(self) -> CommitReport:
        """Commit the demo encoded last (`DatasetRecorder.commit_written`)."""
        written, self.written = self.written, None
        assert written is not None, "the driver asks for a commit only after a demo that left an episode"
        return self.recorder.commit_written(written)

    def discard(self) -> None:
        """Drop the demo encoded last, if any (enough episodes were committed meanwhile)."""
        _discard(self.written)
        self.written = None

    def close(self) -> None:
        self.discard()


@dataclass
class _Demo:
    seed: int
    attempt: int = 1


def record_on_ray(
    address: str,
    job: RecordJob,
    workers: int,
    episodes: int,
    seeds: Iterator[int],
    max_attempts: int,
    report: RecordReport,
    on_event: Callable[[str, int, CommitReport | None], None] | None,
    should_stop: Callable[[], bool],
) -> int:
    """`record_sim`'s loop on `workers` actors of the cluster at `address`: demos of `seeds` (at most
    `max_attempts` of them) until `episodes` are committed, each counted in `report` as `record_sim` counts it;
    `on_event` and `should_stop` as `record_sim`'s. A demo whose actor died counts once, when it ends.
    Returns the first seed not taken from `seeds` (0 when none was).

    Raises:
        RayUnavailable: no Ray or no cluster at `address`. What a demo or commit raised in its actor, as itself.
    """
    with ray_session(address) as ray:
        actor_class = ray.remote(RecordWorker).options(num_cpus=1, scheduling_strategy="SPREAD", max_restarts=0)
        idle = [actor_class.remote(job) for _ in range(workers)]
        demos: dict[Any, tuple[Any, _Demo]] = {}
        encoded: deque[tuple[Any, _Demo]] = deque()  # waiting for their turn to commit
        commit: tuple[Any, Any, _Demo] | None = None
        again: deque[_Demo] = deque()  # demos whose actor died
        tried, next_seed, stopping = 0, 0, False

        def in_flight() -> int:
            return len(report.committed) + len(demos) + len(encoded) + (commit is not None)

        def replace(actor: Any) -> None:
            ray.kill(actor)
            idle.append(actor_class.remote(job))

        try:
            while True:
                while idle and not stopping and in_flight() < episodes:
                    if again:
                        demo = again.popleft()
                    elif tried < max_attempts and (seed := next(seeds, None)) is not None:
                        demo, tried, next_seed = _Demo(seed), tried + 1, max(next_seed, seed + 1)
                    else:
                        break
                    actor = idle.pop()
                    demos[actor.demo.remote(demo.seed)] = (actor, demo)
                if commit is None and encoded:
                    actor, demo = encoded.popleft()
                    commit = (actor.commit.remote(), actor, demo)
                if not demos and commit is None:
                    return next_seed
                [ref], _ = ray.wait([*demos, *([commit[0]] if commit else [])], num_returns=1)
                if commit is not None and ref == commit[0]:
                    _, actor, demo = commit
                    commit = None
                    try:
                        done = ray.get(ref)
                    except Exception as error:
                        if not worker_died(ray, error):
                            raise call_error(ray, error) from None
                        replace(actor)
                        _retry(demo, again, report, on_event)
                        continue
                    idle.append(actor)
                    report.committed.append(done)
                    _notify(on_event, "committed", demo.seed, done)
                else:
                    actor, demo = demos.pop(ref)
                    try:
                        success, waiting = ray.get(ref)
                    except Exception as error:
                        if not worker_died(ray, error):
                            raise call_error(ray, error) from None
                        replace(actor)
                        _retry(demo, again, report, on_event)
                        continue
                    if len(report.committed) < episodes:
                        report.attempted += 1
                    if not success and len(report.committed) < episodes:
                        report.failed_seeds.append(demo.seed)
                        _notify(on_event, "failed", demo.seed, None)
                    if waiting and len(report.committed) + len(encoded) + (commit is not None) < episodes:
                        encoded.append((actor, demo))
                    else:
                        if waiting:
                            actor.discard.remote()  # enough episodes are committed or queued already
                        idle.append(actor)
                stopping = stopping or should_stop()
        finally:
            busy = [a for a, _ in demos.values()] + [a for a, _ in encoded] + ([commit[1]] if commit else [])
            _close(ray, idle, busy)


def _retry(
    demo: _Demo,
    again: deque[_Demo],
    report: RecordReport,
    on_event: Callable[[str, int, CommitReport | None], None] | None,
) -> None:
    """A demo whose actor died runs again, until its `ATTEMPTS`th run; then it is reported failed."""
    if demo.attempt < ATTEMPTS:
        again.append(_Demo(demo.seed, demo.attempt + 1))
    else:
        report.attempted += 1
        report.failed_seeds.append(demo.seed)
        _notify(on_event, "failed", demo.seed, None)


__all__ = ["RecordJob", "RecordWorker", "record_on_ray"]
